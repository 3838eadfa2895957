"""Local search on the reduced core: the greedy warm start and the polish of Lagrangian plans.

``Search`` keeps an assignment with its exact cost and per-row memory slack:

- ``descend``: iterated conditional modes, each node to its best strategy given its
  neighbours, never breaking the memory limit once it holds (with a ``penalty``: on the
  penalised cost, memory not enforced — used to polish a Lagrangian plan); its loop is compiled
  by numba over the core's flat arrays (``FrozenCore.arrays``, ``FlatBlocks``);
- ``repair``: while some row overflows, take the change that frees the most memory on the worst
  row per unit of extra cost.

(Tree-shaped dynamic-programming moves are not used: see benchmarks/README.md, "Tried and
dropped".)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numba import njit

from autoshard.solver.core.flat_core import offsets
from autoshard.solver.core.pool import vector_pool
from autoshard.solver.core.reduced import INF, FrozenCore


VISITS = 4096
"""Node visits per compiled call of ``descend``: the deadline is checked between calls."""


class Search:
    """An assignment of a FrozenCore with its cost and memory slack, and moves that improve it."""

    def __init__(
        self,
        comp: FrozenCore,
        x: np.ndarray,
        rng: np.random.Generator,
        penalty: np.ndarray | None = None,
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
            vec = self._local[i] = self.comp.costs_given(i, self.x)
        return vec

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

    def descend(self, deadline: float) -> None:
        """Best single-node moves until none helps (or the deadline passes): one pass over all
        nodes in random order, then only the neighbours of nodes that moved. Each node goes to
        its best strategy given its neighbours (on the penalised cost when there is a penalty)
        among those that keep every row within capacity; compiled (``_descend``), an order of
        magnitude faster than numpy (measured: see benchmarks/README.md, "Solver throughput")."""
        comp, n, a = self.comp, self.comp.n, self.comp.arrays
        blocks = flat_blocks(comp).blocks if self.memory else flat_blocks(comp).none
        pen = self.penalty if self.penalty is not None else np.zeros(0)
        queue = self.rng.permutation(n).astype(np.int64)
        queued = np.ones(n, dtype=np.bool_)
        head, count = 0, n
        total = min(self.total, INF)
        moved = saturated = False
        while count and time.monotonic() < deadline:
            head, count, total, saturated_now, moved_now = _descend(
                self.x, self.slack, queue, queued, head, count, VISITS, total, a.widest,
                *a.neighbour_args(), *blocks, pen, self.penalty is not None, INF)
            saturated, moved = saturated or saturated_now, moved or moved_now
        if moved:
            self._local.clear()
            self.total = comp.cost(self.x) if saturated or self.total >= INF else int(total)

    def repair(self, deadline: float) -> bool:
        """Move nodes off overflowing rows, cheapest memory first, until the plan fits: on the
        worst row, the move of least extra cost per unit of memory freed there (the first such
        node and strategy), scored for all the row's nodes at once (the same moves as node by
        node, much faster; measured: see benchmarks/README.md, "Solver throughput")."""
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


def node_blocks(comp: FrozenCore) -> list[list[tuple[int, int, np.ndarray]]]:
    """Every node's segments as disjoint row ranges (computed once per FrozenCore)."""
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


def segment_index(comp: FrozenCore) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Owner node, first row and end row of every segment, as arrays."""
    flat = [(i, start, stop) for i, segs in enumerate(comp.segments) for start, stop, _ in segs]
    if not flat:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    arr = np.array(flat, dtype=np.int64)
    return arr[:, 0], arr[:, 1], arr[:, 2]


def memory_areas(comp: FrozenCore) -> list[np.ndarray]:
    """Per node, each strategy's usage summed over the node's memory rows."""
    return [sum((u.astype(np.float64) * (stop - start) for start, stop, u in segs), np.zeros(len(c)))
            for c, segs in zip(comp.costs, comp.segments)]


def min_memory_start(comp: FrozenCore) -> np.ndarray:
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


@dataclass
class FlatBlocks:
    """Every node's disjoint memory blocks (``node_blocks``) flat, for the compiled descent:
    block b covers rows ``start[b]..stop[b]`` with usage ``use[uoff[b]:]``, node i's blocks
    being ``ptr[i]..ptr[i+1]``; ``none`` is the same with no blocks (memory unchecked)."""

    blocks: tuple[np.ndarray, ...]  # ptr, start, stop, uoff, use
    none: tuple[np.ndarray, ...]


def flat_blocks(comp: FrozenCore) -> FlatBlocks:
    """``comp``'s FlatBlocks (built once per FrozenCore, like ``node_blocks``)."""
    cached = comp.__dict__.get("_flat_blocks")
    if cached is None:
        per_node = node_blocks(comp)
        blocks = [b for row in per_node for b in row]
        empty = np.zeros(0, dtype=np.int64)
        use, uoff = vector_pool([use for _, _, use in blocks])  # repeated layers' blocks stored once
        cached = comp.__dict__["_flat_blocks"] = FlatBlocks(
            (offsets([len(row) for row in per_node]),
             np.array([start for start, _, _ in blocks], dtype=np.int64),
             np.array([stop for _, stop, _ in blocks], dtype=np.int64),
             uoff,
             use),
            (np.zeros(comp.n + 1, dtype=np.int64), empty, empty, empty, empty),
        )
    return cached


@njit(cache=True)
def _descend(x, slack, queue, queued, head, count, visits, total, widest,
             c_off, costs, nb_ptr, nb_other, nb_moff, nb_own, nb_their, nb_mats,
             blk_ptr, blk_start, blk_stop, blk_uoff, blk_use, pen, use_pen, inf):  # pragma: no cover
    """Up to ``visits`` nodes off the FIFO ring ``queue`` (``head``, ``count``; ``queued`` marks
    its members): each to its best strategy that keeps every row within ``slack``, its
    neighbours queued when it moves; ``x``, ``slack``, the queue updated in place. The local
    cost of strategy s of node i is c_i(s) + sum_j m_ij(s, x_j), saturated at ``inf``; with
    ``use_pen`` the choice is on that plus ``pen`` (memory unchecked: no blocks then).
    ``widest``: the most strategies of a node. Returns the ring's head and count, the total
    moved by the exact deltas, whether a move touched saturated costs (the total must then be
    recomputed), and whether anything moved."""
    n = len(x)
    local = np.empty(widest, dtype=np.int64)
    vec_int = np.empty(widest, dtype=np.int64)
    vec_pen = np.empty(widest)
    saturated = moved = False
    done = 0
    while count > 0 and done < visits:
        i = queue[head]
        head = (head + 1) % n
        count -= 1
        queued[i] = False
        done += 1
        a, k, now = c_off[i], c_off[i + 1] - c_off[i], x[i]
        for s in range(k):
            local[s] = costs[a + s]
        for p in range(nb_ptr[i], nb_ptr[i + 1]):
            j = nb_other[p]
            step, base = nb_own[p], nb_moff[p] + x[j] * nb_their[p]
            for s in range(k):
                value = local[s] + nb_mats[base + s * step]
                local[s] = value if value < inf else inf
        for s in range(k):
            vec_int[s] = local[s]
            if use_pen:
                vec_pen[s] = local[s] + pen[a + s] if local[s] < inf else np.inf
        for b in range(blk_ptr[i], blk_ptr[i + 1]):
            room = slack[blk_start[b]]
            for r in range(blk_start[b] + 1, blk_stop[b]):
                room = min(room, slack[r])
            u = blk_uoff[b]
            for s in range(k):
                if blk_use[u + s] - blk_use[u + now] > room:
                    vec_int[s] = inf
        best = 0
        for s in range(1, k):
            if (vec_pen[s] < vec_pen[best]) if use_pen else (vec_int[s] < vec_int[best]):
                best = s
        better = (vec_pen[best] < vec_pen[now]) if use_pen else (vec_int[best] < vec_int[now])
        if best == now or local[best] >= inf or not (local[now] >= inf or better):
            continue
        for b in range(blk_ptr[i], blk_ptr[i + 1]):
            u = blk_uoff[b]
            change = blk_use[u + best] - blk_use[u + now]
            for r in range(blk_start[b], blk_stop[b]):
                slack[r] -= change
        delta = local[best] - local[now]
        if total >= inf or total + delta >= inf:
            saturated = True
        else:
            total += delta
        x[i] = best
        moved = True
        for p in range(nb_ptr[i], nb_ptr[i + 1]):
            j = nb_other[p]
            if not queued[j]:
                queued[j] = True
                queue[(head + count) % n] = j
                count += 1
    return head, count, total, saturated, moved
