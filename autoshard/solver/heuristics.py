"""Fast plans for the warm start: memory-aware local search on the reduced core.

``Search`` keeps an assignment with its exact cost and per-row memory slack, and improves it
with moves that never break the memory limit once it holds:

- ``sweep``: iterated conditional modes, each node to its best strategy given its neighbours;
- ``tree_move``: a breadth-first tree of up to ``size`` nodes re-optimised jointly by dynamic
  programming (edges leaving the tree are conditioned on the current plan, edges inside it but
  off the tree are re-checked exactly before the move is accepted);
- ``repair``: while some row overflows, take the change that frees the most memory on the worst
  row per unit of extra cost.
"""

from __future__ import annotations

import time

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
        self.slack = (comp.capacity - comp.profile(self.x)) if self.memory else np.zeros(0, dtype=np.int64)
        self.total = comp.cost(self.x)

    @property
    def feasible(self) -> bool:
        """True when the assignment avoids forbidden costs and fits in memory."""
        return self.total < INF and (not self.memory or int(self.slack.min()) >= 0)

    def local_costs(self, i: int) -> np.ndarray:
        """Cost of each strategy of node i given its neighbours' current strategies (saturated)."""
        vec = self.comp.costs[i]
        for j, m in self.comp.nbrs[i]:
            vec = np.minimum(vec + m[:, self.x[j]], INF)
        return vec

    def fits(self, i: int) -> np.ndarray:
        """Strategies of node i that keep every row within capacity (others unchanged)."""
        mask = np.ones(len(self.comp.costs[i]), dtype=bool)
        s = self.x[i]
        for start, stop, usage in self.comp.segments[i]:
            mask &= usage - usage[s] <= int(self.slack[start:stop].min())
        return mask

    def set(self, i: int, s: int, delta: int) -> None:
        """Move node i to strategy s, whose exact cost change is delta."""
        old = self.x[i]
        if old == s:
            return
        for start, stop, usage in self.comp.segments[i]:
            change = int(usage[s]) - int(usage[old])
            if change:
                self.slack[start:stop] -= change
        self.x[i] = s
        self.total += delta

    def sweep(self, order: np.ndarray | None = None) -> int:
        """One pass of best single-node moves that fit (on the penalised cost when there is a
        penalty); returns the number of moves made."""
        moves = 0
        for i in self.rng.permutation(self.comp.n) if order is None else order:
            true = self.local_costs(i)
            vec = true if self.penalty is None else np.where(true < INF, true + self.penalty[i], np.inf)
            if self.memory and self.comp.segments[i]:
                vec = np.where(self.fits(i), vec, INF)
            best = int(np.argmin(vec))
            s = self.x[i]
            if true[best] < INF and (true[s] >= INF or vec[best] < vec[s]):
                self.set(i, best, int(true[best]) - int(true[s]))
                moves += 1
        return moves

    def descend(self, deadline: float) -> None:
        """Sweep until no single move helps or the deadline passes."""
        while time.monotonic() < deadline and self.sweep():
            pass

    def tree_move(self, root: int, size: int) -> bool:
        """Re-optimise a BFS tree of up to ``size`` nodes around root; True when the plan improved."""
        comp = self.comp
        order, parent = [root], {root: -1}
        for i in order:
            for j, _ in comp.nbrs[i]:
                if j not in parent and len(order) < size:
                    parent[j] = i
                    order.append(j)
        if len(order) < 2:
            return False
        inside = set(order)
        if self.memory:
            for i in order:
                self._release(i)
        unary = {}
        for i in order:
            vec = comp.costs[i]
            for j, m in comp.nbrs[i]:
                if j not in inside or (parent[i] != j and parent.get(j) != i):
                    vec = np.minimum(vec + m[:, self.x[j]], INF)
            if self.memory and comp.segments[i]:
                vec = np.where(self._fits_free(i), vec, INF)
            unary[i] = vec
        edge = {}
        for i in order:
            for j, m in comp.nbrs[i]:
                if parent.get(j) == i:
                    edge[j] = m  # rows: parent i, columns: child j
        best_child = {}
        for j in reversed(order[1:]):
            t = np.minimum(edge[j] + unary[j][None, :], INF)
            arg = np.argmin(t, axis=1)
            best_child[j] = arg
            p = parent[j]
            unary[p] = np.minimum(unary[p] + t[np.arange(len(arg)), arg], INF)
        new = {root: int(np.argmin(unary[root]))}
        for j in order[1:]:
            new[j] = int(best_child[j][new[parent[j]]])
        old = {i: int(self.x[i]) for i in order}
        if self.memory:
            for i in order:
                self._claim(i, old[i])
        if new == old:
            return False
        delta = self._delta(order, new)
        if delta >= 0 or not self._fits_jointly(order, new):
            return False
        for i in order:
            self.set(i, new[i], 0)
        self.total += delta
        return True

    def _release(self, i: int) -> None:
        for start, stop, usage in self.comp.segments[i]:
            self.slack[start:stop] += int(usage[self.x[i]])

    def _claim(self, i: int, s: int) -> None:
        for start, stop, usage in self.comp.segments[i]:
            self.slack[start:stop] -= int(usage[s])

    def _fits_free(self, i: int) -> np.ndarray:
        mask = np.ones(len(self.comp.costs[i]), dtype=bool)
        for start, stop, usage in self.comp.segments[i]:
            mask &= usage <= int(self.slack[start:stop].min())
        return mask

    def _delta(self, nodes: list[int], new: dict[int, int]) -> int:
        """Exact cost change of moving ``nodes`` to ``new`` (Python ints)."""
        comp, x = self.comp, self.x
        delta = 0
        for i in nodes:
            delta += int(comp.costs[i][new[i]]) - int(comp.costs[i][x[i]])
            for j, m in comp.nbrs[i]:
                if j in new:
                    if i < j:
                        delta += int(m[new[i], new[j]]) - int(m[x[i], x[j]])
                else:
                    delta += int(m[new[i], x[j]]) - int(m[x[i], x[j]])
        return delta

    def _fits_jointly(self, nodes: list[int], new: dict[int, int]) -> bool:
        """True when moving all ``nodes`` together keeps every row within capacity."""
        if not self.memory:
            return True
        diff = np.zeros(len(self.slack) + 1, dtype=np.int64)
        touched = False
        for i in nodes:
            for start, stop, usage in self.comp.segments[i]:
                change = int(usage[new[i]]) - int(usage[self.x[i]])
                if change:
                    diff[start] += change
                    diff[stop] -= change
                    touched = True
        return not touched or bool((np.cumsum(diff[:-1]) <= self.slack).all())

    def repair(self, deadline: float) -> bool:
        """Move nodes off overflowing rows, cheapest memory first, until the plan fits."""
        comp = self.comp
        owner, starts, stops = _segment_index(comp)
        while self.memory and int(self.slack.min()) < 0 and time.monotonic() < deadline:
            row = int(np.argmin(self.slack))
            best = None
            for i in np.unique(owner[(starts <= row) & (row < stops)]):
                vec = self.local_costs(i)
                freed = np.zeros(len(vec), dtype=np.int64)
                for start, stop, usage in comp.segments[i]:
                    if start <= row < stop:
                        freed += int(usage[self.x[i]]) - usage
                extra = vec.astype(np.float64) - float(vec[self.x[i]])
                ok = (freed > 0) & (vec < INF)
                if not ok.any():
                    continue
                score = np.where(ok, np.maximum(extra, 0.0) / np.maximum(freed, 1), np.inf)
                s = int(np.argmin(score))
                if best is None or score[s] < best[0]:
                    best = (float(score[s]), int(i), s, int(vec[s]) - int(vec[self.x[i]]))
            if best is None:
                return False
            _, i, s, delta = best
            self.set(i, s, delta)
        return self.feasible


def _segment_index(comp: Compact) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Owner node, first row and end row of every segment, as arrays."""
    flat = [(i, start, stop) for i, segs in enumerate(comp.segments) for start, stop, _ in segs]
    if not flat:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    arr = np.array(flat, dtype=np.int64)
    return arr[:, 0], arr[:, 1], arr[:, 2]


def min_memory_start(comp: Compact) -> np.ndarray:
    """Each node on its smallest-memory strategy (then cheapest): fits whenever anything fits
    node by node."""
    x = np.zeros(comp.n, dtype=np.int64)
    for i, (c, segs) in enumerate(zip(comp.costs, comp.segments)):
        usage = sum((u.astype(np.float64) * (stop - start) for start, stop, u in segs), np.zeros(len(c)))
        key = np.lexsort((c, usage))
        x[i] = int(key[0])
    return x


def cheapest_start(comp: Compact) -> np.ndarray:
    """Each node on its cheapest strategy, ignoring edges and memory."""
    return np.array([int(np.argmin(c)) for c in comp.costs], dtype=np.int64)


def improve(search: Search, deadline: float, tree_size: int = 60) -> None:
    """Alternate single-node sweeps and random tree moves until the deadline."""
    search.descend(deadline)
    n = search.comp.n
    stale = 0
    while time.monotonic() < deadline and stale < 3 * n:
        root = int(search.rng.integers(n))
        size = int(search.rng.integers(2, tree_size + 1))
        if search.tree_move(root, size):
            stale = 0
        else:
            stale += 1
