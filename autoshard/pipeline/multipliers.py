"""The multipliers of a device's Lagrangian bound under its memory budget (``budget_bound.py``).

Formulation. ``L(lam) = DeviceParts.at(lam)`` is concave in lam = (lam_1, ..., lam_k) >= 0 (a
minimum of functions affine in lam) and every point's minimiser gives a supergradient g (its
bytes in each row less the limit): ``L(mu) <= L(lam) + g . (mu - lam)`` for all mu. Any lam is a
valid bound; :func:`best_multipliers` looks for a large one:

1. lam = 0 (the memory-free bound of the parts; the answer where its minimiser fits every row);
2. along the axis of the row whose supergradient at 0 is the largest (the other multipliers at
   0): a walk on a grid shared by the devices (parts common to several devices are then
   minimised once per multiplier) to two neighbours whose supergradients have opposite signs,
   then cutting planes between them until their meeting point is within :data:`TOLERANCE` of the
   best value (:func:`_axis`);
3. with several rows, Kelley's cutting planes over every point evaluated so far (the points on
   the axis carry every row's supergradient, so the other rows start from them), in the box
   ``0 <= lam_r <= 2 max(every multiplier tried)`` (the rows all price bytes): the linear program
   ``max z`` subject to ``z <= L(lam_j) + g_j . (lam - lam_j)`` gives an upper estimate of
   ``max L`` in the box and the next point; it stops once the estimate is within
   :data:`TOLERANCE` of the best value (:func:`_kelley`).

Every step stops once the best value reaches ``enough`` (a caller that takes the least of it and
``enough`` needs no more).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.sparse import csc_array

from autoshard.pipeline.budget_bound import DeviceParts
from autoshard.solver.core.highs import LpModel, solve_lp

STEPS = 12
"""Most evaluations of the penalised parts along one row's axis after the first."""
KELLEY = 6
"""Most evaluations of Kelley's cutting planes over several rows."""
TOLERANCE = 1e-4
"""Relative distance of the cutting planes' upper estimate from the best value at which a search stops."""
LOWEST = -40
"""The least grid index a walk goes down to (a multiplier 2**-20 of the base)."""

Cut = tuple[tuple[float, ...], float, np.ndarray]
"""An evaluated point: its multipliers, the relaxation's value there and its supergradient."""


class Grid:
    """The multipliers every device's walk tries first along a row's axis, shared so that parts
    common to several devices (the same layer under the same microbatches in flight) are minimised
    once per multiplier: ``base * 2 ** (j / 2)`` for whole j, ``base`` set from the first device
    searched (a sixteenth of its free minimum per byte of the limit); ``start[r]``: where the last
    walk along row r ended, where the next begins."""

    def __init__(self) -> None:
        self.base: float | None = None
        self.start: dict[int, int] = {}

    def at(self, j: int) -> float:
        """The j-th multiplier."""
        return self.base * 2 ** (j / 2)


def best_multipliers(parts: DeviceParts, further: int, limit: int, grid: Grid | None = None,
                     enough: float = math.inf) -> float:
    """The largest value found of the concave relaxation over lam >= 0 (module formulation), in
    ticks; infinite where no plan holds at most ``limit`` bytes in some row."""
    if (parts.fewest(further) > limit).any():
        return math.inf
    f0, g0 = parts.at((0.0,) * len(parts.fewest(further)), further, limit)
    cuts: list[Cut] = [((0.0,) * len(g0), f0, g0)]
    best = f0
    if (g0 <= 0).all() or best >= enough:
        return best
    grid = grid or Grid()
    if grid.base is None:
        grid.base = f0 / limit / 16 if f0 > 0 and limit > 0 else 1.0
    best = max(best, _axis(parts, further, limit, grid, int(np.argmax(g0)), cuts, best, enough))
    if best >= enough:
        return best
    return _kelley(parts, further, limit, cuts, best, enough) if len(g0) > 1 else best


def _axis(parts: DeviceParts, further: int, limit: int, grid: Grid, row: int, cuts: list[Cut], best: float,
          enough: float) -> float:
    """Step 2 along ``row``'s axis: at most :data:`STEPS` evaluations, each appended to ``cuts``;
    the best value found (at least ``best``)."""
    def point(lam: float) -> tuple[float, float]:
        at = tuple(lam if r == row else 0.0 for r in range(len(cuts[0][2])))
        f, g = parts.at(at, further, limit)
        cuts.append((at, f, g))
        return f, g[row]

    f_lo, g_lo = cuts[0][1], cuts[0][2][row]
    lo, hi = (None, 0.0, f_lo, g_lo), None  # (grid index or None, lam, value, supergradient along the row)
    j, steps = grid.start.get(row, 0), 0
    while steps < STEPS and best < enough:
        lam = grid.at(j)
        f, g = point(lam)
        steps, best = steps + 1, max(best, f)
        if g > 0:
            lo = (j, lam, f, g)
            if hi is not None and hi[0] == j + 1:
                break
            j += 1
        else:
            hi = (j, lam, f, g)
            if lo[0] == j - 1 or j <= LOWEST:
                break
            j -= 1
    if lo[0] is not None:
        grid.start[row] = lo[0]
    while hi is not None and steps < STEPS and hi[3] < 0 and best < enough:
        (_, a, f_a, g_a), (_, b, f_b, g_b) = lo, hi
        mid = (f_b - f_a + g_a * a - g_b * b) / (g_a - g_b)  # where the two cutting planes meet
        if not a < mid < b or f_a + g_a * (mid - a) - best <= TOLERANCE * abs(best):
            break
        f, g = point(mid)
        steps, best = steps + 1, max(best, f)
        if g > 0:
            lo = (None, mid, f, g)
        else:
            hi = (None, mid, f, g)
    return best


def _kelley(parts: DeviceParts, further: int, limit: int, cuts: list[Cut], best: float, enough: float) -> float:
    """Step 3: at most :data:`KELLEY` evaluations at the maximiser of the cutting-plane model of
    ``cuts`` in the box; the best value found (at least ``best``). Where the model's maximiser lies
    on the box's upper face of a row, that side is doubled (at most :data:`KELLEY` times in all).
    The linear program is solved in units of ``|best|`` and of the box's sides, so that its
    numbers are near 1."""
    rows = len(cuts[0][2])
    box = np.full(rows, 2 * max(max(c[0]) for c in cuts))  # the rows all price bytes: one scale
    if not box[0] > 0 or best <= 0:
        return best
    steps = doubled = 0
    while steps < KELLEY and best < enough:
        # variables (mu_1..mu_k, z), lam = box * mu: max z s.t. z - (g_j box) . mu <= f_j - g_j . lam_j
        slopes = np.array([c[2] * box for c in cuts]) / best
        a_ub = np.hstack([-slopes, np.ones((len(cuts), 1))])
        b_ub = np.array([c[1] - float(np.dot(c[2], c[0])) for c in cuts]) / best
        found = solve_lp(LpModel(np.r_[np.zeros(rows), -1.0], csc_array(a_ub), np.full(len(cuts), -np.inf), b_ub,
                                 np.r_[np.zeros(rows), -np.inf], np.r_[np.ones(rows), np.inf]))
        if found.status != "optimal":
            break
        mu, estimate = found.x[:rows], found.x[-1] * best
        face = mu >= 1 - 1e-9
        if estimate - best <= TOLERANCE * best:
            if not face.any() or doubled >= KELLEY:
                break
            box[face], doubled = 2 * box[face], doubled + 1
            continue
        at = tuple(float(v) for v in box * mu)
        f, g = parts.at(at, further, limit)
        cuts.append((at, f, g))
        steps, best = steps + 1, max(best, f)
    return best
