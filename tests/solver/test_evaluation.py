"""The compiled evaluation of offers (evaluation.py) against the Python reference it replaces:
``Core.expand`` for the expansion, ``ShardingProblem.evaluate`` for cost, forbidden terms and
peak memory, on random problems reduced by the exact reductions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from autoshard.errors import AutoshardError
from autoshard.solver.model.problem import FORBIDDEN, ShardingProblem
from autoshard.solver.core.reduced import Core
from autoshard.solver.api import solve
from autoshard.solver.core.evaluation import Expansion, FlatProblem
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.core.reduce import NoAssignment, reduce_core
from autoshard.solver.model.solution import SolveOptions

from tests.solver.helpers import large_problem, random_problem


def reduced(problem: ShardingProblem) -> Core:
    core = Core(problem)
    attach_memory(core, problem)
    reduce_core(core, None)
    return core


def random_choice(rng: np.random.Generator, problem: ShardingProblem) -> np.ndarray:
    return np.array([rng.integers(problem.num_strategies(i)) for i in range(problem.num_nodes)], dtype=np.int64)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), nodes=st.integers(1, 12), forbid=st.sampled_from([0.0, 0.15]))
def test_evaluate_matches_the_python_evaluation(seed: int, nodes: int, forbid: float) -> None:
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, nodes, forbid_prob=forbid, memory=bool(seed % 2))
    flat = FlatProblem.of(problem)
    assert flat.compiled
    for _ in range(5):
        choice = random_choice(rng, problem)
        assert flat.evaluate(choice) == problem.evaluate(choice.tolist())


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), nodes=st.integers(1, 12), forbid=st.sampled_from([0.0, 0.15, 0.4]))
def test_feasible_cost_is_the_cost_of_feasible_plans_and_none_otherwise(seed: int, nodes: int, forbid: float) -> None:
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, nodes, forbid_prob=forbid, memory=bool(seed % 2))
    flat = FlatProblem.of(problem)
    for _ in range(5):
        choice = random_choice(rng, problem)
        ev = problem.evaluate(choice.tolist())
        assert flat.feasible_cost(choice) == (ev.cost if ev.feasible else None)


def test_evaluate_on_large_problems_with_binding_memory() -> None:
    """Many nodes, overlapping intervals and a limit that some plans break and others keep."""
    rng = np.random.default_rng(3)
    problem = large_problem(rng, 400)
    flat = FlatProblem.of(problem)
    verdicts = set()
    for _ in range(20):
        choice = random_choice(rng, problem)
        ev = flat.evaluate(choice)
        assert ev == problem.evaluate(choice.tolist())
        verdicts.add(ev.within_limit)
    low = np.array([int(np.argmin(u)) for u in problem.node_usages])
    assert flat.evaluate(low) == problem.evaluate(low.tolist())
    verdicts.add(flat.evaluate(low).within_limit)
    assert verdicts == {True, False}


def test_values_int64_cannot_hold_are_left_to_python() -> None:
    """Usages whose sum passes int64, and object arrays of Python ints, are evaluated in Python."""
    big = 2**61
    problem = ShardingProblem([np.array([1, 2]), np.array([3])], [np.array([big, 0]), np.array([big])],
                              [(0, 5), (2, 7)], [(0, 1)], [np.array([[4], [5]])], usage_limit=2**62)
    flat = FlatProblem.of(problem)
    assert not flat.compiled
    assert flat.evaluate(np.array([0, 0])) == problem.evaluate([0, 0])
    assert flat.evaluate(np.array([0, 0])).peak == 2 * big
    assert flat.feasible_cost(np.array([0, 0])) == problem.evaluate([0, 0]).cost
    huge = ShardingProblem([np.array([10**30], dtype=object)], [np.array([1])], [(0, 1)], [], [])
    assert not FlatProblem.of(huge).compiled
    assert FlatProblem.of(huge).evaluate(np.array([0])).cost == 10**30


def test_forbidden_choices_and_bad_entries() -> None:
    problem = ShardingProblem([np.array([FORBIDDEN, 1]), np.array([2, 3])], [np.zeros(2, np.int64)] * 2,
                              [(0, 1), (0, 1)], [(0, 1)], [np.array([[0, 5], [7, FORBIDDEN]])])
    flat = FlatProblem.of(problem)
    for choice in ([0, 0], [1, 1], [1, 0]):
        assert flat.evaluate(np.array(choice)) == problem.evaluate(choice)
    assert flat.evaluate(np.array([0, 0])).uses_forbidden
    assert flat.evaluate(np.array([1, 1])).uses_forbidden
    assert flat.evaluate(np.array([1, 0])).cost == 1 + 2 + 7
    assert [flat.feasible_cost(np.array(c)) for c in ([0, 0], [1, 1], [1, 0])] == [None, None, 1 + 2 + 7]
    with pytest.raises(AutoshardError, match="strategy 2 for node 1"):
        flat.evaluate(np.array([0, 2]))
    with pytest.raises(AutoshardError, match="strategy 2 for node 1"):
        flat.feasible_cost(np.array([0, 2]))
    with pytest.raises(AutoshardError, match="2 nodes"):
        flat.evaluate(np.array([0]))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), nodes=st.integers(1, 14))
def test_expansion_matches_core_expand(seed: int, nodes: int) -> None:
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, nodes, forbid_prob=0.05)
    try:
        core = reduced(problem)
    except NoAssignment:  # no plan at all: nothing to expand
        assume(False)
    comp = core.freeze()
    expansion = Expansion.of(core, comp.nodes)
    for _ in range(4):
        local = np.array([rng.integers(len(c)) for c in comp.costs], dtype=np.int64)
        expected = core.expand({v: int(s) for v, s in zip(comp.nodes, local)})
        assert expansion.expand(local).tolist() == expected


def test_expansion_replays_many_records() -> None:
    """A model-like problem the reductions shrink a lot: every removed node comes back."""
    rng = np.random.default_rng(5)
    problem = large_problem(rng, 600, max_k=4)
    core = reduced(problem)
    comp = core.freeze()
    scopes = {len(rec.scope) for rec in core.records}
    assert len(core.records) > 30 and 0 in scopes and max(scopes) >= 2
    expansion = Expansion.of(core, comp.nodes)
    for _ in range(5):
        local = np.array([rng.integers(len(c)) for c in comp.costs], dtype=np.int64)
        expected = core.expand({v: int(s) for v, s in zip(comp.nodes, local)})
        got = expansion.expand(local)
        assert got.tolist() == expected and (got >= 0).all()


def test_offers_report_plain_ints() -> None:
    """The plans an offer reports (events and the answer) hold Python ints, as their types say,
    however the compiled expansion computed them."""
    problem = large_problem(np.random.default_rng(7), 120, max_k=4)
    events = []
    solution = solve(problem, SolveOptions(timeout=5.0, prove=False), events.append)
    plans = [e.choice for e in events if type(e).__name__ == "Improved"]
    assert plans and plans[-1] == tuple(solution.choice)
    assert all(type(s) is int for plan in plans for s in plan)
    assert all(type(s) is int for s in solution.choice)
