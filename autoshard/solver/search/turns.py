"""The second-search engine (run/workers.py; run where no exact engine takes the core): two
generators of fitting plans taking turns on one processor, sharing the best plan, each better
one reported as an event.

- Lagrangian turns: one plain subgradient step (lagrangian.py); every few steps toulbar2 on the
  step's penalised problem (penalised_probe.py); a slice of neighbourhood search after LNS_AFTER_STEPS
  steps without a better plan (lns.py).
- Usage-weight turns (with toulbar2): one toulbar2 call on the core with per-node usage weights
  for its rows, the weights bisected on its plan (usage_weights.py), the plan repaired to fit
  and polished.

Neither kind is best on every core and a fixed split loses where one kind needs the time, so
the time follows the gains (``time_shares.Shares``): the Lagrangian turns get PRIOR's share while
neither kind gains, and a kind that has been gaining more per second over the last
``time_shares.WINDOW`` seconds gets the larger share (measured: see benchmarks/README.md,
"Measurements behind the design").
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from autoshard.solver.core.reduced import FrozenCore
from autoshard.solver.procs.engine_events import EngineEvent
from autoshard.solver.bounds.relaxed_minimiser import relaxed_lagrangian
from autoshard.solver.search.lns import LNS_AFTER_STEPS, LNS_SLICE, NeighbourhoodSearch
from autoshard.solver.search.time_shares import Shares
from autoshard.solver.search.penalised_probe import PenalisedProbe, fitted
from autoshard.solver.engines.toulbar import solve_penalised
from autoshard.solver.search.usage_weights import TOULBAR_SECONDS, UsageWeights

PRIOR = [0.75, 0.25]
"""Shares of the Lagrangian and usage-weight turns while neither gains: on some cores the
Lagrangian turns' plans come only after minutes of steps, and with half the time they came too
late (measured: see benchmarks/README.md, "Measurements behind the design")."""


class Incumbent:
    """The best fitting plan so far; ``offer`` reports each better one (to the parent, through
    workers.EngineWorker's event pipe) and says whether it was better."""

    def __init__(self, comp: FrozenCore, cost: int | None, plan: list[int] | None,
                 report: Callable[[EngineEvent], None]) -> None:
        self.comp, self.report = comp, report
        self.cost = cost
        self.x = None if plan is None else np.asarray(plan, dtype=np.int64)

    def offer(self, x: np.ndarray, cost: int) -> bool:
        """Keep and report ``x`` (costing ``cost``) if it is cheaper than the best so far."""
        if self.cost is not None and cost >= self.cost:
            return False
        self.cost, self.x = cost, np.asarray(x, dtype=np.int64).copy()
        self.report(EngineEvent("plan", int(cost), self.x.tolist()))
        return True


class LagrangianTurns:
    """Plain subgradient steps (the main process takes deflected ones: two step rules search
    differently, and both deflected did worse; measured: see benchmarks/README.md, "Measurements
    behind the design"), with
    toulbar2 on the penalised problem when ``toulbar``, every CFN_EVERY-th step at most and
    after as much time of steps as its last call took (``PenalisedProbe.due``)."""

    def __init__(self, comp: FrozenCore, rng: np.random.Generator, seed: int, toulbar: bool, best: Incumbent) -> None:
        self.comp, self.best = comp, best
        self.lag = relaxed_lagrangian(comp, rng, deflect=False)
        self.lns = NeighbourhoodSearch(comp, rng)
        self.probe = PenalisedProbe(comp, rng, seed) if toulbar else None
        self.steps = self.stale = 0

    def turn(self) -> None:
        """One step, its toulbar2 call when due, and a slice of neighbourhood search when stale."""
        best = self.best
        self.steps += 1
        result = self.lag.step(best.cost, time.monotonic() + 30.0)
        better = result.plan is not None and best.offer(result.plan, result.cost)
        probe = self.probe
        if probe is not None and probe.due(self.steps) and (penalty := self.lag.penalties()) is not None:
            search = probe.plan(penalty, self.steps, best.cost, time.monotonic() + 30.0, lambda call, _: call())
            better = (search is not None and best.offer(search.x, search.total)) or better
        self.stale = 0 if better else self.stale + 1
        if self.stale >= LNS_AFTER_STEPS and best.x is not None:
            self.lns.run(best.x, time.monotonic() + LNS_SLICE, lambda y: best.offer(y, self.comp.cost(y)))
            self.stale = 0


class WeightTurns:
    """toulbar2 on the core with usage weights in place of its rows (usage_weights.py)."""

    def __init__(self, comp: FrozenCore, rng: np.random.Generator, seed: int, best: Incumbent) -> None:
        self.comp, self.rng, self.seed, self.best = comp, rng, seed, best
        self.weights = UsageWeights(comp)
        self.calls = 0

    def turn(self) -> None:
        """One call; its plan repaired to fit and polished (penalised_probe.py's limits); the weights
        bisected on the raw plan."""
        self.calls += 1
        y = solve_penalised(self.comp, self.weights.penalty(), TOULBAR_SECONDS, self.seed + self.calls)
        if y is None:
            return
        search = fitted(self.comp, y, self.rng)
        if search is not None:
            self.best.offer(search.x, search.total)
        self.weights.update(y)


def run(comp: FrozenCore, seed: int, upper: int | None, plan: list[int] | None, toulbar: bool,
        report: Callable[[EngineEvent], None]) -> None:
    """Turns until killed: Lagrangian ones only, or with ``toulbar`` (toulbar2 takes the core
    without its rows) the two kinds sharing the time by ``Shares``. ``upper``/``plan``: the best
    plan the parent knew; ``report`` takes each better plan's event."""
    rng = np.random.default_rng(seed)
    best = Incumbent(comp, upper, plan, report)
    kinds: list[LagrangianTurns | WeightTurns] = [LagrangianTurns(comp, rng, seed, toulbar, best)]
    if toulbar and comp.has_memory:
        kinds.append(WeightTurns(comp, rng, seed, best))
    shares = Shares(PRIOR if len(kinds) == 2 else [1.0])
    while True:
        k = shares.next()
        before, began = best.cost, time.monotonic()
        kinds[k].turn()
        gain = 0.0 if before is None or best.cost is None else (before - best.cost) / max(abs(before), 1)
        shares.record(k, time.monotonic() - began, gain)
