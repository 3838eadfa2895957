"""toulbar2 on the Lagrangian subproblem: every few steps of a Lagrangian search, the core's
costs plus the step's multipliers times usage (memory rows left out) go to toulbar2's
neighbourhood search (``toulbar.solve_penalised``); its plan is repaired to fit and polished.

That is the contest winner's method, and TRW-S's plan read off unconverged messages is a poor
minimiser of the same problem on wide cores. Both Lagrangian searches run it (the child's plain
steps, turns.LagrangianTurns; the main process's deflected ones, Portfolio._lagrangian):
which multipliers a call sees decides most of its plan's cost, so two step rules give two draws.
Measured: see benchmarks/README.md, "Measurements behind the design".
"""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np

from autoshard.solver.procs.clock import MONOTONIC, Clock
from autoshard.solver.core.reduced import FrozenCore
from autoshard.solver.core.local_search import Search
from autoshard.solver.engines.toulbar import solve_penalised

CFN_EVERY = 5
"""Lagrangian steps between toulbar2 searches of the penalised problem, and at least as many
seconds of them as the last search took, so the calls take at most half the time: with fast
steps, a count of steps alone left the steps almost no time (measured: see benchmarks/README.md,
"Measurements behind the design") ..."""
CFN_SECONDS = 3
"""... of this many CPU seconds at first, doubled (up to CFN_MAX_SECONDS) while they find no plan."""
CFN_MAX_SECONDS = 24
REPAIR_SECONDS = 10.0
"""Longest repair of a penalised plan that overflows."""
POLISH_SECONDS = 5.0
"""Longest local search on the repaired plan."""

Runner = Callable[[Callable[[], np.ndarray | None], float], np.ndarray | None]
"""Runs toulbar2's call (the closure) with a wall-clock limit (seconds): directly in a child
process that is killed anyway, through ``forks.call_forked`` in the main one."""


class PenalisedProbe:
    """toulbar2 on a Lagrangian search's penalised subproblem every CFN_EVERY steps (and no
    sooner than its last call's time after that call); ``plan``
    returns the repaired, polished plan (a Search) or None. After a call that found nothing,
    toulbar2 gets twice the time (large cores need more than CFN_SECONDS for a first plan); with
    ``back_off`` instead, after a call that did not beat ``best``, the next waits twice as many
    steps (the main process, whose own Lagrangian steps find the best plans on some cores and
    must not be starved by the calls; measured: see benchmarks/README.md, "Measurements behind
    the design")."""

    def __init__(self, comp: FrozenCore, rng: np.random.Generator, seed: int, back_off: bool = False,
                 clock: Clock = MONOTONIC) -> None:
        self.comp = comp
        self.clock = clock  # what a call took, and when the next may start, are its readings
        self.rng = rng
        self.seed = seed
        self.back_off = back_off
        self.seconds = CFN_SECONDS
        self.every = CFN_EVERY
        self.next = CFN_EVERY
        self.ready = 0.0  # the clock's reading from which the next call may start

    def due(self, steps: int) -> bool:
        """True on the steps that get a toulbar2 call."""
        return steps >= self.next and self.clock() >= self.ready

    def plan(self, penalty: np.ndarray, steps: int, best: int | None, deadline: float, run: Runner) -> Search | None:
        """toulbar2's plan for costs plus ``penalty`` (via ``run``), repaired to fit and polished
        by local search before ``deadline``; None when toulbar2 found none or no repair fits."""
        comp, seconds, seed = self.comp, self.seconds, self.seed + steps
        began = self.clock()
        y = run(lambda: solve_penalised(comp, penalty, seconds, seed), 2 * seconds + 1)
        search = None if y is None else fitted(comp, y, self.rng, deadline)
        ended = self.clock()
        self.ready = ended + (ended - began)
        if y is None and not self.back_off:
            self.seconds = min(2 * self.seconds, CFN_MAX_SECONDS)
        if self.back_off:
            paid = search is not None and (best is None or search.total < best)
            self.every = CFN_EVERY if paid else 2 * self.every
        self.next = steps + self.every
        return search


def fitted(comp: FrozenCore, y: np.ndarray, rng: np.random.Generator, deadline: float = math.inf) -> Search | None:
    """Plan ``y`` of a relaxation (memory rows left out) repaired to fit (up to REPAIR_SECONDS)
    and polished by local search (up to POLISH_SECONDS), neither past ``deadline``; None when no
    repair fits."""
    search = Search(comp, y, rng)
    if not search.feasible:
        search.repair(min(deadline, time.monotonic() + REPAIR_SECONDS))
    if not search.feasible:
        return None
    search.descend(min(deadline, time.monotonic() + POLISH_SECONDS))
    return search
