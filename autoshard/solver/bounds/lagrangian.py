"""Lagrangian relaxation of the memory rows, solved by TRW-S: plans and lower bounds.

    L(lam) = min_x  cost(x) + sum_r lam_r * (usage_r(x) - capacity_r),   lam >= 0

For every lam, L(lam) <= cost of every plan that fits, so any lower bound on the penalised
minimum minus lam . capacity is a lower bound of the problem (``LagrangianSearch.step``). The
penalised problem has no memory constraint: its cost per strategy of node i grows by
usage_i[s] times the sum of lam over the node's rows (``penalties``). Each step solves it — exactly
by variable elimination when the core's treewidth allows (``plan``; then the bound is the exact
Lagrangian dual value), otherwise approximately by TRW-S sweeps and a plan read off the messages
— repairs the plan if it overflows, polishes it by local search, and moves lam along the
overflow of the penalised plan g_k (Polyak step towards the best cost U), deflected:

    d_k = g_k - 1.5 (g_k . d_{k-1} / |d_{k-1}|^2) d_{k-1}   if g_k . d_{k-1} < 0, else g_k
    lam_{k+1} = max(0, lam_k + alpha (U - L(lam_k)) / |d_k|^2 * d_k)

Without a memory limit lam is empty and this is plain TRW-S with local-search polishing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numba import njit

from autoshard.solver.core.reduced import FrozenCore, views
from autoshard.solver.core.dual_cut import DualCut
from autoshard.solver.engines.elimination import EliminationPlan
from autoshard.solver.core.local_search import Search
from autoshard.solver.bounds.trws import MessagePassing
from autoshard.solver.core.certify import safe_bound


@dataclass
class StepResult:
    """A fitting plan found in this step (or None) and a proven lower bound (or None)."""

    plan: np.ndarray | None
    cost: int | None
    bound: int | None


SWEEPS = 2
"""TRW-S sweeps per step (the messages carry over from step to step): two gave better plans than
one on a quiet machine (measured: see benchmarks/README.md, "Measurements behind the design")."""


DEFLECTION = 1.5
"""Camerini-Fratta-Maffioli's factor: the deflected direction keeps half of the turn, d.d' = -g.d'/2."""


def deflected(g: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """The subgradient g deflected by the last direction when it turns against it (g.d' < 0):
    g - DEFLECTION (g.d'/|d'|^2) d', which damps the zig-zag of plain subgradient steps."""
    dot = float(g @ previous)
    size = float(previous @ previous)
    if dot >= 0 or size <= 0:
        return g
    return g - DEFLECTION * dot / size * previous


def polyak_step(lam: np.ndarray, d: np.ndarray, value: float, upper: int | None, alpha: float = 1.0) -> np.ndarray:
    """The multipliers after one Polyak step of length ``alpha`` along the direction ``d`` from
    the dual value L = ``value`` towards U = ``upper`` (else 5% above L):
    max(0, lam + alpha max(U - L, 1) / |d|^2 d); ``lam`` itself when d is 0. Both Lagrangian
    searches (this one and exact_lagrangian.py) move their multipliers by it."""
    norm = float(d @ d)
    if norm <= 0:
        return lam
    target = upper if upper is not None else value + abs(value) * 0.05 + 1.0
    return np.maximum(0.0, lam + alpha * max(target - value, 1.0) / norm * d)


def row_penalties(comp: FrozenCore, lam: np.ndarray) -> np.ndarray:
    """Every strategy's usage times the summed multipliers ``lam`` of its rows, flat
    (``FrozenCore.arrays.c_off``'s layout)."""
    cum = np.concatenate([[0.0], np.cumsum(lam)])
    return _penalties(cum, *comp.arrays.segment_args())


class LagrangianSearch:
    """Subgradient ascent on lam with TRW-S as the inner solver, one ``step`` at a time."""

    def __init__(
        self,
        comp: FrozenCore,
        rng: np.random.Generator,
        sweeps: int = SWEEPS,
        plan: EliminationPlan | None = None,
        deflect: bool = True,
    ) -> None:
        """``deflect``: deflected (True) or plain subgradient steps on the multipliers (``_update``)."""
        self.comp = comp
        self.deflect = deflect
        self.rng = rng
        self.sweeps = sweeps
        self.plan = plan if plan is not None and plan.feasible else None
        self.mp = MessagePassing(comp)
        rows = 0 if comp.capacity is None else len(comp.capacity)
        self.capacity = np.zeros(rows) if comp.capacity is None else comp.capacity.astype(np.float64)
        self.lam = np.zeros(rows)
        self.alpha = 1.0
        self.best_value = -np.inf
        self.stale = 0
        self.last_overflow = 0.0
        self.repair_threshold = 0.01
        self.direction: np.ndarray | None = None

    def penalties(self) -> np.ndarray | None:
        """The penalty of every strategy, flat (``FrozenCore.arrays.c_off``'s layout, which every
        consumer takes as is): its usage times the summed multipliers of its rows."""
        if not len(self.lam) or not self.lam.any():
            return None
        return row_penalties(self.comp, self.lam)

    def step(self, upper: int | None, deadline: float) -> StepResult:
        """One round: sweeps, bound, plan, repair and polish, multiplier update."""
        pen = self.penalties()
        if self.plan is not None:
            a = self.comp.arrays
            unary = None if pen is None else views(a.costs.astype(np.float64) + pen, a.c_off)
            x, value = self.plan.solve(unary)
            x = np.asarray(x, dtype=np.int64)
            magnitude = abs(float(value)) + (0.0 if pen is None else float(np.abs(pen).sum()))
            scale = magnitude * max(1.0, self.comp.n / 100)  # float sums over up to n terms
            value = float(value) + (0.0 if pen is None else self.comp.const)
        else:
            began = time.monotonic()
            for _ in range(self.sweeps):
                if not self.mp.sweep(pen, deadline):
                    return StepResult(None, None, None)  # out of time: no bound or plan this step
            sweep = (time.monotonic() - began) / max(self.sweeps, 1)
            if deadline - time.monotonic() < sweep:  # reading the bound and plan off takes about a sweep
                return StepResult(None, None, None)
            value, scale = self.mp.bound(pen)
            x = self.mp.primal(pen)
        value -= float(self.lam @ self.capacity)
        scale += float(np.abs(self.lam * self.capacity).sum())
        bound = safe_bound(value, scale)
        if pen is not None and self.plan is None:
            polish = Search(self.comp, x, self.rng, penalty=pen)
            polish.descend(deadline)
            x = polish.x
        search = Search(self.comp, x, self.rng)
        overflow = -np.minimum(search.slack, 0) if search.memory else None
        self.last_overflow = 0.0 if overflow is None else float(overflow.sum() / max(1.0, self.capacity.sum()))
        if not search.feasible and self.last_overflow <= self.repair_threshold:
            search.repair(deadline)
        plan, cost = None, None
        if search.feasible:
            search.descend(deadline)
            plan, cost = search.x.copy(), search.total
        if overflow is not None:
            self._update(x, value, upper if upper is not None else cost)
        return StepResult(plan, cost, bound)

    def cut(self) -> DualCut:
        """The current multipliers and messages as a cut for z3 (valid for every plan that fits)."""
        return self.mp.cut(self.penalties(), -float(self.lam @ self.capacity))

    def _update(self, x: np.ndarray, value: float, upper: int | None) -> None:
        """Polyak step on lam along the penalised plan's usage minus capacity, deflected when
        ``deflect`` (Camerini, Fratta and Maffioli 1975): d = g - 1.5 (g.d'/|d'|^2) d' when g turns
        against the last direction d'. Plain subgradient steps zig-zag (every other penalised
        plan overflows and yields no plan); deflection damps that (measured: see
        benchmarks/README.md, "Measurements behind the design")."""
        if value > self.best_value + 1e-9 * abs(value):
            self.best_value, self.stale = value, 0
        else:
            self.stale += 1
            if self.stale >= 8:
                self.alpha, self.stale = max(self.alpha / 2, 1e-3), 0
        g = self.comp.profile(x).astype(np.float64) - self.capacity
        g[(self.lam <= 0) & (g < 0)] = 0.0
        if self.deflect and self.direction is not None:
            g = deflected(g, self.direction)
            g[(self.lam <= 0) & (g < 0)] = 0.0
        self.direction = g
        self.lam = polyak_step(self.lam, g, value, upper, self.alpha)


@njit(cache=True)
def _penalties(cum, c_off, seg_ptr, seg_start, seg_stop, seg_uoff, seg_use):  # pragma: no cover
    """Flat per-strategy penalties: each segment's usage times its rows' summed multipliers
    (``cum``: their running sums from 0), added segment by segment."""
    pen = np.zeros(c_off[-1])
    for i in range(len(c_off) - 1):
        for q in range(seg_ptr[i], seg_ptr[i + 1]):
            weight = cum[seg_stop[q]] - cum[seg_start[q]]
            for s in range(c_off[i + 1] - c_off[i]):
                pen[c_off[i] + s] += seg_use[seg_uoff[q] + s] * weight
    return pen
