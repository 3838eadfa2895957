"""The memory-weighted TRW-S start: plans that fit, and whole groups moved where node moves cannot."""

from __future__ import annotations

import time

import numpy as np
import pytest

from autoshard.solver.model.problem import FORBIDDEN, ShardingProblem
from autoshard.solver.core.reduced import Core
from autoshard.solver.core.local_search import Search, min_memory_start
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.search.penalised_start import weighted_start

from tests.solver.helpers import brute_force, random_problem


def compact(problem: ShardingProblem):
    core = Core(problem)
    attach_memory(core, problem)
    return core.freeze()


@pytest.mark.parametrize("seed", range(30))
def test_its_plans_fit_and_cost_what_the_problem_says(seed):
    problem = random_problem(np.random.default_rng(seed), 6, memory=True)
    comp = compact(problem)
    found = weighted_start(comp, np.random.default_rng(0), time.monotonic() + 5.0)
    reference = brute_force(problem)
    if found is None:
        return
    assert reference is not None and found.feasible and comp.is_feasible(found.x)
    assert found.total == comp.cost(found.x) >= reference[0]


def flag_chain(length: int) -> ShardingProblem:
    """A layer of ``length`` nodes with one keep (0) / recompute (1) flag held equal by forbidden
    pairs: the first node's two strategies use the same memory (keep is cheaper), every other
    node's recompute saves memory for a little cost; the limit needs every node recomputed."""
    costs = [np.array([0, 1], dtype=np.int64) for _ in range(length)]
    usages = [np.array([5, 5], dtype=np.int64)] + [np.array([10, 2], dtype=np.int64) for _ in range(length - 1)]
    same = np.array([[0, FORBIDDEN], [FORBIDDEN, 0]], dtype=np.int64)
    edges = [(i, i + 1) for i in range(length - 1)]
    return ShardingProblem(costs, usages, [(0, 1)] * length, edges, [same.copy() for _ in edges],
                           usage_limit=5 + 2 * (length - 1), name="flag chain")


def test_a_group_held_by_forbidden_pairs_moves_at_once():
    problem = flag_chain(8)
    comp = compact(problem)
    greedy = Search(comp, min_memory_start(comp), np.random.default_rng(0))
    greedy.repair(time.monotonic() + 5.0)
    assert not greedy.feasible  # node moves cannot flip the whole layer
    found = weighted_start(comp, np.random.default_rng(0), time.monotonic() + 5.0)
    assert found is not None and found.x.tolist() == [1] * 8
    assert found.total == brute_force(problem)[0]
