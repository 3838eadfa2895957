"""A certified lower bound of an LP from any dual vector: the Lagrangian dual function.

For  min c.z  s.t.  rl <= A z <= ru,  cl <= z <= cu  and any y (each y_i's sign clipped to the
row's finite bound),

    L(y) = sum_i (y_i rl_i if y_i > 0 else y_i ru_i) + sum_j min(d_j cl_j, d_j cu_j),   d = c - A^T y

is a lower bound, so neither a solver's tolerances nor an LP cut short can inflate it. It is
computed in float64 and, the costs being integers, rounded up after a safety margin
(trws.safe_bound) over the magnitudes of its terms and of the reduced costs that enter it.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import sparray

from autoshard.solver.trws import safe_bound


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
