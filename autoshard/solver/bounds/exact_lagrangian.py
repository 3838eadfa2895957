"""toulbar2 as the Lagrangian's minimiser (lagrangian.py): every penalised core minimised exactly.

    L(lam) = min_x  cost(x) + sum_r lam_r (usage_r(x) - capacity_r),   lam >= 0

Where toulbar2's branch and bound proves the core without its memory rows within a second (the
cores of models built of repeated layers), each step hands it the core with the penalties
``floor(sum_r lam_r usage_r)`` added (``toulbar.prove_penalised``, in a forked child with a
wall-clock limit). A proved minimum m gives the bound ``floor(m - lam . capacity)`` (the floored
penalties only lower it). The minimiser, when it fits, is polished by local search and offered.
lam moves along the minimiser's overflow g by full deflected Polyak steps towards the best cost U
(``Lagrangian.move``, without halving: the minima are exact):

    d = g - 1.5 (g . d' / |d'|^2) d'  if g . d' < 0, else g;   lam <- max(0, lam + (U - L) d / |d|^2)

Beside toulbar2's search of a core with memory rows (run/pruning.py) the same minimiser, with
longer proofs (DUAL_SECONDS), serves the bound alone: lam then maximises the cutting-plane model
of L (cutting_plane.py), which reaches L's maximum in a handful of minima and says so
(``dual_search``).

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
from autoshard.solver.bounds.lagrangian import Lagrangian, Minimum
from autoshard.solver.core.local_search import Search
from autoshard.solver.engines.toulbar import prove_below, prove_penalised

STALL = 20
"""Steps in a row without a better plan after which the search stops (its bounds, weak on the
cores it is for, do not keep it going)."""
SHARE = 0.5
"""Most of the time left the search takes."""
PROVE_SECONDS = 1
"""toulbar2's CPU-time limit per penalised core; a step whose minimum is not proved gives no bound."""
DUAL_SECONDS = 10
"""toulbar2's CPU-time limit per penalised core in ``dual_search``: near L's maximum the penalties
balance the plans and the proofs take longest (IOPDDL V's core: 2-6 s and a few 20-40 s without
the known minima as its upper bound, 1.5-4 s with them). Its child gets
DUAL_WALL seconds of wall-clock time: beside toulbar2's two engines on two cores it gets about a
third of one, and a child killed returns no plan, so no cut, and the search stands still."""
DUAL_WALL = 4 * DUAL_SECONDS + 1
POLISH_SECONDS = 1.0
"""Longest local search on a step's plan that fits."""

Runner = Callable[[Callable[[], tuple[np.ndarray, bool] | None], float], tuple[np.ndarray, bool] | None]
"""Runs toulbar2's call with a wall-clock limit (seconds), in a child that is killed at it."""


class ToulbarMinimiser:
    """The penalised core minimised by toulbar2's proof, ``run`` in a child killed at its limit.
    With ``known``, the minima it returned are kept and the cheapest of them under the new
    penalties bounds the search from the start (``toulbar.prove_below``): a proof that nothing
    is cheaper makes that plan the minimum, and the proofs near L's maximum, where the minima
    repeat, come sooner."""

    def __init__(self, comp: FrozenCore, rng: np.random.Generator, seed: int, run: Runner,
                 seconds: int = PROVE_SECONDS, wall: float | None = None, known: bool = False) -> None:
        self.comp, self.rng, self.seed, self.run, self.seconds = comp, rng, seed, run, seconds
        self.wall = 2 * seconds + 1 if wall is None else wall  # the child's wall-clock limit
        self.known: list[np.ndarray] | None = [] if known else None
        self.calls = 0
        self.given: tuple[np.ndarray, tuple[np.ndarray, bool]] | None = None

    def give(self, lam: np.ndarray, answer: tuple[np.ndarray, bool]) -> None:
        """toulbar2's answer (plan, proved) at multipliers ``lam`` found elsewhere on this core with
        the same floored penalties: the next ``minimise`` at exactly ``lam`` takes it instead of
        another proof."""
        self.given = (lam.copy(), answer)

    def minimise(self, lam: np.ndarray, penalty: np.ndarray | None, deadline: float) -> Minimum | None:
        """toulbar2's minimum under the floored penalties (None when it gave none in time, every
        plan is forbidden, or the multipliers ran away), its bound when proved."""
        comp = self.comp
        self.calls += 1
        floored = np.floor(penalty) if penalty is not None else np.zeros(comp.arrays.c_off[-1])
        seed = self.seed + self.calls
        given, self.given = self.given, None
        if given is not None and np.array_equal(given[0], lam):
            answer: tuple[np.ndarray, bool] | None = given[1]
        elif self.known:
            values = [self._penalised(x, floored) for x in self.known]
            best = int(np.argmin(values))
            found = self.run(lambda: prove_below(comp, floored, values[best], self.seconds, seed), self.wall)
            answer = None if found is None else (self.known[best] if found[0] is None else found[0], found[1])
        else:
            answer = self.run(lambda: prove_penalised(comp, floored, self.seconds, seed), self.wall)
        if answer is None or comp.cost(answer[0]) >= INF:
            return None
        x, proved = answer
        value = self._penalised(x, floored) - float(lam @ comp.capacity)
        if not math.isfinite(value):  # no balance within doubles
            return None
        if self.known is not None:
            self.known.append(np.asarray(x, dtype=np.int64))
        # without penalties the proved minimum is the plan's cost, an exact integer
        exact = comp.cost(x) if penalty is None else proved_bound(value)
        return Minimum(np.asarray(x, dtype=np.int64), value, exact if proved else None)

    def _penalised(self, x: np.ndarray, floored: np.ndarray) -> float:
        """Plan x's cost plus its floored penalties (exact in doubles below 2**53)."""
        return self.comp.cost(x) + float(floored[self.comp.arrays.c_off[:-1] + x].sum())

    def plan(self, x: np.ndarray, deadline: float) -> tuple[np.ndarray, int] | None:
        """``x`` polished for up to POLISH_SECONDS when it fits; no repair (the minimisers that
        matter fit as they are, and repairs take seconds)."""
        search = Search(self.comp, x, self.rng)
        if not search.feasible:
            return None
        search.descend(min(deadline, time.monotonic() + POLISH_SECONDS))
        return search.x, search.total


def exact_lagrangian(comp: FrozenCore, rng: np.random.Generator, seed: int, run: Runner) -> Lagrangian[ToulbarMinimiser]:
    """The Lagrangian search with toulbar2 as its minimiser: full deflected Polyak steps."""
    return Lagrangian(comp, ToulbarMinimiser(comp, rng, seed, run), halving=False)


def dual_search(comp: FrozenCore, rng: np.random.Generator, seed: int, run: Runner) -> Lagrangian[ToulbarMinimiser]:
    """The Lagrangian search for the bound: toulbar2's minima of up to DUAL_SECONDS, each search
    bounded by the cheapest minimum so far, lam from the cutting-plane model; step it until
    ``converged``."""
    return Lagrangian(comp, ToulbarMinimiser(comp, rng, seed, run, DUAL_SECONDS, DUAL_WALL, known=True), cutting=True)


def search(comp: FrozenCore, rng: np.random.Generator, seed: int, best: Callable[[], int | None],
           offer: Callable[[np.ndarray], bool], bound: Callable[[int], None], run: Runner, until: float) -> int:
    """Exact Lagrangian steps on ``comp`` until ``until``, or until STALL steps in a row do not
    ``offer`` a better plan (it says whether it was); each proved bound goes to ``bound``; how
    many steps ran. The first step is the core without penalties: if toulbar2 does not prove that
    one, no step is worth its time."""
    lagrangian = exact_lagrangian(comp, rng, seed, run)
    stale = 0
    while time.monotonic() < until and stale < STALL:
        result = lagrangian.step(best(), until)
        if not result.answered or (lagrangian.steps == 1 and result.bound is None):
            break
        if result.bound is not None:
            bound(result.bound)
        stale = 0 if result.plan is not None and offer(result.plan) else stale + 1
    return lagrangian.steps
