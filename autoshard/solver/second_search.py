"""The second engine's plan search (the ``lagrange`` child of workers.py, where no exact engine
takes the core): two generators of fitting plans taking turns on one processor, sharing the best
plan, each better one written out in toulbar2's line format.

- Lagrangian turns: one plain subgradient step (lagrange.py); every few steps toulbar2 on the
  step's penalised problem (subproblem.py); a slice of neighbourhood search after LNS_AFTER
  steps without a better plan (lns.py).
- Usage-weight turns (with toulbar2): one toulbar2 call on the core with per-node usage weights
  for its rows, the weights bisected on its plan (usage_weights.py), the plan repaired to fit
  and polished.

Neither kind alone is best everywhere, and a fixed split loses where one kind needs the time:
offline, one core, best plan after 170 s (U: 280 s), seed 1:

| core | Lagrangian only | usage weights only | half each |
|---|---:|---:|---:|
| K | (whole runs: stopped at 2.35e9 in every one) | 2.2401e9 | 2.2887e9 |
| M | 4.9936e10 | 5.0112e10 | 5.0129e10 |
| N | 2.0810e11 | 2.0816e11 | 2.0926e11 |
| U | 2.5387e9 | 2.6074e9 | 2.5112e9 |

So the time follows the gains (``shares.Shares``): the Lagrangian turns get PRIOR's three
quarters while neither kind gains (M's Lagrangian plans come after 120 s of steps), and a kind
that has been gaining more per second over the last ``shares.WINDOW`` seconds gets the larger
share. Whole runs, contest limits (benchmarks/README.md, twelfth round): K 0.9979, M 1.0007,
N 1.0150, U 0.9317 of the best known cost, against 1.015-1.026, 1.0004, 1.003-1.019 and 0.956
with Lagrangian turns only, and 0.986, 1.0026, 1.018-1.027 and 1.036 with weights only.
"""

from __future__ import annotations

import os
import time

import numpy as np

from autoshard.solver.core import Compact
from autoshard.solver.lagrange import LagrangianSearch
from autoshard.solver.lns import NeighbourhoodSearch
from autoshard.solver.shares import Shares
from autoshard.solver.subproblem import PenalisedProbe, fitted
from autoshard.solver.toulbar import solve_penalised
from autoshard.solver.usage_weights import TOULBAR_SECONDS, UsageWeights
from autoshard.solver.workers import solution_lines

LNS_AFTER = 30
"""Lagrangian steps without a better plan before a slice of neighbourhood search..."""
LNS_SLICE = 5.0
"""... of this many seconds."""
PRIOR = [0.75, 0.25]
"""Shares of the Lagrangian and usage-weight turns while neither gains (M: the Lagrangian
child's plans come after 120 s of its steps; with half the time they came too late)."""


class Incumbent:
    """The best fitting plan so far; ``offer`` writes each better one to fd 1 (the pipe the
    parent reads, workers.EngineWorker) and says whether it was better."""

    def __init__(self, comp: Compact, cost: int | None, plan: list[int] | None) -> None:
        self.comp = comp
        self.cost = cost
        self.x = None if plan is None else np.asarray(plan, dtype=np.int64)

    def offer(self, x: np.ndarray, cost: int) -> bool:
        if self.cost is not None and cost >= self.cost:
            return False
        self.cost, self.x = cost, np.asarray(x, dtype=np.int64).copy()
        os.write(1, ("\n".join(solution_lines(cost - self.comp.const, self.x.tolist())) + "\n").encode())
        return True


class LagrangianTurns:
    """Plain subgradient steps (the main process takes deflected ones: two step rules, not one
    twice; offline, 30-80 steps: deflected found better plans on S, T and K, as good on R; in
    whole runs with both deflected K, N and R ended 3-7% worse than with both plain), with
    toulbar2 on the penalised problem when ``toulbar``, every CFN_EVERY-th step at most and
    after as much time of steps as its last call took (``PenalisedProbe.due``)."""

    def __init__(self, comp: Compact, rng: np.random.Generator, seed: int, toulbar: bool, best: Incumbent) -> None:
        self.comp, self.best = comp, best
        self.lag = LagrangianSearch(comp, rng, deflect=False)
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
        if self.stale >= LNS_AFTER and best.x is not None:
            self.lns.run(best.x, time.monotonic() + LNS_SLICE, lambda y: best.offer(y, self.comp.cost(y)))
            self.stale = 0


class WeightTurns:
    """toulbar2 on the core with usage weights in place of its rows (usage_weights.py)."""

    def __init__(self, comp: Compact, rng: np.random.Generator, seed: int, best: Incumbent) -> None:
        self.comp, self.rng, self.seed, self.best = comp, rng, seed, best
        self.weights = UsageWeights(comp)
        self.calls = 0

    def turn(self) -> None:
        """One call; its plan repaired to fit and polished (subproblem.py's limits); the weights
        bisected on the raw plan."""
        self.calls += 1
        y = solve_penalised(self.comp, self.weights.penalty(), TOULBAR_SECONDS, self.seed + self.calls)
        if y is None:
            return
        search = fitted(self.comp, y, self.rng)
        if search is not None:
            self.best.offer(search.x, search.total)
        self.weights.update(y)


def run(comp: Compact, seed: int, upper: int | None, plan: list[int] | None, toulbar: bool) -> None:
    """Turns until killed: Lagrangian ones only, or with ``toulbar`` (toulbar2 takes the core
    without its rows) the two kinds sharing the time by ``Shares``. ``upper``/``plan``: the best
    plan the parent knew."""
    rng = np.random.default_rng(seed)
    best = Incumbent(comp, upper, plan)
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
