"""The hull's pricing steps (column_generation.py): a forbidden primal still gives the master a
column, and a branch's search starts where the root's best bound stood."""

from __future__ import annotations

import numpy as np

import autoshard.solver.bounds.column_generation as column_generation
from autoshard.solver.bounds.column_generation import ColumnGeneration, allowed_blend
from autoshard.solver.core.branching import Branch
from autoshard.solver.core.reduced import INF, Core
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.model.problem import ShardingProblem
from tests.solver.test_branching import layers_that_must_partly_recompute
from tests.solver.test_column_generation import _FakeClock, every_plan
from tests.solver.test_milp import cores, fitting_plans


def chain_with_forbidden_pairs() -> ShardingProblem:
    """Four nodes in a chain, two strategies each; a node on 0 before a node on 1 is forbidden."""
    costs = [np.array([1, 2], dtype=np.int64) for _ in range(4)]
    usages = [np.array([3, 1], dtype=np.int64) for _ in range(4)]
    same = np.array([[0, INF], [0, 0]], dtype=np.int64)
    edges = [(i, i + 1) for i in range(3)]
    return ShardingProblem(costs, usages, [(0, 1)] * 4, edges, [same] * 3, usage_limit=10)


def test_the_blend_leaves_no_forbidden_term_and_keeps_the_nodes_outside_them() -> None:
    core = Core(chain_with_forbidden_pairs())
    comp = core.freeze()
    assert comp.n == 4
    blended = allowed_blend(comp, np.array([0, 0, 1, 0]), np.array([1, 1, 1, 1]))
    assert blended.tolist() == [1, 1, 1, 0]  # the pair (1, 2), then the pair (0, 1) its move forbids
    for x in every_plan(comp):  # an allowed plan is left as it is
        assert (allowed_blend(comp, x, np.ones(4, dtype=np.int64)) == x).all()


def test_a_forbidden_primal_is_blended_into_a_column_the_master_takes_when_it_is_cheaper(monkeypatch) -> None:
    problem = chain_with_forbidden_pairs()
    core = Core(problem)
    attach_memory(core, problem)
    comp = core.freeze()
    generation = ColumnGeneration(comp, np.random.default_rng(0), lambda x: None)
    generation.add(np.array([1, 1, 1, 1]))  # cost 8
    monkeypatch.setattr(column_generation, "POLISH_SECONDS", 0.0)
    lam = np.zeros(len(generation.capacity))
    monkeypatch.setattr(generation.mp, "primal", lambda penalty=None: np.array([0, 0, 1, 0]))
    priced = generation._price([], lam, np.zeros(0), 1e18)
    assert priced is not None and priced[1] is not None and priced[1].tolist() == [1, 1, 1, 0]  # cost 7
    monkeypatch.setattr(generation.mp, "primal", lambda penalty=None: np.array([0, 0, 0, 1]))
    priced = generation._price([], lam, np.zeros(0), 1e18)
    assert priced is not None and priced[1] is None  # blended back to the pooled plan: nothing new


def test_a_branch_first_prices_at_the_roots_best_multipliers_and_messages(monkeypatch) -> None:
    """The branch's first step: the root's best multipliers with no weight on the branch row, from
    the messages that gave the root its best bound, so its first bound is the root's there."""
    monkeypatch.setattr(column_generation, "time", _FakeClock())
    problem = layers_that_must_partly_recompute()
    core = Core(problem)
    attach_memory(core, problem)
    comp = core.freeze()
    generation = ColumnGeneration(comp, np.random.default_rng(0), lambda x: None)
    generation.add(np.array([1] * 8))
    root = generation.search([], 1e9)
    assert root.bound is not None and generation.messages is not None and generation.centre.any()
    saved = [m.copy() for m in generation.messages]
    generation.mp.flat.to_u[:] += 1.0  # as another branch's pricing would leave them
    first: list[tuple[np.ndarray, np.ndarray, bool]] = []
    price = generation._price

    def record(branches, lam, mu, deadline):
        if not first:
            first.append((lam.copy(), mu.copy(), bool((generation.mp.flat.to_u == saved[0]).all())))
        return price(branches, lam, mu, deadline)

    monkeypatch.setattr(generation, "_price", record)
    generation.search([Branch(0, -1, 5)], 1e9)
    lam, mu, restored = first[0]
    assert (lam == generation.centre).all() and (mu == 0).all() and restored
