"""The hull's smoothing (column_generation.py): after pricing steps that changed nothing, the next
multipliers move towards the centre (the best bound's) instead of being priced again."""

from __future__ import annotations

import numpy as np

import autoshard.solver.bounds.column_generation as column_generation
from autoshard.solver.bounds.column_generation import SMOOTHING, ColumnGeneration, centre_weight
from autoshard.solver.core.reduced import Core
from autoshard.solver.core.rows import attach_memory
from tests.solver.test_branching import layers_that_must_partly_recompute
from tests.solver.test_column_generation import _FakeClock


def test_each_step_that_changed_nothing_halves_the_next_ones_distance_from_the_centre() -> None:
    weights = [centre_weight(m) for m in range(6)]
    assert weights[0] == SMOOTHING
    for before, after in zip(weights, weights[1:]):
        assert abs((1 - after) - (1 - SMOOTHING) * (1 - before)) < 1e-12


def test_steps_that_move_neither_the_master_nor_the_bound_price_ever_nearer_the_centre(monkeypatch) -> None:
    """Two real pricing steps, then steps whose column is not kept and whose bound is low: the
    master's duals and the centre stay put, and each step prices half as far from the centre as
    the one before (the same multipliers again, before the weight)."""
    monkeypatch.setattr(column_generation, "time", _FakeClock())
    problem = layers_that_must_partly_recompute()
    core = Core(problem)
    attach_memory(core, problem)
    comp = core.freeze()
    generation = ColumnGeneration(comp, np.random.default_rng(0), lambda x: None)
    generation.add(np.array([1] * 8))
    price, add = generation._price, generation.add
    priced: list[np.ndarray] = []

    def fake(branches, lam, mu, deadline):
        priced.append(lam.copy())
        if len(priced) <= 2:
            return price(branches, lam, mu, deadline)
        return -10**12, np.array([1] * 8)  # a bound below the best, a column that is not kept

    monkeypatch.setattr(generation, "_price", fake)
    monkeypatch.setattr(generation, "add", lambda x: add(x) if len(priced) <= 2 else None)
    generation.search([], 1e9)
    distances = [float(np.abs(lam - generation.centre).sum()) for lam in priced[3:]]
    assert len(distances) >= 5 and distances[0] > 0
    for before, after in zip(distances, distances[1:]):
        assert abs(after - before / 2) <= 1e-9 * before
