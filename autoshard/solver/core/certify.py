"""The one place a float bound becomes a certified integer lower bound.

Costs are integers, so a float lower bound v certifies ceil(v); the rounding and tolerances of
the computation that gave v come off first, as a margin that depends on what v is:

- ``safe_bound``: a float64 sum (TRW-S's dual, a Lagrangian dual value) whose terms' magnitudes
  add up to ``scale``: ceil(v - 1e-12 (scale + |v|) - 1e-9), ~100 times the worst rounding;
- ``tolerant_bound``: a bound an LP/MIP solver reports (HiGHS's MIP dual bound), within its own
  feasibility tolerances: round(v - 1e-6 |v| - 1);
- ``proved_bound``: the exact minimum of floored integer penalties, summed in doubles:
  floor(v - 1e-9 |v|);
- ``lagrangian_bound``: an LP's bound from *any* dual vector y, the Lagrangian dual function

    L(y) = sum_i (y_i rl_i if y_i > 0 else y_i ru_i) + sum_j min(d_j cl_j, d_j cu_j),   d = c - A^T y

  for  min c.z  s.t.  rl <= A z <= ru,  cl <= z <= cu  (each y_i's sign clipped to the row's
  finite bound), so neither a solver's tolerances nor an LP cut short can inflate it; certified
  by ``safe_bound`` over the magnitudes of its terms and of the reduced costs that enter it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.sparse import sparray



def safe_bound(value: float, scale: float) -> int:
    """An integer lower bound on integer costs from a float64 bound ``value``: ceil after a
    margin ~100 times the worst rounding of a sum whose terms' magnitudes add up to ``scale``."""
    if not math.isfinite(value):
        return -(2**62) if value < 0 else 2**62
    return math.ceil(value - 1e-12 * (scale + abs(value)) - 1e-9)


def tolerant_bound(value: float) -> int:
    """A solver's reported bound ``value`` (HiGHS's MIP dual bound) as an integer lower bound,
    less a margin for its tolerances (relative 1e-6: wider than ``safe_bound``'s, which covers
    only the rounding of float64 sums)."""
    return round(value - 1e-6 * abs(value) - 1)


def proved_bound(value: float) -> int:
    """The exact minimum ``value`` of integer costs and floored penalties, summed in doubles, as
    an integer lower bound (a relative margin of 1e-9 for the sum)."""
    return math.floor(value - 1e-9 * abs(value))


def lagrangian_bound(cost: np.ndarray, a: sparray, y: np.ndarray, row_lower: np.ndarray, row_upper: np.ndarray,
                     col_lower: np.ndarray, col_upper: np.ndarray, const: int = 0) -> tuple[int, np.ndarray]:
    """(the integer bound on integer costs, L(y) + ``const`` rounded up, and the reduced costs d
    at the clipped y); -2**62 as the bound when a reduced cost meets an infinite column bound."""
    y = np.where(((y > 0) & ~np.isfinite(row_lower)) | ((y < 0) & ~np.isfinite(row_upper)), 0.0, y)
    reduced = cost - a.T @ y
    raised = (reduced > 0) & (col_lower != 0)
    lowered = (reduced < 0) & (col_upper > 0)
    if not (np.isfinite(col_lower[raised]).all() and np.isfinite(col_upper[lowered]).all()):
        return -(2**62), reduced
    row_terms = np.where(y > 0, y * _finite(row_lower), y * _finite(row_upper))
    col_terms = np.where(raised, reduced * _finite(col_lower), np.where(lowered, reduced * _finite(col_upper), 0.0))
    magnitude = np.abs(cost) + abs(a).T @ np.abs(y)
    value = float(row_terms.sum() + col_terms.sum()) + const
    scale = float(np.abs(row_terms).sum() + np.abs(col_terms).sum()) + float(magnitude[raised | lowered].sum())
    return safe_bound(value, scale), reduced


def _finite(bounds: np.ndarray) -> np.ndarray:
    """The bounds with the infinite ones as 0 (read only where the dual's sign makes them finite)."""
    return np.where(np.isfinite(bounds), bounds, 0.0)
