"""A proven lower bound from the LP relaxation of the core (HiGHS dual simplex, core/highs.py).

HiGHS's dual values y are only approximately optimal, so the bound is not HiGHS's objective but
the Lagrangian dual function evaluated at y, which is a valid bound for *any* y
(certify.py):

    L(y) = b . y + sum_j u_j * min(0, c_j - (A^T y)_j)      (A z = b, 0 <= z <= u)

computed in float64 with a safety margin (certify.safe_bound). When the LP optimum is integral it is
also a plan. On reduced cores this LP is often exact (bound = optimum).

The same y gives z3 a *reduced-cost cut* (``DualCut``): every fitting plan z satisfies

    cost(z) >= L(y) + sum_{r_j > 0} r_j z_j + sum_{r_j < 0} |r_j| (1 - z_j)

so "L + sum floor(|r_j|) * literal_j <= B - 1" is implied by "cost <= B - 1". It is redundant but
gives z3 the LP's reasoning, without which z3 does not prove even small cores optimal (measured:
see benchmarks/README.md, "Measurements behind the design").
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from autoshard.solver.core.reduced import FrozenCore
from autoshard.solver.core.dual_cut import DualCut
from autoshard.solver.core.certify import lagrangian_bound
from autoshard.solver.core.highs import LpModel, solve_lp
from autoshard.solver.core.ilp import linearise

MAX_COLUMNS = 200_000
"""Cores whose LP has more variables are not relaxed (HiGHS would need minutes)."""


@dataclass(frozen=True)
class Relaxation:
    """A proven lower bound (or None), the LP's plan when it was integral, and the dual cut."""

    bound: int | None
    plan: list[int] | None
    elapsed: float
    cut: DualCut | None = None
    infeasible: bool = False


def lp_columns(comp: FrozenCore) -> int:
    """Variables of the linearised ILP: one per strategy and one per edge-matrix entry."""
    return sum(len(c) for c in comp.costs) + sum(m.size for _, _, m in comp.edges)


def lp_bound(comp: FrozenCore, time_limit: float) -> Relaxation:
    """Solve the LP relaxation within ``time_limit`` seconds and certify its bound."""
    start = time.monotonic()
    if comp.capacity is not None and len(comp.capacity) and int(comp.capacity.min()) < 0:
        return Relaxation(None, None, 0.0, infeasible=True)  # unavoidable usage over the limit
    if lp_columns(comp) > MAX_COLUMNS or time_limit <= 0:
        return Relaxation(None, None, 0.0)
    lin = linearise(comp)
    left = time_limit - (time.monotonic() - start)
    if left < 0.2:
        return Relaxation(None, None, time.monotonic() - start)
    answer = solve_lp(LpModel(lin.c, lin.a_eq, lin.b_eq, lin.b_eq, np.zeros(lin.columns), lin.upper), left)
    if answer.status == "infeasible":  # the relaxation has no solution, so neither has the problem
        return Relaxation(None, None, time.monotonic() - start, infeasible=True)
    if answer.status != "optimal" or answer.duals is None:
        return Relaxation(None, None, time.monotonic() - start)
    bound, reduced = lagrangian_bound(lin.c, lin.a_eq, answer.duals, lin.b_eq, lin.b_eq, np.zeros(lin.columns),
                                      lin.upper, comp.const)
    z = answer.x[: lin.nx]
    plan = None
    blocks = [z[lin.offsets[i] : lin.offsets[i + 1]] for i in range(comp.n)]
    if all(b.max() > 1 - 1e-6 for b in blocks):
        plan = lin.choice(answer.x)
    return Relaxation(bound, plan, time.monotonic() - start, _cut(comp, lin, reduced, bound))


def _cut(comp: FrozenCore, lin, reduced: np.ndarray, bound: int) -> DualCut:
    """The reduced-cost cut: integer weights floor(|r_j|) on the columns that can raise the cost."""
    weights = np.floor(np.abs(np.where(lin.upper > 0, reduced, 0.0))).astype(np.int64)
    positive = reduced > 0
    node_terms = []
    for i in range(comp.n):
        for s in range(len(comp.costs[i])):
            j = int(lin.offsets[i]) + s
            if weights[j] > 0:
                node_terms.append((i, s, int(weights[j]), bool(positive[j])))
    pair_terms = []
    col = lin.nx
    for e, (_, _, m) in enumerate(comp.edges):
        ku, kv = m.shape
        block = weights[col : col + ku * kv].reshape(ku, kv)
        for s, t in zip(*np.nonzero(block)):
            pair_terms.append((e, int(s), int(t), int(block[s, t]), bool(positive[col + s * kv + t])))
        col += ku * kv
    return DualCut(bound, node_terms, pair_terms)
