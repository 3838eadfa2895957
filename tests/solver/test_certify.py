"""The Lagrangian dual bound (certify.py) against scipy's LP optimum on small random LPs with
integer costs: at most the LP optimum rounded up (what any plan of whole costs pays) for any dual
vector, and at it (to the margin) for the optimal duals."""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_array

from autoshard.solver.core.certify import lagrangian_bound


def test_any_duals_bound_the_lp_and_the_optimal_ones_reach_it() -> None:
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(60):
        rows, cols = int(rng.integers(2, 6)), int(rng.integers(3, 8))
        a = rng.integers(-3, 4, size=(rows, cols)).astype(float)
        cost = rng.integers(0, 20, size=cols).astype(float)
        upper = rng.integers(1, 5, size=cols).astype(float)
        point = rng.random(cols) * upper  # a feasible point, so the rows' range holds it
        level = a @ point
        row_lower = np.where(rng.random(rows) < 0.3, -np.inf, np.floor(level) - rng.integers(0, 3, size=rows))
        row_upper = np.where(rng.random(rows) < 0.3, np.inf, np.ceil(level) + rng.integers(0, 3, size=rows))
        ub = np.concatenate([a[np.isfinite(row_upper)], -a[np.isfinite(row_lower)]])
        bb = np.concatenate([row_upper[np.isfinite(row_upper)], -row_lower[np.isfinite(row_lower)]])
        res = linprog(cost, A_ub=ub if len(ub) else None, b_ub=bb if len(bb) else None,
                      bounds=np.stack([np.zeros(cols), upper], axis=1), method="highs")
        assert res.status == 0
        whole = np.ceil(res.fun - 1e-9) + 7  # the least whole cost the LP allows, plus the constant
        sparse = csr_array(a)
        lower = np.zeros(cols)
        for y in (rng.normal(0, 5, size=rows), np.zeros(rows)):
            bound, _ = lagrangian_bound(cost, sparse, y, row_lower, row_upper, lower, upper, 7)
            assert bound <= whole
        # scipy's duals of the <= rows (<= 0) and the >= rows, as one y on rl <= A z <= ru
        marginals = res.ineqlin.marginals
        y = np.zeros(rows)
        y[np.isfinite(row_upper)] += marginals[: int(np.isfinite(row_upper).sum())]
        y[np.isfinite(row_lower)] -= marginals[int(np.isfinite(row_upper).sum()):]
        bound, reduced = lagrangian_bound(cost, sparse, y, row_lower, row_upper, lower, upper, 7)
        assert whole - 1 <= bound <= whole
        assert np.allclose(reduced, cost - a.T @ y)
        checked += 1
    assert checked == 60
    # an infinite column bound where the reduced cost would reach it: no bound
    bound, _ = lagrangian_bound(np.array([-1.0]), csr_array(np.zeros((1, 1))), np.zeros(1), np.zeros(1),
                                np.zeros(1), np.zeros(1), np.array([np.inf]))
    assert bound == -(2**62)
