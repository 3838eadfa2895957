"""A part's penalised minimum at many multipliers by variable elimination, the steps no penalty
reaches run once.

Formulation. For a multiplier lam >= 0 the part's problem (``budget_bound.py``, step 3) is

    P(lam) = min_x sum_i (c_i(x_i) + lam r_i(x_i)) + sum_{(u,v) in E} M_uv(x_u, x_v).

Eliminating node v (in ``EliminationPlan``'s order) replaces every term that mentions v by the
table t(N(v)) = min_{x_v} (sum of those terms) and its argmin. A term is *fixed* when it does not
depend on lam: an edge's matrix; the unary term of a node whose bytes are equal over its
strategies (r_i = rho_i: its lam rho_i is added to the minimum apart, and the argmin is unchanged);
and the table of a step all of whose terms are fixed. Fixed tables and argmins are computed at
the first multiplier; the argmins are kept, and the tables that a step depending on lam reads
(the rest are spent at the first); every multiplier recomputes only the steps a penalised term
reaches. Each step takes the minimum of the same sum as a plain elimination of the same order,
so P(lam) and its minimiser are exact (in float64; forbidden strategies at +inf).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from autoshard.solver.core.reduced import INF, FrozenCore
from autoshard.solver.engines.elimination import EliminationPlan


@dataclass(frozen=True)
class Step:
    """Eliminating ``node``: the terms ``inputs`` (ids) over ``joint`` (sorted node ids) are summed
    and minimised over ``node``, leaving the term ``output`` over ``scope``; ``fixed``: no input
    depends on the multiplier."""

    node: int
    scope: tuple[int, ...]
    joint: tuple[int, ...]
    inputs: tuple[int, ...]
    output: int
    fixed: bool


class PenalisedElimination:
    """``comp``'s minimum plus ``lam`` times the bytes ``row`` (per node and strategy), exactly,
    by ``plan``'s elimination order (which must be feasible), reusing its fixed steps."""

    def __init__(self, comp: FrozenCore, plan: EliminationPlan, row: Sequence[np.ndarray]) -> None:
        if not plan.feasible:
            raise ValueError("the elimination plan is not feasible: the part is too wide to eliminate")
        self.sizes = [len(c) for c in comp.costs]
        self.row = [np.asarray(r, dtype=np.float64) for r in row]
        self.varying = [i for i, r in enumerate(self.row) if r.size and r.max() != r.min()]
        fixed = [i not in set(self.varying) for i in range(comp.n)]
        self.offset = sum(float(r[0]) for r, flat in zip(self.row, fixed) if flat and r.size)
        base = [np.where(c < INF, c.astype(np.float64), np.inf) for c in comp.costs]
        self.base = {i: base[i] for i in self.varying}
        scopes: list[tuple[int, ...]] = [(i,) for i in range(comp.n)]
        self.kept: dict[int, np.ndarray] = {i: base[i] for i in range(comp.n) if fixed[i]}
        for u, v, m in comp.edges:
            table = np.where(m < INF, m.astype(np.float64), np.inf)
            self.kept[len(scopes)] = table if u < v else table.T
            scopes.append((u, v) if u < v else (v, u))
            fixed.append(True)
        touching: list[set[int]] = [set() for _ in range(comp.n)]
        for k, scope in enumerate(scopes):
            for w in scope:
                touching[w].add(k)
        self.steps: list[Step] = []
        for v, scope in zip(plan.order, plan.scopes):
            inputs = tuple(sorted(touching[v]))
            for k in inputs:
                for w in scopes[k]:
                    touching[w].discard(k)
            step = Step(v, scope, tuple(sorted(scope + (v,))), inputs, len(scopes), all(fixed[k] for k in inputs))
            self.steps.append(step)
            scopes.append(scope)
            fixed.append(step.fixed)
            for w in scope:
                touching[w].add(step.output)
        self.scopes = scopes
        self.read = {k for step in self.steps if not step.fixed for k in step.inputs}
        self.sums = [step.output for step in self.steps if not step.scope]  # one per connected component
        self.choices: dict[int, np.ndarray] = {}  # per fixed step (by output id), its argmin

    def solve(self, lam: float) -> tuple[list[int], float]:
        """The minimiser and P(lam) (module formulation)."""
        tables = dict(self.kept)
        for i in self.varying:
            tables[i] = self.base[i] + lam * self.row[i]
        choices: dict[int, np.ndarray] = {}
        for step in self.steps:
            if step.fixed and step.output in self.choices:
                choices[step.output] = self.choices[step.output]
                continue
            joint = np.zeros(tuple(self.sizes[w] for w in step.joint))
            for k in step.inputs:
                np.add(joint, self._expand(tables[k], self.scopes[k], step.joint), out=joint)
            axis = step.joint.index(step.node)
            best = np.argmin(joint, axis=axis)
            tables[step.output] = np.take_along_axis(joint, np.expand_dims(best, axis), axis=axis).squeeze(axis)
            choices[step.output] = best
            if step.fixed:
                self.choices[step.output] = best.astype(np.min_scalar_type(self.sizes[step.node]))
                self.kept[step.output] = tables[step.output]
        # past the first multiplier a fixed term is needed only where a step that depends on lam reads it
        self.kept = {k: t for k, t in self.kept.items() if k in self.read or k in self.sums}
        x = [0] * len(self.sizes)
        for step in reversed(self.steps):
            x[step.node] = int(choices[step.output][tuple(x[w] for w in step.scope)])
        value = sum(float(tables[k]) for k in self.sums)
        return x, value + lam * self.offset

    def _expand(self, table: np.ndarray, scope: tuple[int, ...], target: tuple[int, ...]) -> np.ndarray:
        """``table`` (axes in ``scope`` order) viewed broadcastable over ``target``."""
        shape = [1] * len(target)
        for w in scope:
            shape[target.index(w)] = self.sizes[w]
        return table.reshape(shape)
