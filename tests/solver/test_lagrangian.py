"""The one Lagrangian search (bounds/lagrangian.py) with a minimiser plugged in: enumeration here,
checked against the enumerated optimum with memory rows (an independent exact method)."""

from __future__ import annotations

import itertools

import numpy as np

from autoshard.solver.bounds.lagrangian import Lagrangian, Minimum
from autoshard.solver.core.certify import proved_bound
from autoshard.solver.core.reduced import INF, FrozenCore
from tests.solver.helpers import core_of, memory_cores, optimum


class Enumeration:
    """The penalised core minimised by trying every plan: exact, so its bound is ``proved_bound``."""

    def __init__(self, comp: FrozenCore) -> None:
        self.comp = comp
        self.plans = [np.array(x) for x in itertools.product(*[range(len(c)) for c in comp.costs])]

    def minimise(self, lam: np.ndarray, penalty: np.ndarray | None, deadline: float) -> Minimum | None:
        pen = np.zeros(self.comp.arrays.c_off[-1]) if penalty is None else np.floor(penalty)
        offsets = self.comp.arrays.c_off[:-1]
        value, x = min((self.comp.cost(x) + float(pen[offsets + x].sum()), i) for i, x in enumerate(self.plans))
        value -= float(lam @ self.comp.capacity)
        return Minimum(self.plans[x], value, proved_bound(value))

    def plan(self, x: np.ndarray, deadline: float) -> tuple[np.ndarray, int] | None:
        return (x, self.comp.cost(x)) if self.comp.is_feasible(x) else None


def test_every_bound_is_at_most_the_optimum_and_the_steps_raise_it() -> None:
    checked = raised = 0
    for seed in range(200):
        comp = core_of(seed, nodes=6)
        if comp is None or comp.n == 0 or not comp.has_memory or len(comp.costs) > 6:
            continue
        best = optimum(comp)
        if best is None or best >= INF:
            continue
        for halving in (True, False):
            lagrangian = Lagrangian(comp, Enumeration(comp), halving=halving)
            bounds = [lagrangian.step(best, 0.0).bound for _ in range(12)]
            assert all(b is not None and b <= best for b in bounds), (seed, bounds, best)
            assert halving or lagrangian.alpha == 1.0  # exact minimisers take full steps
            raised += max(bounds) > bounds[0]
        checked += 1
        if checked >= 12:
            break
    assert checked >= 12 and raised >= 3


def test_back_to_best_returns_to_the_multipliers_of_the_best_dual_value_at_each_halving() -> None:
    """A target ten times the optimum makes the steps overshoot; at each halving lam goes back to
    where the best L so far was measured (recomputed here by enumeration), and every bound holds."""
    halvings = 0
    for _, comp, best in memory_cores(range(200), 6):
        reference = Enumeration(comp)
        lagrangian = Lagrangian(comp, Enumeration(comp), back_to_best=True)
        top, top_lam = -np.inf, lagrangian.lam
        for _ in range(40):
            lam, alpha = lagrangian.lam.copy(), lagrangian.alpha
            value = reference.minimise(lam, lagrangian.penalties(), 0.0).value
            if value > top + 1e-9 * abs(value):
                top, top_lam = value, lam
            result = lagrangian.step(10 * best + 100, 0.0)
            assert result.bound is not None and result.bound <= best
            if lagrangian.alpha < alpha:
                halvings += 1
                assert np.array_equal(lagrangian.lam, top_lam) and not lagrangian.direction.any()
        if halvings >= 5:
            break
    assert halvings >= 5
