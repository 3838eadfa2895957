"""The working copy of a problem that reductions shrink, and the frozen core the solvers read.

``Core`` holds, for the nodes still undecided: the cost vector over the strategies still allowed,
which original strategy each local index stands for, the pairwise cost matrices, and the memory
*segments* (row range, usage vector) the node is responsible for on the compressed time axis (a
node that absorbed another one carries that node's memory too). Every reduction appends a
``Record`` saying how the removed node's strategy follows from the strategies of its scope, so
``Core.expand`` turns a choice for the survivors back into a choice for every original node.

Costs are int64 saturated at ``INF`` (= FORBIDDEN, 10**18): sums of two saturated values never
overflow, and anything at ``INF`` is forbidden. ``FrozenCore`` is the frozen, 0..n-1 indexed view of
what is left, with exact (Python int) cost and memory evaluation; ``FrozenCore.arrays`` is the same
core as flat arrays with offsets (core/flat_core.py), which is what the compiled (numba) loops of
the solvers take. A solve freezes its core with ``Core.hand_over``: the flat arrays become the one
copy of the core's numbers, which on a 3-D mesh are gigabytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from autoshard.solver.core.flat_core import FrozenCoreArrays, views
from autoshard.solver.model.problem import FORBIDDEN, ShardingProblem

INF = FORBIDDEN


def sat(a: np.ndarray) -> np.ndarray:
    """Clip at INF (after adding two values that were each at most INF)."""
    return np.minimum(a, INF)


def saturated(values: np.ndarray | list[int]) -> np.ndarray:
    """``values`` as a read-only int64 array clipped at INF: a view of the caller's array when it
    is int64 and already at most INF (a large model's costs are gigabytes: no copy), else a copy.
    Reductions replace arrays, never edit them, so the caller's data is never written."""
    a = np.asarray(values, dtype=np.int64)
    if a.size and a.max() > INF:
        a = sat(a)
    view = a.view()
    view.flags.writeable = False
    return view


@dataclass(frozen=True)
class Record:
    """Node ``node`` was removed; its original strategy is ``table[i_1, ..., i_k]`` where i_j is the
    position of scope node j's original strategy in ``snapshots[j]`` (its strategies back then)."""

    node: int
    scope: tuple[int, ...]
    snapshots: tuple[np.ndarray, ...]
    table: np.ndarray


@dataclass
class Segment:
    """Usage ``usage[s]`` (per local strategy) on compressed time rows [start, stop)."""

    start: int
    stop: int
    usage: np.ndarray


def local_twins(strategies: np.ndarray, twins: tuple[int, ...]) -> np.ndarray:
    """Per strategy left (``strategies``: original ids, ascending as the reductions keep them), the
    local index of its twin (``twins``: per original strategy, -1 for none), -1 where the twin is
    gone or there is none."""
    if not twins:
        return np.full(len(strategies), -1, dtype=np.int64)
    wanted = np.asarray(twins, dtype=np.int64)[strategies]
    at = np.minimum(np.searchsorted(strategies, wanted), max(len(strategies) - 1, 0))
    return np.where((wanted >= 0) & (strategies[at] == wanted), at, -1).astype(np.int64)


class Core:
    """Mutable reduction state over the original node ids (removed nodes have ``costs[v] is None``)."""

    def __init__(self, problem: ShardingProblem) -> None:
        n = problem.num_nodes
        self.num_original = n
        self.costs: list[np.ndarray | None] = [saturated(c) for c in problem.node_costs]
        every = np.arange(max((len(c) for c in problem.node_costs), default=0))
        every.flags.writeable = False
        self.strategies: list[np.ndarray] = [every[:len(c)] for c in problem.node_costs]
        self.adj: list[dict[int, np.ndarray]] = [{} for _ in range(n)]
        shared: dict[int, np.ndarray] = {}  # identical edges (repeated layers) share one matrix object
        for (u, v), m in zip(problem.edges, problem.edge_costs):
            if id(m) not in shared:
                shared[id(m)] = saturated(m)
            self.add_edge(u, v, shared[id(m)])
        self.alive: set[int] = set(range(n))
        self.const = 0
        self.records: list[Record] = []
        self.segments: list[list[Segment]] = [[] for _ in range(n)]
        self.capacity: np.ndarray | None = None
        self.row_times: np.ndarray | None = None
        self.tallies = problem.tallies

    @property
    def has_memory(self) -> bool:
        """True while a memory constraint is still in play."""
        return self.capacity is not None and any(self.segments[v] for v in self.alive)

    def k(self, v: int) -> int:
        """Number of strategies node v still has."""
        return len(self.costs[v])

    def add_edge(self, u: int, v: int, m: np.ndarray) -> None:
        """Add cost matrix m (rows: u's strategies) to edge (u, v), merging with a parallel edge."""
        old = self.adj[u].get(v)
        if old is not None:
            m = sat(old + m)
        self.adj[u][v] = m
        self.adj[v][u] = m.T

    def remove(self, v: int) -> None:
        """Drop node v and its edges (after its record has been written)."""
        for w in self.adj[v]:
            del self.adj[w][v]
        self.adj[v] = {}
        self.alive.discard(v)
        self.costs[v] = None
        self.segments[v] = []

    def restrict(self, v: int, keep: np.ndarray) -> None:
        """Keep only the strategies of v where ``keep`` is True."""
        self.costs[v] = self.costs[v][keep]
        self.strategies[v] = self.strategies[v][keep]
        for w, m in self.adj[v].items():
            m = m[keep]
            self.adj[v][w] = m
            self.adj[w][v] = m.T
        for seg in self.segments[v]:
            seg.usage = seg.usage[keep]

    def record(self, v: int, scope: tuple[int, ...], table: np.ndarray) -> None:
        """Remember that v's local strategy is ``table`` indexed by the scope's local strategies."""
        snaps = tuple(self.strategies[u] for u in scope)
        self.records.append(Record(v, scope, snaps, self.strategies[v][table]))

    def expand(self, local: dict[int, int]) -> list[int]:
        """Original strategy for every original node, from local strategies of the alive nodes."""
        choice = [-1] * self.num_original
        for v, s in local.items():
            choice[v] = int(self.strategies[v][s])
        for rec in reversed(self.records):
            idx = tuple(int(np.searchsorted(snap, choice[u])) for u, snap in zip(rec.scope, rec.snapshots))
            choice[rec.node] = int(rec.table[idx])
        return choice

    def freeze(self) -> FrozenCore:
        """The alive part as a FrozenCore (nodes renumbered 0..n-1 in increasing original id)."""
        nodes = sorted(self.alive)
        index = {v: i for i, v in enumerate(nodes)}
        edges = [(index[u], index[v], m) for u in nodes for v, m in self.adj[u].items() if u < v]
        segments = [[(s.start, s.stop, s.usage) for s in self.segments[v]] for v in nodes]
        return FrozenCore(
            nodes=nodes,
            costs=[self.costs[v] for v in nodes],
            edges=edges,
            capacity=None if self.capacity is None else self.capacity.copy(),
            segments=segments,
            const=self.const,
            tallies=self._core_tallies(index),
            toggles=[[self._twins(group, index) for group in tally.groups] for tally in self.tallies],
        )

    def hand_over(self) -> FrozenCore:
        """``freeze`` for a solve: the frozen core reads its numbers from its flat arrays
        (``FrozenCore.share_arrays``) and this Core lets go of its own costs, matrices and
        segments, keeping what ``expand`` reads (strategies, records). Measure it (``Size``)
        before: its alive nodes have no costs or edges left."""
        comp = self.freeze()
        comp.share_arrays()
        self.adj = [{} for _ in self.adj]
        self.costs = [None] * len(self.costs)
        self.segments = [[] for _ in self.segments]
        return comp

    def _twins(self, group: tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...],
               index: dict[int, int]) -> list[tuple[int, np.ndarray]]:
        """The group's alive members, each with its local strategies' twins (``Tally``; -1 where
        the twin is gone or there is none)."""
        members = []
        for node, _, twins in group:
            if node in index:
                members.append((index[node], local_twins(self.strategies[node], twins)))
        return members

    def _core_tallies(self, index: dict[int, int]) -> list[list[tuple[int, np.ndarray]]]:
        """Each tally over the alive nodes: per group, the first member still alive with its marked
        strategies as local indices (a group none of whose members is alive is decided by the
        others and left out: the count stays whole). Tallies with nothing left are dropped."""
        out = []
        for tally in self.tallies:
            picked = []
            for group in tally.groups:
                for node, marked, _ in group:
                    if node in index:
                        local = np.flatnonzero(np.isin(self.strategies[node], marked))
                        if len(local):
                            picked.append((index[node], local))
                        break
            if picked:
                out.append(picked)
        return out


@dataclass
class FrozenCore:
    """A frozen pairwise problem over nodes 0..n-1 with memory rows; what the core solvers read."""

    nodes: list[int]
    costs: list[np.ndarray]
    edges: list[tuple[int, int, np.ndarray]]
    capacity: np.ndarray | None
    segments: list[list[tuple[int, int, np.ndarray]]]
    const: int = 0
    tallies: list[list[tuple[int, np.ndarray]]] = field(default_factory=list)  # (node, marked local strategies)
    toggles: list[list[list[tuple[int, np.ndarray]]]] = field(default_factory=list)  # per tally, group: (node, twins)
    nbrs: list[list[tuple[int, np.ndarray]]] = field(init=False)

    def __post_init__(self) -> None:
        self.nbrs = [[] for _ in self.costs]
        for u, v, m in self.edges:
            self.nbrs[u].append((v, m))
            self.nbrs[v].append((u, m.T))

    def __getstate__(self) -> dict:
        """Pickled without what is derived (the neighbour lists hold a transposed copy of every
        edge matrix, ``arrays`` the whole core again): neighbourhood search sends restricted
        cores to another process (procs/call_server.py) several times a second."""
        return {k: v for k, v in self.__dict__.items() if k not in ("nbrs", "_arrays")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    @property
    def n(self) -> int:
        """Number of nodes."""
        return len(self.costs)

    @property
    def has_memory(self) -> bool:
        """True when some node has usage on a constrained row."""
        return self.capacity is not None and any(self.segments)

    @property
    def arrays(self) -> FrozenCoreArrays:
        """This core as flat arrays (built on first use, then kept)."""
        cached = self.__dict__.get("_arrays")
        if cached is None:
            cached = self.__dict__["_arrays"] = FrozenCoreArrays.of(self.costs, self.edges, self.segments)
        return cached

    def share_arrays(self) -> None:
        """Make ``arrays`` the one copy of this core's numbers: its costs, edge and neighbour
        matrices and segment usages become views into the flat arrays (equal contents, so every
        method reads the same values), and the arrays it was frozen from can be freed."""
        a = self.arrays
        self.costs = views(a.costs, a.c_off)
        self.edges = [(u, v, a.edge_matrix(e, u, v)) for e, (u, v, _) in enumerate(self.edges)]
        self.__post_init__()
        self.segments = [[(start, stop, a.seg_use[a.seg_uoff[q]:a.seg_uoff[q] + a.k(i)])
                          for q, (start, stop, _) in enumerate(row, int(a.seg_ptr[i]))]
                         for i, row in enumerate(self.segments)]

    def cost(self, x: np.ndarray | list[int]) -> int:
        """Exact total cost (Python int) including the constant of the reductions: compiled,
        in Python ints when a term is forbidden (sums of those would overflow int64)."""
        a = self.arrays
        total, exact = _cost(np.asarray(x, dtype=np.int64), *a.neighbour_args())
        if exact:
            return self.const + int(total)
        total = self.const + sum(int(c[s]) for c, s in zip(self.costs, x))
        return total + sum(int(m[x[u], x[v]]) for u, v, m in self.edges)

    def costs_given(self, i: int, x: np.ndarray) -> np.ndarray:
        """Node i's cost for each of its strategies with its neighbours at their strategies in
        ``x`` (edge prices included, saturated at INF)."""
        vec = self.costs[i]
        for j, m in self.nbrs[i]:
            vec = np.minimum(vec + m[:, x[j]], INF)
        return vec

    def profile(self, x: np.ndarray | list[int]) -> np.ndarray:
        """Usage on every row (int64) for assignment x."""
        if self.capacity is None:
            return np.zeros(0, dtype=np.int64)
        a = self.arrays
        return _profile(np.asarray(x, dtype=np.int64), len(self.capacity), *a.segment_args())

    def overflow(self, x: np.ndarray | list[int]) -> int:
        """Total usage above capacity over all rows (0 when x fits)."""
        if self.capacity is None:
            return 0
        return int(np.maximum(self.profile(x) - self.capacity, 0).sum())

    def is_feasible(self, x: np.ndarray | list[int]) -> bool:
        """True when x avoids forbidden costs and fits in memory."""
        return self.cost(x) < INF and self.overflow(x) == 0


@njit(cache=True)
def _cost(x, c_off, costs, nb_ptr, nb_other, nb_moff, nb_own, nb_their, nb_mats):  # pragma: no cover
    """Sum of x's node costs and edge costs (each edge read at its lower end), and False
    instead when a term is forbidden or the sum nears int64's range."""
    total = 0
    for i in range(len(x)):
        for p in range(nb_ptr[i] - 1, nb_ptr[i + 1]):  # the node's own cost, then its edges
            if p < nb_ptr[i]:
                term = costs[c_off[i] + x[i]]
            else:
                j = nb_other[p]
                if j < i:
                    continue
                term = nb_mats[nb_moff[p] + x[i] * nb_own[p] + x[j] * nb_their[p]]
            if term >= FORBIDDEN or term <= -FORBIDDEN:
                return 0, False
            total += term
            if total >= 2**62 or total <= -(2**62):  # one more term of at most FORBIDDEN cannot overflow
                return 0, False
    return total, True


@njit(cache=True)
def _profile(x, rows, c_off, seg_ptr, seg_start, seg_stop, seg_uoff, seg_use):  # pragma: no cover
    """Usage on each of ``rows`` rows: every segment adds its usage at x over its row range."""
    diff = np.zeros(rows + 1, dtype=np.int64)
    for i in range(len(x)):
        for q in range(seg_ptr[i], seg_ptr[i + 1]):
            use = seg_use[seg_uoff[q] + x[i]]
            diff[seg_start[q]] += use
            diff[seg_stop[q]] -= use
    return np.cumsum(diff[:-1])
