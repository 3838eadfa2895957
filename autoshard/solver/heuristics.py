"""Local search on the reduced core: the greedy warm start and the polish of Lagrangian plans.

``Search`` keeps an assignment with its exact cost and per-row memory slack:

- ``sweep`` / ``descend``: iterated conditional modes, each node to its best strategy given its
  neighbours, never breaking the memory limit once it holds (with a ``penalty``: on the
  penalised cost, memory not enforced — used to polish a Lagrangian plan);
- ``repair``: while some row overflows, take the change that frees the most memory on the worst
  row per unit of extra cost.

(Tree-shaped dynamic-programming moves were tried too and never improved a Lagrangian plan on
B, G or V, so they are not kept.)
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from autoshard.solver.core import INF, Compact


class Search:
    """An assignment of a Compact with its cost and memory slack, and moves that improve it."""

    def __init__(
        self,
        comp: Compact,
        x: np.ndarray,
        rng: np.random.Generator,
        penalty: list[np.ndarray] | None = None,
    ) -> None:
        self.comp = comp
        self.rng = rng
        self.x = np.asarray(x, dtype=np.int64).copy()
        self.penalty = penalty
        self.memory = penalty is None and comp.capacity is not None and len(comp.capacity) > 0
        self.blocks = node_blocks(comp) if self.memory else [[] for _ in comp.costs]
        self.slack = (comp.capacity - comp.profile(self.x)) if self.memory else np.zeros(0, dtype=np.int64)
        self.total = comp.cost(self.x)
        self._local: dict[int, np.ndarray] = {}  # local_costs of nodes whose neighbours did not move since

    @property
    def feasible(self) -> bool:
        """True when the assignment avoids forbidden costs and fits in memory."""
        return self.total < INF and (not self.memory or int(self.slack.min()) >= 0)

    def local_costs(self, i: int) -> np.ndarray:
        """Cost of each strategy of node i given its neighbours' current strategies (saturated);
        kept until a neighbour moves (repair asks for the same ~900 nodes of a row per move)."""
        vec = self._local.get(i)
        if vec is None:
            vec = self.comp.costs[i]
            for j, m in self.comp.nbrs[i]:
                vec = np.minimum(vec + m[:, self.x[j]], INF)
            self._local[i] = vec
        return vec

    def fits(self, i: int) -> np.ndarray:
        """Strategies of node i that keep every row within capacity (others unchanged)."""
        mask = np.ones(len(self.comp.costs[i]), dtype=bool)
        s = self.x[i]
        for start, stop, usage in self.blocks[i]:
            mask &= usage - usage[s] <= int(self.slack[start:stop].min())
        return mask

    def set(self, i: int, s: int, delta: int) -> None:
        """Move node i to strategy s, whose exact cost change is delta."""
        old = self.x[i]
        if old == s:
            return
        for start, stop, usage in self.blocks[i]:
            change = int(usage[s]) - int(usage[old])
            if change:
                self.slack[start:stop] -= change
        self.x[i] = s
        if self.total >= INF or self.total + delta >= INF:  # forbidden entries: saturated deltas are inexact
            self.total = self.comp.cost(self.x)
        else:
            self.total += delta
        for j, _ in self.comp.nbrs[i]:
            self._local.pop(j, None)

    def improve_node(self, i: int) -> bool:
        """Move node i to its best strategy that fits (on the penalised cost when there is a
        penalty); True when it moved."""
        true = self.local_costs(i)
        vec = true if self.penalty is None else np.where(true < INF, true + self.penalty[i], np.inf)
        if self.memory and self.blocks[i]:
            vec = np.where(self.fits(i), vec, INF)
        best = int(np.argmin(vec))
        s = self.x[i]
        if true[best] < INF and (true[s] >= INF or vec[best] < vec[s]):
            self.set(i, best, int(true[best]) - int(true[s]))
            return True
        return False

    def descend(self, deadline: float) -> None:
        """Best single-node moves until none helps (or the deadline passes): one pass over all
        nodes in random order, then only the neighbours of nodes that moved."""
        queue = deque(int(i) for i in self.rng.permutation(self.comp.n))
        queued = set(queue)
        while queue and time.monotonic() < deadline:
            i = queue.popleft()
            queued.discard(i)
            if self.improve_node(i):
                for j, _ in self.comp.nbrs[i]:
                    if j not in queued:
                        queued.add(j)
                        queue.append(j)

    def repair(self, deadline: float) -> bool:
        """Move nodes off overflowing rows, cheapest memory first, until the plan fits: on the
        worst row, the move of least extra cost per unit of memory freed there (the first such
        node and strategy), scored for all the row's nodes at once (S: 30x faster than node by
        node, the same moves)."""
        comp = self.comp
        owner, starts, stops = segment_index(comp)
        last = -1
        while self.memory and int(self.slack.min()) < 0 and time.monotonic() < deadline:
            row = int(np.argmin(self.slack))
            if row != last:  # the row's nodes and their usage there (moves do not change them)
                last = row
                nodes = np.unique(owner[(starts <= row) & (row < stops)])
                usage = np.concatenate([self._row_usage(int(i), row) for i in nodes])
                sizes = np.array([len(comp.costs[i]) for i in nodes])
                offsets = np.concatenate([[0], np.cumsum(sizes)])
            vec = np.concatenate([self.local_costs(int(i)) for i in nodes])
            here = np.repeat(offsets[:-1] + self.x[nodes], sizes)  # each entry's node's current strategy
            freed = usage[here] - usage
            ok = (freed > 0) & (vec < INF)
            if not ok.any():
                return False
            extra = vec.astype(np.float64) - vec[here].astype(np.float64)
            score = np.where(ok, np.maximum(extra, 0.0) / np.maximum(freed, 1), np.inf)
            j = int(np.argmin(score))
            k = int(np.searchsorted(offsets, j, side="right")) - 1
            self.set(int(nodes[k]), j - int(offsets[k]), int(vec[j]) - int(vec[here[j]]))
        return self.feasible

    def _row_usage(self, i: int, row: int) -> np.ndarray:
        """Node i's usage per strategy on ``row`` (its segments covering the row, summed)."""
        usage = np.zeros(len(self.comp.costs[i]), dtype=np.int64)
        for start, stop, u in self.comp.segments[i]:
            if start <= row < stop:
                usage += u
        return usage


def node_blocks(comp: Compact) -> list[list[tuple[int, int, np.ndarray]]]:
    """Every node's segments as disjoint row ranges (computed once per Compact)."""
    cached = comp.__dict__.get("_blocks")
    if cached is None:
        cached = comp.__dict__["_blocks"] = [_disjoint(segs) for segs in comp.segments]
    return cached


def _disjoint(segs: list[tuple[int, int, np.ndarray]]) -> list[tuple[int, int, np.ndarray]]:
    """A node's segments cut at all their ends: disjoint row ranges with the summed usage, so a
    change of strategy can be checked range by range."""
    if len(segs) < 2:
        return list(segs)
    cuts = sorted({r for start, stop, _ in segs for r in (start, stop)})
    out = []
    for a, b in zip(cuts, cuts[1:]):
        parts = [usage for start, stop, usage in segs if start <= a and b <= stop]
        if parts:
            out.append((a, b, np.sum(parts, axis=0)))
    return out


def segment_index(comp: Compact) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Owner node, first row and end row of every segment, as arrays."""
    flat = [(i, start, stop) for i, segs in enumerate(comp.segments) for start, stop, _ in segs]
    if not flat:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    arr = np.array(flat, dtype=np.int64)
    return arr[:, 0], arr[:, 1], arr[:, 2]


def memory_areas(comp: Compact) -> list[np.ndarray]:
    """Per node, each strategy's usage summed over the node's memory rows."""
    return [sum((u.astype(np.float64) * (stop - start) for start, stop, u in segs), np.zeros(len(c)))
            for c, segs in zip(comp.costs, comp.segments)]


def min_memory_start(comp: Compact) -> np.ndarray:
    """Nodes in order, each on its smallest-memory strategy (then cheapest) among those allowed
    with the neighbours already placed: fits whenever anything fits node by node, and avoids the
    forbidden pairs of a core the reductions only partly shrank (large instances, short limits)."""
    x = np.zeros(comp.n, dtype=np.int64)
    for i, (c, usage) in enumerate(zip(comp.costs, memory_areas(comp))):
        vec = c
        for j, m in comp.nbrs[i]:
            if j < i:
                vec = np.minimum(vec + m[:, x[j]], INF)
        x[i] = int(np.lexsort((vec, usage, vec >= INF))[0])
    return x
