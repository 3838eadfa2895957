"""The multipliers of the Lagrangian (lagrangian.py) by cutting planes in a box (BOXSTEP).

Every plan x gives an affine function of the multipliers that lies above the dual function:

    L(lam) = min_x cost(x) + lam . g(x)  <=  cost(x_k) + lam . g(x_k)   for every k,   g(x) = usage(x) - capacity

so the cuts met so far form a concave, piecewise-linear model m(lam) = min_k (f_k + lam . g_k) >= L(lam).
The next multipliers maximise the model in a box around the centre c (the multipliers of the
best dual value L_b so far; Marsten, Hogan and Blankenship 1975):

    max t   s.t.   t <= f_k + lam . g_k   for every cut k,   max(0, c - rho) <= lam <= c + rho

with rho_r = max(c_r, delta) (``delta``: the price at which the first minimiser's overflow would
cost the gap to the best plan). The box's maximum m* bounds L within the box; once m* <= L_b +
``TOLERANCE``, c is a maximum of L within the box, and, L being concave, its maximum everywhere
(``converged``). A minimiser that is exact only up to a rounding (toulbar2's floored penalties) can
return at the model's maximum a plan whose cut does not lower the model there; the model then
agrees with every minimum it can be shown, and the search has converged as far as that rounding
allows (``converged`` too: asking again at the same multipliers would return the same plan).

Where Polyak's steps approach the maximum with a step length guessed from a target, the model
needs no target and no step length, and in a few dimensions ends within a handful of minima (measured on IOPDDL V's core: 13 rows, the dual's maximum 0.844 of the optimum in 8 exact
minima, 15 s alone on the 2-core machine; Polyak's steps on TRW-S's dual end near 0.80 in 300 s).

The cuts are valid whether or not the minimiser proved its minimum (any plan gives one); a minimum
that is not proved gives only its cut: its value is no dual value (it may lie above L), so it
neither moves the centre nor confirms the model.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_array

from autoshard.solver.core.highs import LpModel, solve_lp

TOLERANCE = 0.5
"""Model maximum within this (plus 1e-9 relative) of the best dual value: converged (costs are
integers, so half a unit changes no certified bound)."""


class CuttingPlane:
    """The cutting-plane model of L over ``rows`` multipliers; ``add`` each minimum, ``next`` the
    multipliers to try."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.values: list[float] = []  # f_k = cost(x_k)
        self.slopes: list[np.ndarray] = []  # g_k = usage(x_k) - capacity
        self.centre = np.zeros(rows)
        self.best = -np.inf
        self.delta: float | None = None
        self.model = np.inf  # the box maximum of the model at the last ``next``
        self.confirmed = False  # the last cut, at the model's maximum, did not lower the model there

    @property
    def converged(self) -> bool:
        """Whether the best dual value is the model's maximum within its box (so L's maximum)."""
        return self.confirmed or self.model <= self.best + self._tolerance()

    def _tolerance(self) -> float:
        return TOLERANCE + (1e-9 * abs(self.best) if np.isfinite(self.best) else 0.0)

    def add(self, lam: np.ndarray, cost: float, slope: np.ndarray, value: float | None, upper: float | None) -> None:
        """The minimiser at ``lam`` (cost f, overflow g) as a cut, and its dual value ``value``
        (L(lam) up to the minimiser's rounding; None when its minimum is not proved) as a
        candidate centre; ``upper``: the best plan's cost (or None), which sizes the first box;
        ``lam`` is the last ``next`` (or 0 at the first)."""
        at = float(cost) + float(np.dot(lam, slope))
        self.confirmed = value is not None and at >= self.model - self._tolerance()
        self.values.append(float(cost))
        self.slopes.append(np.asarray(slope, dtype=np.float64))
        if value is not None and value > self.best:
            self.best, self.centre = value, np.asarray(lam, dtype=np.float64).copy()
        if self.delta is None:
            over = float(np.maximum(slope, 0).sum())
            gap = (upper - at) if upper is not None else abs(at) * 0.05
            self.delta = max(gap, 1.0) / max(over, 1.0)

    def seed(self, cost: float, slope: np.ndarray) -> None:
        """A plan's cut (cost f, overflow g) known before the first minimum, e.g. from a parent
        problem whose plans this one allows: it shapes the model and is no dual value."""
        self.values.append(float(cost))
        self.slopes.append(np.asarray(slope, dtype=np.float64))

    def next(self) -> np.ndarray:
        """The multipliers that maximise the model in the box around the centre (the centre itself
        when the LP gives no answer); sets the box maximum ``model``."""
        assert self.values and self.delta is not None, "add a cut first"
        if not self.rows:
            self.model = self.best
            return self.centre
        rho = np.maximum(self.centre, self.delta)
        k = len(self.values)
        shift = self.best if np.isfinite(self.best) else 0.0  # keeps the LP's numbers near 0
        # columns (t, lam); rows t - g_k . lam <= f_k - shift
        a = csr_array(np.column_stack([np.ones(k), -np.array(self.slopes)]))
        lower = np.concatenate([[-np.inf], np.maximum(0.0, self.centre - rho)])
        upper = np.concatenate([[np.inf], self.centre + rho])
        c = np.zeros(self.rows + 1)
        c[0] = -1.0
        answer = solve_lp(LpModel(c, a, np.full(k, -np.inf), np.array(self.values) - shift, lower, upper))
        if answer.x is None or answer.value is None:
            self.model = np.inf
            return self.centre
        self.model = shift - answer.value
        return np.clip(answer.x[1:], lower[1:], upper[1:])
