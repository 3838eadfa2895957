"""The Lagrangian relaxation of the memory rows: one subgradient search, its minimiser pluggable.

    L(lam) = min_x  cost(x) + sum_r lam_r * (usage_r(x) - capacity_r),   lam >= 0

For every lam, L(lam) <= cost of every plan that fits, so any certified lower bound on the
penalised minimum, less lam . capacity, bounds the problem. The penalised problem has no memory
row: strategy s of node i costs usage_i[s] times the summed lam of the node's rows more
(``row_penalties``). A ``Minimiser`` minimises it — TRW-S or exact elimination
(relaxed_minimiser.py), or toulbar2's proof (exact_lagrangian.py) — and turns the minimiser into
a fitting plan where it can. ``Lagrangian.step`` then moves lam along the minimiser's overflow
g_k by a Polyak step towards the best cost U, deflected when g_k turns against the last
direction (Camerini, Fratta and Maffioli 1975):

    d_k = g_k - 1.5 (g_k . d_{k-1} / |d_{k-1}|^2) d_{k-1}   if g_k . d_{k-1} < 0, else g_k
    lam_{k+1} = max(0, lam_k + alpha (U - L(lam_k)) / |d_k|^2 * d_k)

Plain subgradient steps zig-zag (every other penalised plan overflows and yields no plan);
deflection damps that (measured: see benchmarks/README.md, "Measurements behind the design").
With ``cutting`` (for exact minimisers) lam comes instead from the cutting-plane model of L that
the minima build (cutting_plane.py), which needs no target U and says when L's maximum is reached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np
from numba import njit

from autoshard.solver.bounds.cutting_plane import CuttingPlane
from autoshard.solver.core.reduced import INF, FrozenCore


@dataclass
class StepResult:
    """A fitting plan found in this step (or None) and a proven lower bound (or None);
    ``answered`` is False when the minimiser gave no minimum (out of time)."""

    plan: np.ndarray | None
    cost: int | None
    bound: int | None
    answered: bool = True


@dataclass(frozen=True)
class Minimum:
    """The minimiser's point x of the penalised problem (whose overflow moves lam), the dual value
    L(lam) it gives (float, for the step) and the certified integer bound (None: not proved)."""

    x: np.ndarray
    value: float
    bound: int | None


class Minimiser(Protocol):
    """What minimises the penalised core for ``Lagrangian``."""

    def minimise(self, lam: np.ndarray, penalty: np.ndarray | None, deadline: float) -> Minimum | None:
        """The penalised core's minimum at multipliers ``lam`` (``penalty``: their flat penalties,
        None when lam is 0); None when it gave none by ``deadline``."""

    def plan(self, x: np.ndarray, deadline: float) -> tuple[np.ndarray, int] | None:
        """A fitting plan made from the minimiser ``x`` and its cost, or None."""


M = TypeVar("M", bound=Minimiser)

DEFLECTION = 1.5
"""Camerini-Fratta-Maffioli's factor: the deflected direction keeps half of the turn, d.d' = -g.d'/2."""
HALVE_AFTER = 8
"""Steps without a better L after which a ``halving`` search halves its step length alpha."""


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
    max(0, lam + alpha max(U - L, 1) / |d|^2 d); ``lam`` itself when d is 0."""
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


class Lagrangian(Generic[M]):
    """Subgradient ascent on the multipliers ``lam`` of ``comp``'s memory rows, each step's
    penalised core minimised by ``minimiser``. ``deflect``: deflected or plain steps. ``halving``
    (for approximate minimisers): g's entries that would push a zero lam below 0 are dropped and
    alpha halves after HALVE_AFTER steps without a better L; exact minimisers take full steps.
    ``back_to_best`` (with ``halving``): each halving also moves lam back to the multipliers of the
    best L so far, so steps that overshot from a target U far above the optimum do not leave lam
    stranded where L is low (the search beside toulbar2, whose first plans are far from it).
    ``cutting``: lam maximises the cutting-plane model instead (cutting_plane.py; no Polyak step),
    and ``converged`` says when the best L is the dual's maximum; for minimisers whose ``bound``
    is set only when their minimum is proved (exact up to rounding)."""

    def __init__(self, comp: FrozenCore, minimiser: M, deflect: bool = True, halving: bool = True,
                 back_to_best: bool = False, cutting: bool = False) -> None:
        self.comp, self.minimiser, self.deflect, self.halving = comp, minimiser, deflect, halving
        self.back_to_best = back_to_best
        self.capacity = np.zeros(0) if comp.capacity is None else comp.capacity.astype(np.float64)
        self.lam = np.zeros(len(self.capacity))
        self.best_lam = self.lam.copy()
        self.direction = np.zeros(len(self.capacity))
        self.alpha = 1.0
        self.best_value = -np.inf
        self.stale = 0
        self.steps = 0
        self.model = CuttingPlane(len(self.capacity)) if cutting else None

    @property
    def converged(self) -> bool:
        """Whether the cutting-plane model says the best dual value is L's maximum (never without
        ``cutting``)."""
        return self.model is not None and bool(self.model.values) and self.model.converged

    def penalties(self) -> np.ndarray | None:
        """The penalty of every strategy, flat (``FrozenCore.arrays.c_off``'s layout, which every
        consumer takes as is): its usage times the summed multipliers of its rows; None at lam 0."""
        if not len(self.lam) or not self.lam.any():
            return None
        return row_penalties(self.comp, self.lam)

    def step(self, upper: int | None, deadline: float, plan: bool = True) -> StepResult:
        """One step: the penalised minimum and its bound, a plan made from it (unless ``plan`` is
        False: a bound-only step, whose bound and move of lam are the same), lam moved towards
        ``upper`` (else the plan's cost), or with ``cutting`` to the model's maximum in its box
        (a minimiser at a forbidden cost adds no cut)."""
        self.steps += 1
        minimum = self.minimiser.minimise(self.lam, self.penalties(), deadline)
        if minimum is None:
            return StepResult(None, None, None, answered=False)
        found = self.minimiser.plan(minimum.x, deadline) if plan else None
        plan, cost = found if found is not None else (None, None)
        if self.model is not None:
            if self.comp.cost(minimum.x) >= INF:
                return StepResult(plan, cost, minimum.bound)
            self.model.add(self.lam, self.comp.cost(minimum.x), self.comp.profile(minimum.x) - self.capacity,
                           None if minimum.bound is None else minimum.value, upper if upper is not None else cost)
            self.lam = self.model.next()
        elif len(self.lam):
            self.move(self.comp.profile(minimum.x).astype(np.float64) - self.capacity, minimum.value,
                      upper if upper is not None else cost)
        return StepResult(plan, cost, minimum.bound)

    def move(self, g: np.ndarray, value: float, upper: int | None) -> None:
        """The (deflected) Polyak step along the overflow ``g`` from L = ``value``; a zero
        direction leaves lam and the last direction as they were."""
        if self.halving:
            if value > self.best_value + 1e-9 * abs(value):
                self.best_value, self.best_lam, self.stale = value, self.lam, 0
            else:
                self.stale += 1
                if self.stale >= HALVE_AFTER:
                    self.alpha, self.stale = max(self.alpha / 2, 1e-3), 0
                    if self.back_to_best:
                        self.lam, self.direction = self.best_lam, np.zeros(len(self.capacity))
                        return
            g = np.where((self.lam <= 0) & (g < 0), 0.0, g)
        d = deflected(g, self.direction) if self.deflect else g
        if self.halving:
            d = np.where((self.lam <= 0) & (d < 0), 0.0, d)
        if float(d @ d) > 0:
            self.lam, self.direction = polyak_step(self.lam, d, value, upper, self.alpha), d


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
