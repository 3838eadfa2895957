"""The Lagrangian relaxation of memory with every penalised core minimised exactly by toulbar2.

    L(lam) = min_x  cost(x) + sum_r lam_r (usage_r(x) - capacity_r),   lam >= 0

Where toulbar2's branch and bound proves the core without its memory rows within a second (the
cores of models built of repeated layers), each step hands it the core with the penalties
``floor(sum_r lam_r usage_r)`` added (``toulbar.prove_penalised``, in a forked child with a
wall-clock limit). A proved minimum m gives the bound ``floor(m - lam . capacity)`` (the floored
penalties only lower it). The minimiser, when it fits, is polished by local search and offered.
lam moves along the minimiser's overflow g by deflected Polyak steps towards the best cost U, as
in lagrangian.py:

    d = g - 1.5 (g . d' / |d'|^2) d'  if g . d' < 0, else g;   lam <- max(0, lam + (U - L) d / |d|^2)

Why exact: the identical layers answer a penalty alike, so the minimisers jump between keeping
every layer's activations and recomputing every layer; only exact minimisers land on the plans
at the balance of the two, which are the fitting plans TRW-S's rounded and toulbar2's
neighbourhood-search minimisers miss (measured: see benchmarks/README.md, "Measurements behind
the design").
"""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np

from autoshard.solver.core.certify import proved_bound
from autoshard.solver.core.reduced import INF, FrozenCore
from autoshard.solver.bounds.lagrangian import StepResult, deflected, polyak_step, row_penalties
from autoshard.solver.core.local_search import Search
from autoshard.solver.engines.toulbar import prove_penalised

STALL = 20
"""Steps in a row without a better plan after which the search stops (its bounds, weak on the
cores it is for, do not keep it going)."""
SHARE = 0.5
"""Most of the time left the search takes."""
PROVE_SECONDS = 1
"""toulbar2's CPU-time limit per penalised core; a step whose minimum is not proved gives no bound."""
POLISH_SECONDS = 1.0
"""Longest local search on a step's plan that fits."""

Runner = Callable[[Callable[[], tuple[np.ndarray, bool] | None], float], tuple[np.ndarray, bool] | None]
"""Runs toulbar2's call with a wall-clock limit (seconds), in a child that is killed at it."""


class ExactLagrangian:
    """Subgradient steps on the multipliers of ``comp``'s memory rows, each minimised exactly."""

    def __init__(self, comp: FrozenCore, rng: np.random.Generator, seed: int) -> None:
        self.comp, self.rng, self.seed = comp, rng, seed
        self.lam = np.zeros(len(comp.capacity) if comp.capacity is not None else 0)
        self.direction = np.zeros_like(self.lam)
        self.steps = 0

    def penalties(self) -> np.ndarray:
        """Each strategy's usage times the summed multipliers of its rows, rounded down (flat)."""
        return np.floor(row_penalties(self.comp, self.lam))

    def step(self, upper: int | None, run: Runner, deadline: float) -> StepResult | None:
        """One step: the penalised minimum (None when toulbar2 gave none in time), its bound when
        proved, its plan polished where it fits (None where it does not), and the multipliers moved."""
        comp = self.comp
        self.steps += 1
        penalty = self.penalties()
        answer = run(lambda: prove_penalised(comp, penalty, PROVE_SECONDS, self.seed + self.steps),
                     2 * PROVE_SECONDS + 1)
        if answer is None or comp.cost(answer[0]) >= INF:  # none found, or every plan is forbidden
            return None
        x, proved = answer
        value = comp.cost(x) + float(penalty[comp.arrays.c_off[:-1] + x].sum()) - float(self.lam @ comp.capacity)
        if not math.isfinite(value):  # the multipliers ran away (no balance within doubles)
            return None
        overflow = (comp.profile(x) - comp.capacity).astype(np.float64)
        self._move(overflow, value, upper)
        search = Search(comp, x, self.rng)
        plan = None
        if search.feasible:  # no repair: the minimisers that matter fit as they are, and repairs take seconds
            search.descend(min(deadline, time.monotonic() + POLISH_SECONDS))
            plan = search.x
        bound = proved_bound(value) if proved else None
        return StepResult(plan, search.total if plan is not None else None, bound)

    def _move(self, g: np.ndarray, value: float, upper: int | None) -> None:
        """The deflected Polyak step along the overflow ``g`` (lagrangian.polyak_step); a zero
        direction leaves the multipliers and the last direction as they were."""
        d = deflected(g, self.direction)
        if float(d @ d) > 0:
            self.lam, self.direction = polyak_step(self.lam, d, value, upper), d


def search(comp: FrozenCore, rng: np.random.Generator, seed: int, best: Callable[[], int | None],
           offer: Callable[[np.ndarray], bool], bound: Callable[[int], None], run: Runner, until: float) -> int:
    """Exact Lagrangian steps on ``comp`` until ``until``, or until STALL steps in a row do not
    ``offer`` a better plan (it says whether it was); each proved bound goes to ``bound``; how
    many steps ran. The first step is the core without penalties: if toulbar2 does not prove that
    one, no step is worth its time."""
    lagrangian = ExactLagrangian(comp, rng, seed)
    stale = 0
    while time.monotonic() < until and stale < STALL:
        result = lagrangian.step(best(), run, until)
        if result is None or (lagrangian.steps == 1 and result.bound is None):
            break
        if result.bound is not None:
            bound(result.bound)
        stale = 0 if result.plan is not None and offer(result.plan) else stale + 1
    return lagrangian.steps
