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

import numpy as np

from autoshard.solver.core.reduced import INF, FrozenCore

MAX_TABLE = 2_000_000
"""Largest table (entries, the eliminated node's axis included) a plan may need."""


class EliminationPlan:
    """An elimination order for a FrozenCore and the scope each eliminated node leaves behind."""

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

    def solve(self, unary: list[np.ndarray] | None = None) -> tuple[list[int], float | int]:
        """The minimising assignment and the minimum; ``unary`` (float64) replaces the node costs
        (a penalised problem), otherwise the exact int64 problem is solved."""
        comp = self.comp
        exact = unary is None
        costs = comp.costs if exact else unary
        dtype = np.int64 if exact else np.float64
        factors: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
        touching: list[set[int]] = [set() for _ in range(comp.n)]
        keys = iter(range(2**62))

        def add(scope: tuple[int, ...], table: np.ndarray) -> None:
            key = next(keys)
            factors[key] = (scope, table)
            for v in scope:
                touching[v].add(key)

        for i, c in enumerate(costs):
            add((i,), np.asarray(c, dtype=dtype) if exact else np.where(comp.costs[i] < INF, c, np.inf))
        for u, v, m in comp.edges:
            table = m if exact else np.where(m < INF, m.astype(np.float64), np.inf)
            add((u, v) if u < v else (v, u), table if u < v else table.T)
        constant: float | int = 0
        choices = []
        for v, scope in zip(self.order, self.scopes):
            joint_scope = tuple(sorted(scope + (v,)))
            shape = tuple(len(comp.costs[w]) for w in joint_scope)
            joint = np.zeros(shape, dtype=dtype)
            for key in list(touching[v]):
                fscope, table = factors.pop(key)
                for w in fscope:
                    touching[w].discard(key)
                _add_into(joint, _expand(table, fscope, joint_scope), exact)
            axis = joint_scope.index(v)
            best = np.argmin(joint, axis=axis)
            reduced = np.take_along_axis(joint, np.expand_dims(best, axis), axis=axis).squeeze(axis)
            choices.append(best)
            if scope:
                add(scope, reduced)
            else:
                constant = _add(constant, reduced.item(), exact)
        x = [0] * comp.n
        for v, scope, best in zip(reversed(self.order), reversed(self.scopes), reversed(choices)):
            x[v] = int(best[tuple(x[w] for w in scope)])
        value = constant + comp.const if exact else constant
        return x, (min(int(value), INF) if exact else float(value))


def _expand(table: np.ndarray, scope: tuple[int, ...], target: tuple[int, ...]) -> np.ndarray:
    """View ``table`` (axes in ``scope`` order, sorted) broadcastable over ``target`` (sorted)."""
    shape = [1] * len(target)
    for w, n in zip(scope, table.shape):
        shape[target.index(w)] = n
    return table.reshape(shape)


def _add(a, b, exact: bool):
    """a + b, saturated at INF in the exact (int64) case."""
    return np.minimum(a + b, INF) if exact else a + b


def _add_into(joint: np.ndarray, table: np.ndarray, exact: bool) -> None:
    """``joint`` += ``table`` (broadcast) in place, saturated at INF in the exact (int64) case:
    ``_add``'s values without a new array of the joint's size per factor."""
    np.add(joint, table, out=joint)
    if exact:
        np.minimum(joint, INF, out=joint)
