"""The Lagrangian's multipliers by cutting planes (bounds/cutting_plane.py), against the dual's
maximum computed independently: the LP  max t  s.t.  t <= cost(x) + lam . g(x)  for every plan x
(enumerated), lam >= 0, whose value is max_lam L(lam) exactly."""

from __future__ import annotations

import itertools
import time

import numpy as np
from scipy.optimize import linprog

from autoshard.solver.bounds.cutting_plane import CuttingPlane
from autoshard.solver.bounds.exact_lagrangian import dual_search
from autoshard.solver.bounds.lagrangian import Lagrangian
from autoshard.solver.core.reduced import INF, FrozenCore
from autoshard.solver.engines.toulbar import prove_below
from tests.solver.helpers import core_of, memory_cores
from tests.solver.test_lagrangian import Enumeration


def dual_maximum(comp: FrozenCore) -> float:
    """max over lam >= 0 of min over every plan x of cost(x) + lam . (usage(x) - capacity)."""
    rows = len(comp.capacity)
    plans = [np.array(x) for x in itertools.product(*[range(len(c)) for c in comp.costs])]
    plans = [x for x in plans if comp.cost(x) < INF]
    a = np.array([np.concatenate([[1.0], -(comp.profile(x) - comp.capacity)]) for x in plans])
    b = np.array([float(comp.cost(x)) for x in plans])
    answer = linprog(np.concatenate([[-1.0], np.zeros(rows)]), A_ub=a, b_ub=b,
                     bounds=[(None, None)] + [(0, None)] * rows, method="highs")
    assert answer.status in (0, 3), answer.message  # 3: unbounded, when no plan fits
    return np.inf if answer.status == 3 else -answer.fun


def test_the_steps_reach_the_dual_maximum_and_say_so() -> None:
    """With an exact minimiser (enumeration, penalties floored: within n of L) the search converges
    within 40 minima, its best bound within n + 1 of the dual's maximum and never above the
    optimum; where the maximum is below the optimum by more than the floors, it is reached."""
    checked = 0
    for seed, comp, best in memory_cores(range(300), 6):
        top = dual_maximum(comp)
        lagrangian = Lagrangian(comp, Enumeration(comp), cutting=True)
        bounds = []
        while not lagrangian.converged and lagrangian.steps < 40:
            bounds.append(lagrangian.step(best, 0.0).bound)
        assert lagrangian.converged, seed
        assert all(b is not None and b <= best for b in bounds), (seed, bounds, best)
        assert max(bounds) >= min(top, best) - comp.n - 1, (seed, max(bounds), top, best)
        checked += 1
        if checked >= 15:
            break
    assert checked >= 15


def test_a_cut_above_the_centre_moves_the_multipliers_towards_the_overflowing_row() -> None:
    """One row, one plan that overflows it by 10 at cost 100 and one that fits at cost 150: the
    model's maximum is where the two cuts cross (lam = 50 / 20 = 2.5, value 125), once the box
    holds it."""
    model = CuttingPlane(1)
    model.add(np.zeros(1), 100.0, np.array([10.0]), 100.0, 150)
    lam = model.next()
    assert lam[0] > 0
    model.add(lam, 150.0, np.array([-10.0]), 150.0 - 10 * lam[0], 150)
    while not np.isclose(model.next()[0], 2.5):
        lam = model.next()
        model.add(lam, *((100.0, np.array([10.0]), 100 + 10 * lam[0]) if lam[0] <= 2.5
                         else (150.0, np.array([-10.0]), 150 - 10 * lam[0])), 150)
    assert np.isclose(model.model, 125.0)


def test_toulbar2s_dual_search_reaches_the_dual_maximum() -> None:
    """``dual_search`` (toulbar2's proved minima, called in this process) on random cores: every
    bound at most the optimum, converged within 40 minima, within n + 1 of the dual's maximum."""
    checked = 0
    for seed, comp, best in memory_cores(range(300), 7):
        top = dual_maximum(comp)
        lagrangian = dual_search(comp, np.random.default_rng(seed), seed, lambda call, seconds: call())
        bounds = []
        while not lagrangian.converged and lagrangian.steps < 40:
            bounds.append(lagrangian.step(best, time.monotonic() + 30).bound)
        assert lagrangian.converged, seed
        assert all(b is None or b <= best for b in bounds), (seed, bounds, best)
        assert max(b for b in bounds if b is not None) >= min(top, best) - comp.n - 1, (seed, bounds, top, best)
        checked += 1
        if checked >= 10:
            break
    assert checked >= 10


def test_a_minimum_not_proved_gives_its_cut_but_neither_centre_nor_convergence() -> None:
    """A plan at the model's maximum whose value is not proved (a search cut short) neither moves
    the centre nor confirms the model, however high its value."""
    model = CuttingPlane(1)
    model.add(np.zeros(1), 100.0, np.array([10.0]), 100.0, 150)
    lam = model.next()
    model.add(lam, 1000.0, np.array([0.0]), None, 150)
    assert not model.converged and model.best == 100.0 and model.centre[0] == 0.0
    assert len(model.values) == 2


def test_prove_below_finds_the_cheaper_plan_or_proves_there_is_none() -> None:
    """toulbar2 bounded by a plan's penalised cost: below the optimum without rows it proves that
    nothing is cheaper; above it, it returns a plan at the optimum (enumerated), proved."""
    checked = 0
    for seed in range(60):
        comp = core_of(seed, nodes=7)
        if comp is None or comp.n == 0:
            continue
        costs = [comp.cost(list(x)) for x in itertools.product(*[range(len(c)) for c in comp.costs])]
        least = min(costs)
        if least >= INF:
            continue
        zero = np.zeros(comp.arrays.c_off[-1])
        assert prove_below(comp, zero, float(least), 30, seed) == (None, True)
        x, proved = prove_below(comp, zero, float(least + 1), 30, seed)
        assert proved and comp.cost(x) == least
        checked += 1
    assert checked >= 10
