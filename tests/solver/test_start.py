"""``SolveOptions.start``: a plan of the original problem that fits is the first best, so the
answer is it or a cheaper plan, never none; a plan that does not fit is ignored."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.errors import AutoshardError
from autoshard.solver import Improved, Phase, SolveOptions, solve
from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver.run.solve import build, reduce
from autoshard.solver.run.state import RunState
from tests.solver.helpers import brute_force, random_problem


def _fitting(problem: ShardingProblem) -> list[tuple[int, list[int]]]:
    """(cost, choice) of every allowed plan that fits, most expensive first."""
    plans = []
    for choice in itertools.product(*[range(problem.num_strategies(i)) for i in range(problem.num_nodes)]):
        ev = problem.evaluate(list(choice))
        if ev.feasible:
            plans.append((ev.cost, list(choice)))
    return sorted(plans, reverse=True)


def _problem_with_plans(seed: int) -> tuple[ShardingProblem, list[tuple[int, list[int]]]]:
    rng = np.random.default_rng(seed)
    for _ in range(50):
        problem = random_problem(rng, int(rng.integers(2, 6)), memory=True)
        plans = _fitting(problem)
        if len(plans) > 1:
            return problem, plans
    pytest.skip("no random problem with two fitting plans")


def test_the_start_is_the_answer_when_the_search_finds_nothing():
    problem, plans = _problem_with_plans(1)
    worst_cost, worst = plans[0]
    with pytest.raises(AutoshardError, match="no plan found"):
        solve(problem, SolveOptions(reduce=False, warm_start=False, prove=False))
    events: list = []
    solution = solve(problem, SolveOptions(reduce=False, warm_start=False, prove=False, start=tuple(worst)), events.append)
    assert solution.choice == worst and solution.cost == worst_cost and solution.status == "feasible"
    first = next(e for e in events if isinstance(e, Improved))
    assert first.source == "baseline" and first.cost == worst_cost


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), reduce=st.booleans())
def test_the_answer_is_the_optimum_whatever_the_start(seed, reduce):
    problem, plans = _problem_with_plans(seed)
    optimum = brute_force(problem)[0]
    _, start = plans[int(np.random.default_rng(seed).integers(len(plans)))]
    solution = solve(problem, SolveOptions(reduce=reduce, start=tuple(start)))
    assert solution.status == "optimal" and solution.cost == optimum
    assert problem.evaluate(solution.choice).feasible


def test_a_start_that_does_not_fit_is_ignored():
    rng = np.random.default_rng(3)
    for _ in range(200):
        problem = random_problem(rng, 4, memory=True)
        everything = itertools.product(*[range(problem.num_strategies(i)) for i in range(problem.num_nodes)])
        over = next((list(c) for c in everything if not problem.is_feasible(list(c))), None)
        if over is not None and brute_force(problem) is not None:
            break
    else:
        pytest.skip("no random problem with a plan over its limit")
    events: list = []
    solution = solve(problem, SolveOptions(start=tuple(over)), events.append)
    assert problem.is_feasible(solution.choice) and solution.cost == brute_force(problem)[0]
    assert all(e.source != "baseline" for e in events if isinstance(e, Improved))


def test_no_search_past_the_limit_once_a_start_fits():
    problem, plans = _problem_with_plans(5)
    cost, start = plans[0]
    events: list = []
    solution = solve(problem, SolveOptions(timeout=0.0, reduce=False, start=tuple(start)), events.append)
    assert solution.choice == start and solution.cost == cost
    assert not any(isinstance(e, Phase) for e in events)  # the portfolio never started


def test_nothing_is_built_once_the_limit_has_passed_with_a_start():
    problem, plans = _problem_with_plans(6)
    cost, start = plans[0]
    solution = solve(problem, SolveOptions(timeout=0.0, start=tuple(start)))
    assert solution.choice == start and solution.cost == cost and solution.core_nodes == 0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_the_start_carried_onto_the_reduced_core_is_a_plan_no_worse(seed):
    """After the reductions the start becomes the searches' first core plan (``best_local``):
    the start's strategy wherever the core kept it, each other node its cheapest given its
    neighbours. When it is there it fits, and it keeps every strategy of the start the core kept."""
    problem, plans = _problem_with_plans(seed)
    _, start = plans[int(np.random.default_rng(seed).integers(len(plans)))]
    state = RunState(problem, SolveOptions(start=tuple(start)), lambda event: None)
    assert state.start_from(tuple(start), "baseline")
    build(state)
    reduce(state)
    local = state.best_local
    kept = [i for i, v in enumerate(state.comp.nodes) if start[v] in state.core.strategies[v]]
    if len(kept) == state.comp.n:
        assert local is not None  # nothing to choose: the start itself, which fits
    if local is not None:
        assert state.comp.is_feasible(local)
        expanded = state.core.expand({v: int(s) for v, s in zip(state.comp.nodes, local)})
        assert all(expanded[state.comp.nodes[i]] == start[state.comp.nodes[i]] for i in kept)
        assert problem.evaluate(expanded).feasible
        if len(kept) == state.comp.n:  # the reductions decide the removed nodes no worse than the start
            assert problem.cost(expanded) <= problem.cost(start)
