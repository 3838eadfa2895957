"""Variable elimination: exact on random problems, and on a model-like forward/backward ladder."""

from __future__ import annotations

import time

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver import SolveOptions, solve
from autoshard.solver.core.reduced import Core
from autoshard.solver.engines.elimination import EliminationPlan
from autoshard.solver.bounds.relaxed_minimiser import relaxed_lagrangian
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.engines.milp import solve_problem_milp

from tests.solver.helpers import brute_force, random_problem


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_elimination_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, int(rng.integers(1, 8)), memory=False)
    core = Core(problem)
    comp = core.freeze()
    plan = EliminationPlan(comp)
    assert plan.feasible and sorted(plan.order) == list(range(comp.n))
    x, value = plan.solve()
    reference = brute_force(problem)
    if reference is None:
        assert value >= 10**18
    else:
        assert value == reference[0] == problem.cost(core.expand(dict(zip(comp.nodes, x))))


def ladder(layers: int, k: int, seed: int, memory: bool) -> ShardingProblem:
    """Forward chain, backward chain and a rung per op: the shape of a training graph."""
    rng = np.random.default_rng(seed)
    costs, usages, intervals, edges, mats = [], [], [], [], []

    def node(t0: int, t1: int) -> int:
        costs.append(rng.integers(0, 100, k).astype(np.int64))
        usages.append(rng.integers(1, 50, k).astype(np.int64))
        intervals.append((t0, t1))
        return len(costs) - 1

    def edge(a: int, b: int) -> None:
        m = rng.integers(1, 200, (k, k)).astype(np.int64)
        np.fill_diagonal(m, 0)
        edges.append((a, b))
        mats.append(m)

    end = 2 * layers * 3
    forward = [[node(3 * i + j, end - 3 * i - j) for j in range(3)] for i in range(layers)]
    backward = [[node(end - 3 * i - j, end - 3 * i - j + 2) for j in range(3)] for i in range(layers)]
    for i in range(layers):
        for a, b in zip(forward[i], forward[i][1:]):
            edge(a, b)
        for a, b in zip(backward[i], backward[i][1:]):
            edge(a, b)
        for a, b in zip(forward[i], backward[i]):
            edge(a, b)
        if i:
            edge(forward[i - 1][-1], forward[i][0])
            edge(backward[i - 1][0], backward[i][-1])
    problem = ShardingProblem(costs, usages, intervals, edges, mats, name="ladder")
    if memory:
        low = problem.peak_usage([int(np.argmin(u)) for u in usages])
        high = problem.peak_usage([int(np.argmax(u)) for u in usages])
        problem.usage_limit = (2 * low + high) // 3
    return problem


def test_ladder_without_memory_is_solved_by_elimination():
    problem = ladder(12, 6, 0, memory=False)
    solution = solve(problem)
    reference = solve_problem_milp(problem)
    assert solution.status == "optimal" and solution.proof == "elimination"
    assert reference.optimal and solution.cost == reference.cost


def test_exact_lagrangian_bounds_on_a_ladder_with_memory():
    problem = ladder(6, 4, 1, memory=True)
    core = Core(problem)
    attach_memory(core, problem)
    comp = core.freeze()
    reference = solve_problem_milp(problem)
    search = relaxed_lagrangian(comp, np.random.default_rng(0), plan=EliminationPlan(comp))
    assert search.minimiser.exact
    for _ in range(30):
        step = search.step(reference.cost, time.monotonic() + 5)
        assert step.bound <= reference.cost
        if step.plan is not None:
            assert step.cost >= reference.cost and comp.is_feasible(step.plan)
    solution = solve(problem, SolveOptions())
    assert solution.status == "optimal" and solution.cost == reference.cost
