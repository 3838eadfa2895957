"""What the level branching (bounds/level_branching.py) carries from a branch to its children:
the closing test's proved minimum given to the dual as its first step (no second proof), the
parent's plans as cuts seeded into the child's cutting-plane model (no dual value or centre from
them), and a cheaper plan's cost lowering ``upper``; checked
against enumeration on small random cores, toulbar2 called in this process."""

from __future__ import annotations

import itertools

import numpy as np

from autoshard.solver.bounds.cutting_plane import CuttingPlane
from autoshard.solver.bounds.exact_lagrangian import ToulbarMinimiser
from autoshard.solver.bounds.lagrangian import row_penalties
from autoshard.solver.core.reduced import INF
from tests.solver.test_cutting_plane import dual_maximum
from tests.solver.test_level_branching import branching
from tests.solver.helpers import memory_cores


def test_a_given_answer_is_the_next_minimum_at_its_multipliers_only() -> None:
    """``give`` at lam: the next ``minimise`` at lam returns that plan without calling toulbar2;
    at other multipliers, or a second time, toulbar2 is called."""
    seed, comp, _ = next(iter(memory_cores(range(100), 6)))
    calls = []

    def run(call, seconds):
        calls.append(seconds)
        return call()

    minimiser = ToulbarMinimiser(comp, np.random.default_rng(0), 0, run, 30, known=True)
    lam = np.full(len(comp.capacity), 0.5)
    x = np.zeros(comp.n, dtype=np.int64)
    minimiser.give(lam, (x, False))
    minimum = minimiser.minimise(lam, row_penalties(comp, lam), np.inf)
    assert not calls and minimum is not None and (minimum.x == x).all() and minimum.bound is None
    minimiser.minimise(lam, row_penalties(comp, lam), np.inf)
    minimiser.give(lam, (x, True))
    minimiser.minimise(2 * lam, row_penalties(comp, 2 * lam), np.inf)
    assert len(calls) == 2


def test_seeded_cuts_keep_the_model_above_the_dual_and_leave_the_centre() -> None:
    """Every plan seeded as a cut, then one minimum added at lam 0: no dual value or centre comes
    from the seeds, and the model, now the dual L itself, has its box maximum at most L at its
    answer and at most L's maximum (one cut alone would leave it unbounded above)."""
    checked = 0
    for seed, comp, best in memory_cores(range(200), 6):
        plans = [np.array(x) for x in itertools.product(*[range(len(c)) for c in comp.costs])]
        plans = [x for x in plans if comp.cost(x) < INF]
        overflow = [comp.profile(x) - comp.capacity for x in plans]
        model = CuttingPlane(len(comp.capacity))
        for x, g in zip(plans, overflow):
            model.seed(comp.cost(x), g)
        assert model.best == -np.inf and not model.centre.any()
        free = min(plans, key=comp.cost)
        model.add(np.zeros(len(comp.capacity)), comp.cost(free), comp.profile(free) - comp.capacity,
                  float(comp.cost(free)) - 0.0, best)
        lam = model.next()
        at = min(comp.cost(x) + float(lam @ g) for x, g in zip(plans, overflow))
        assert model.model <= at + 1e-6 * abs(at) + 1e-6, (seed, model.model, at)
        assert model.model <= dual_maximum(comp) + 1e-6 * abs(model.model) + 1e-6
        checked += 1
        if checked >= 8:
            break
    assert checked >= 8


def test_a_lower_upper_closes_the_branches_it_reaches_and_bounds_stay_valid() -> None:
    """From an upper far above the optimum, lowering it to the optimum mid-search leaves a bound
    that never passes the optimum and a search that closes at it."""
    closed = checked = 0
    for seed, comp, best in memory_cores(range(300), 7):
        search = branching(comp, seed, best + 10**6)
        for _ in range(2):
            if not search.done:
                search.step()
        search.lower(best)
        assert search.upper == best and all(b.bound < best for b in search.open)
        while not search.done and search.branches < 300:
            assert search.bound <= best
            search.step()
        assert search.bound <= best
        closed += search.done and search.bound == best
        checked += 1
        if checked >= 8:
            break
    assert checked >= 8 and closed >= 6, (checked, closed)
