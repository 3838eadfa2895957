"""Exact reductions: reduce + solve the core + expand == brute force, with and without memory."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver.core.reduced import Core
from autoshard.solver.core.rows import attach_memory, compress_rows, smallest_peak
from autoshard.solver.core.reduce import NoAssignment, reduce_core

from tests.solver.helpers import brute_force, random_problem


def core_optimum(problem: ShardingProblem) -> tuple[int | None, Core]:
    """Reduce, brute-force the core, and check every core plan expands to an equal-cost plan."""
    core = Core(problem)
    attach_memory(core, problem)
    try:
        reduce_core(core)
    except NoAssignment:
        return None, core
    comp = core.freeze()
    best = None
    for x in itertools.product(*[range(len(c)) for c in comp.costs]):
        if not comp.is_feasible(list(x)):
            continue
        cost = comp.cost(list(x))
        ev = problem.evaluate(core.expand(dict(zip(comp.nodes, x))))
        assert ev.cost == cost and ev.feasible
        best = cost if best is None else min(best, cost)
    return best, core


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), memory=st.booleans())
def test_reduce_solve_expand_equals_brute_force(seed, memory):
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, int(rng.integers(1, 7)), memory=memory)
    reference = brute_force(problem)
    best, _ = core_optimum(problem)
    assert best == (None if reference is None else reference[0])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_sparse_chains_and_trees_reduce_exactly(seed):
    """Sparser, larger problems exercise degree-1/2 elimination and merging chains."""
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, int(rng.integers(6, 10)), max_k=3, edge_prob=0.25, memory=bool(seed % 2))
    reference = brute_force(problem)
    best, _ = core_optimum(problem)
    assert best == (None if reference is None else reference[0])


def chain(n: int, k: int, rng: np.random.Generator) -> ShardingProblem:
    costs = [rng.integers(0, 9, size=k).astype(np.int64) for _ in range(n)]
    usages = [np.zeros(k, dtype=np.int64) for _ in range(n)]
    edges = [(i, i + 1) for i in range(n - 1)]
    mats = [rng.integers(0, 9, size=(k, k)).astype(np.int64) for _ in edges]
    return ShardingProblem(costs, usages, [(0, 1)] * n, edges, mats)


def test_memory_free_chain_reduces_to_nothing():
    problem = chain(12, 3, np.random.default_rng(1))
    core = Core(problem)
    attach_memory(core, problem)
    counts = reduce_core(core)
    assert not core.alive and counts["degree1"] + counts["degree0"] >= 1
    assert problem.cost(core.expand({})) == core.const


def test_nodes_with_memory_are_not_eliminated():
    problem = chain(6, 3, np.random.default_rng(2))
    problem.node_costs = [np.array([0, 10, 4], dtype=np.int64) for _ in range(6)]
    problem.edge_costs = [np.zeros((3, 3), dtype=np.int64) for _ in problem.edges]
    problem.node_usages = [np.array([5, 1, 3], dtype=np.int64) for _ in range(6)]
    problem.intervals = [(0, 2)] * 6
    problem.usage_limit = 20
    core = Core(problem)
    attach_memory(core, problem)
    reduce_core(core)
    assert len(core.alive) == 6 and all(core.segments[v] for v in core.alive)


def test_rows_that_cannot_overflow_are_dropped():
    rng = np.random.default_rng(3)
    problem = chain(4, 2, rng)
    problem.node_usages = [np.array([1, 2], dtype=np.int64) for _ in range(4)]
    problem.intervals = [(0, 5), (1, 3), (6, 8), (7, 9)]
    problem.usage_limit = 3  # rows 6..8 can reach at most 4, rows 0..5 at most 4: both bind
    core = Core(problem)
    attach_memory(core, problem)
    assert len(core.capacity) == 4
    compress_rows(core)
    assert len(core.capacity) == 2
    problem.usage_limit = 4
    core = Core(problem)
    attach_memory(core, problem)
    compress_rows(core)
    assert len(core.capacity) == 0 and not any(core.segments)


def test_smallest_peak_exact_and_bound():
    rng = np.random.default_rng(4)
    problem = chain(3, 2, rng)
    problem.node_usages = [np.array([4, 2], dtype=np.int64), np.array([3, 5], dtype=np.int64), np.array([1, 1], dtype=np.int64)]
    problem.intervals = [(0, 4), (2, 6), (5, 7)]
    peak = smallest_peak(problem)
    assert peak.exact and peak.value == 5


@pytest.mark.parametrize("memory", [False, True])
def test_infeasible_problems_are_detected(memory):
    rng = np.random.default_rng(5)
    problem = chain(3, 2, rng)
    problem.edge_costs[0][:] = 10**18
    if memory:
        problem.edge_costs[0][0, 0] = 1
    with pytest.raises(NoAssignment) if not memory else _nothing():
        core = Core(problem)
        attach_memory(core, problem)
        reduce_core(core)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def repeated_problem(rng: np.random.Generator, block: int, copies: int) -> ShardingProblem:
    """``copies`` identical random blocks of ``block`` nodes chained by one identical edge: a
    model's repeated layers in small."""
    one = random_problem(rng, block, max_k=3, edge_prob=0.5, memory=False)
    link = rng.integers(0, 40, size=(len(one.node_costs[-1]), len(one.node_costs[0]))).astype(np.int64)
    costs, usages, intervals, edges, mats = [], [], [], [], []
    for c in range(copies):
        base = c * block
        costs += [x.copy() for x in one.node_costs]
        usages += [x.copy() for x in one.node_usages]
        intervals += list(one.intervals)
        edges += [(u + base, v + base) for u, v in one.edges]
        mats += [m.copy() for m in one.edge_costs]
        if c:
            edges.append((base - 1, base))
            mats.append(link.copy())
    return ShardingProblem(costs, usages, intervals, edges, mats, name="repeated")


def test_repeated_blocks_reuse_reductions_and_stay_exact(monkeypatch):
    """The memo (reduce.Memo) answers the copies' dominance tests from an earlier copy's (over
    these seeds: fewer computed than asked); reduce + brute-force core + expand still equals
    brute force on the whole."""
    import autoshard.solver.core.reduce as reduce

    computed, asked = [], []
    undominated, prune = reduce._undominated, reduce.prune_dominated
    monkeypatch.setattr(reduce, "_undominated", lambda core, v: computed.append(v) or undominated(core, v))
    monkeypatch.setattr(reduce, "prune_dominated", lambda core, v, memo=None: asked.append(v) or prune(core, v, memo))
    for seed in range(6):
        problem = repeated_problem(np.random.default_rng(seed), 4, 3)
        reference = brute_force(problem)
        best, _ = core_optimum(problem)
        assert best == (None if reference is None else reference[0])
    assert 0 < len(computed) < len(asked)
