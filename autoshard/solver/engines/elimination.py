"""Exact minimisation by variable (bucket) elimination — non-serial dynamic programming.

    min_x sum_i c_i(x_i) + sum_e m_e(x_u, x_v)

Eliminating node v replaces every cost term that mentions v by one table over v's neighbours,
``t(N(v)) = min_{x_v} sum of those terms``, and remembers the argmin so x_v can be recovered once
its neighbours are decided (a generalisation of the degree-1/2 reductions to any degree). The
order is greedy, smallest table first; ``EliminationPlan`` works it out symbolically and refuses
(``feasible`` is False) when some table would exceed ``max_table`` entries, so a plan is cheap to
try. Model graphs have small treewidth: a 1200-node forward+backward ladder is solved exactly in
about a second where TRW-S left a 5% gap.

``solve`` runs the numbers: exactly in saturated int64 for the problem itself (the result is the
proved optimum), or in float64 for a Lagrangian-penalised problem (lagrangian.py), where the
minimum is then an exact Lagrangian bound.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass
from typing import Collection, Mapping

import numpy as np

from autoshard.solver.core.reduced import INF, FrozenCore

MAX_TABLE = 2_000_000
"""Largest table (entries, the eliminated node's axis included) a plan may need."""


@dataclass(frozen=True)
class Step:
    """Eliminating ``node``: the factors ``inputs`` (ids) over ``joint`` (sorted node ids) are
    summed and minimised over ``node``, leaving the factor ``output`` over ``scope``."""

    node: int
    scope: tuple[int, ...]
    joint: tuple[int, ...]
    inputs: tuple[int, ...]
    output: int


class EliminationPlan:
    """An elimination order for a FrozenCore and the scope each eliminated node leaves behind;
    where feasible, its ``steps`` over the factors: node i's costs are factor i, edge k's matrix
    factor n + k (axes in node order), each step's output the next id (``scopes_of``)."""

    def __init__(self, comp: FrozenCore, max_table: int = MAX_TABLE, deadline: float | None = None) -> None:
        self.comp = comp
        size = [len(c) for c in comp.costs]
        adj: list[set[int]] = [set() for _ in range(comp.n)]
        for u, v, _ in comp.edges:
            adj[u].add(v)
            adj[v].add(u)
        self.order: list[int] = []
        self.scopes: list[tuple[int, ...]] = []
        self.feasible = True
        self.largest = 0
        self.sizes = size
        self.steps: list[Step] = []
        self.scopes_of: list[tuple[int, ...]] = []
        self.sums: list[int] = []  # the outputs of empty scope: one per connected component

        def weight(v: int) -> int:
            return math.prod(size[w] for w in adj[v]) * size[v]

        heap = [(weight(v), v) for v in range(comp.n)]
        heapq.heapify(heap)
        done = [False] * comp.n
        while heap:
            w, v = heapq.heappop(heap)
            if done[v] or w != weight(v):
                continue
            if w > max_table or (deadline is not None and time.monotonic() > deadline):
                self.feasible = False
                return
            done[v] = True
            self.largest = max(self.largest, w)
            nbrs = adj[v]
            for a in nbrs:
                adj[a].discard(v)
                adj[a].update(nbrs - {a})
            self.order.append(v)
            self.scopes.append(tuple(sorted(nbrs)))
            for a in nbrs:
                heapq.heappush(heap, (weight(a), a))
            adj[v] = set()
        self.steps, self.scopes_of = _steps(comp, self.order, self.scopes)
        self.sums = [step.output for step in self.steps if not step.scope]

    def factors(self, unary: list[np.ndarray] | None = None) -> dict[int, np.ndarray]:
        """The problem's factors by id: int64 as they are, or (``unary`` replacing the node costs: a
        penalised problem) float64 with forbidden entries at +inf."""
        comp = self.comp
        if unary is None:
            tables = {i: np.asarray(c, dtype=np.int64) for i, c in enumerate(comp.costs)}
        else:
            tables = {i: np.where(comp.costs[i] < INF, c, np.inf) for i, c in enumerate(unary)}
        for k, (u, v, m) in enumerate(comp.edges):
            table = m if unary is None else np.where(m < INF, m.astype(np.float64), np.inf)
            tables[comp.n + k] = table if u < v else table.T
        return tables

    def run(self, tables: dict[int, np.ndarray], exact: bool, known: Mapping[int, np.ndarray] | None = None,
            keep: Collection[int] = ()) -> dict[int, np.ndarray]:
        """Every step's argmin table by output id. Each step sums its input factors (removed from
        ``tables`` once read, unless in ``keep``) and adds its output; saturated at INF in int64
        where ``exact``. A step whose output is in ``known`` (its argmin) is not run: its output
        must then already be in ``tables`` where a later step reads it."""
        choices: dict[int, np.ndarray] = {}
        dtype = np.int64 if exact else np.float64
        for step in self.steps:
            if known is not None and step.output in known:
                choices[step.output] = known[step.output]
                continue
            joint = np.zeros(tuple(self.sizes[w] for w in step.joint), dtype=dtype)
            for k in step.inputs:
                table = tables[k] if k in keep else tables.pop(k)
                np.add(joint, _expand(table, self.scopes_of[k], step.joint), out=joint)
                if exact:
                    np.minimum(joint, INF, out=joint)
            axis = step.joint.index(step.node)
            best = np.argmin(joint, axis=axis)
            tables[step.output] = np.take_along_axis(joint, np.expand_dims(best, axis), axis=axis).squeeze(axis)
            choices[step.output] = best
        return choices

    def assignment(self, choices: Mapping[int, np.ndarray]) -> list[int]:
        """The minimiser: each node's argmin read at its scope's decided strategies, last step first."""
        x = [0] * self.comp.n
        for step in reversed(self.steps):
            x[step.node] = int(choices[step.output][tuple(x[w] for w in step.scope)])
        return x

    def solve(self, unary: list[np.ndarray] | None = None) -> tuple[list[int], float | int]:
        """The minimising assignment and the minimum; ``unary`` (float64) replaces the node costs
        (a penalised problem), otherwise the exact int64 problem is solved."""
        exact = unary is None
        tables = self.factors(unary)
        x = self.assignment(self.run(tables, exact))
        if exact:
            value = self.comp.const
            for k in self.sums:
                value = min(value + int(tables[k]), INF)
            return x, value
        return x, float(sum(float(tables[k]) for k in self.sums))


def _steps(comp: FrozenCore, order: list[int], scopes: list[tuple[int, ...]]
           ) -> tuple[list[Step], list[tuple[int, ...]]]:
    """The steps of eliminating ``order`` (each node leaving its scope) and every factor's scope by id."""
    factor_scopes: list[tuple[int, ...]] = [(i,) for i in range(comp.n)]
    factor_scopes += [(u, v) if u < v else (v, u) for u, v, _ in comp.edges]
    touching: list[set[int]] = [set() for _ in range(comp.n)]
    for k, scope in enumerate(factor_scopes):
        for w in scope:
            touching[w].add(k)
    steps = []
    for v, scope in zip(order, scopes):
        inputs = tuple(sorted(touching[v]))
        for k in inputs:
            for w in factor_scopes[k]:
                touching[w].discard(k)
        steps.append(Step(v, scope, tuple(sorted(scope + (v,))), inputs, len(factor_scopes)))
        factor_scopes.append(scope)
        for w in scope:
            touching[w].add(steps[-1].output)
    return steps, factor_scopes


def _expand(table: np.ndarray, scope: tuple[int, ...], target: tuple[int, ...]) -> np.ndarray:
    """View ``table`` (axes in ``scope`` order, sorted) broadcastable over ``target`` (sorted)."""
    shape = [1] * len(target)
    for w, n in zip(scope, table.shape):
        shape[target.index(w)] = n
    return table.reshape(shape)
