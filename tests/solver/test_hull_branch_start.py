"""The hull's branch searches (column_generation.py) start where the root's best bound stood."""

from __future__ import annotations

import numpy as np

import autoshard.solver.bounds.column_generation as column_generation
from autoshard.solver.bounds.column_generation import ColumnGeneration
from autoshard.solver.core.branching import Branch
from autoshard.solver.core.reduced import Core
from autoshard.solver.core.rows import attach_memory
from tests.solver.test_branching import layers_that_must_partly_recompute
from tests.solver.test_column_generation import _FakeClock


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
