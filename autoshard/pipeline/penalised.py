"""A part's penalised minimum at many multipliers by variable elimination, the steps no penalty
reaches run once.

Formulation. For multipliers lam = (lam_1, ..., lam_k) >= 0, one per memory row (``budget_bound.py``,
step 3), the part's problem is

    P(lam) = min_x sum_i (c_i(x_i) + sum_j lam_j r_ij(x_i)) + sum_{(u,v) in E} M_uv(x_u, x_v).

Eliminating node v (``EliminationPlan``'s steps) replaces every term that mentions v by the
table t(N(v)) = min_{x_v} (sum of those terms) and its argmin. A term is *fixed* when it does not
depend on lam: an edge's matrix; the unary term of a node whose bytes in every row are equal over
its strategies (r_ij = rho_ij: its sum_j lam_j rho_ij is added to the minimum apart, and the argmin
is unchanged);
and the table of a step all of whose terms are fixed. Fixed tables and argmins are computed at
the first multiplier; the argmins are kept, and the tables that a step depending on lam reads
(the rest are spent at the first); every multiplier recomputes only the steps a penalised term
reaches. Each step takes the minimum of the same sum as a plain elimination of the same order,
so P(lam) and its minimiser are exact (in float64; forbidden strategies at +inf).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoshard.solver.core.reduced import FrozenCore
from autoshard.solver.engines.elimination import EliminationPlan


class PenalisedElimination:
    """``comp``'s minimum plus ``lam`` times the bytes ``rows`` (per node, an array of one row of
    bytes per strategy for each multiplier; a 1-D array: one row), exactly, by ``plan``'s steps
    (the plan must be feasible), its fixed steps run once."""

    def __init__(self, comp: FrozenCore, plan: EliminationPlan, rows: Sequence[np.ndarray]) -> None:
        if not plan.feasible:
            raise ValueError("the elimination plan is not feasible: the part is too wide to eliminate")
        self.plan = plan
        self.rows = [np.atleast_2d(np.asarray(r, dtype=np.float64)) for r in rows]
        self.varying = [i for i, r in enumerate(self.rows) if r.size and (r.max(axis=1) != r.min(axis=1)).any()]
        varying = set(self.varying)
        fixed = [i not in varying for i in range(comp.n)] + [True] * len(comp.edges)
        self.offset = np.zeros(max((len(r) for r in self.rows), default=1))
        for r, flat in zip(self.rows, fixed):
            if flat and r.size:
                self.offset += r[:, 0]
        self.kept = plan.factors([np.asarray(c, dtype=np.float64) for c in comp.costs])
        self.base = {i: self.kept.pop(i) for i in self.varying}
        for step in plan.steps:
            fixed.append(all(fixed[k] for k in step.inputs))
        self.fixed = {step.output for step in plan.steps if fixed[step.output]}
        varying_steps = [step for step in plan.steps if not fixed[step.output]]
        self.read = {k for step in varying_steps for k in step.inputs if fixed[k]} | \
            {k for k in plan.sums if fixed[k]}
        self.choices: dict[int, np.ndarray] | None = None  # per fixed step's output id, its argmin

    def solve(self, lam: float | Sequence[float]) -> tuple[list[int], float]:
        """The minimiser and P(lam) (module formulation; one multiplier per row)."""
        lam = np.atleast_1d(np.asarray(lam, dtype=np.float64))
        tables = dict(self.kept)
        for i in self.varying:
            tables[i] = self.base[i] + lam @ self.rows[i]
        choices = self.plan.run(tables, exact=False, known=self.choices, keep=self.read)
        if self.choices is None:  # from now on a fixed term is needed only where a step that depends on lam reads it
            self.choices = {k: choices[k].astype(np.min_scalar_type(self.plan.sizes[step.node]))
                            for step in self.plan.steps if (k := step.output) in self.fixed}
            self.kept = {k: tables[k] for k in self.read}
        value = sum(float(tables[k]) for k in self.plan.sums)
        return self.plan.assignment(choices), value + float(lam @ self.offset)
