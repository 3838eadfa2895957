"""Exact reductions: shrink a Core without changing its optimum; each one is undone by expand().

Applied to a fixpoint by ``reduce_core`` (``step`` handles one node):

- forbidden strategies: cost INF, or no allowed partner on some edge (arc consistency);
- dominated strategies: a is dropped when some b is never worse, whatever the neighbours pick,
  and (memory) b uses no more memory than a in every segment (``prune_dominated``);
- slack: strategies whose usage alone exceeds a row's capacity (``memory.prune_by_slack``);
- separable edges m[s,t] = a[s] + b[t] move into the node costs;
- single-strategy folding: the node's costs and edges fold into its neighbours;
- functional merging: when every strategy of v allows exactly one strategy of w, w is a function
  of v and is merged into v (its costs, edges and memory segments move to v: exact with memory);
- degree 0/1/2 elimination of memory-free nodes with min-plus edge merging (PBQP R0/R1/R2),
  parallel edges merging in ``Core.add_edge``.
Nodes that still carry memory segments are never eliminated by min-plus (their choice must stay
visible to the memory constraint); ``memory.compress_rows`` frees nodes whose rows can never
overflow, and ``memory.drop_dominated_rows`` those whose rows other rows imply.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
from numba import njit

from autoshard.solver.core.pool import digest
from autoshard.solver.core.reduced import INF, Core, Segment, sat
from autoshard.solver.core.rows import capacity_deficit, compress_rows, drop_dominated_rows, normalize, prune_by_slack

MAX_TABLE = 4_000_000
"""Largest min-plus tensor (k_a * k_v * k_b entries) a degree-2 elimination may build."""
MAX_DOMINANCE_WORK = 1_000_000
"""Largest k_v * k_v * k_w comparison a dominance test may build per edge."""
MAX_DOMINANCE_DEGREE = 30
"""Dominance is tested on nodes with at most this many edges (keeps int64 sums exact)."""
_SAFE = 2**62 // (MAX_DOMINANCE_DEGREE + 2)
ROWS_WORTH = 0.05
"""Implied memory rows are looked for again in the next round only while the last look dropped at
least this share of the rows: the first few looks drop most of them, later ones cost more than
they drop (measured: see benchmarks/README.md, "Measurements behind the design")."""


class Memo:
    """Results of the costly reductions keyed by the content of their inputs: a model's repeated
    layers put the same node in the same situation again and again (measured: see
    benchmarks/README.md, "Solver throughput"). Keys are digests of the arrays
    (dtype, shape, bytes), so a hit is the same computation."""

    def __init__(self) -> None:
        self.dominated: dict[tuple, np.ndarray | None] = {}
        self.series: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


class NoAssignment(Exception):
    """No allowed (and fitting) assignment exists: ``node`` has no strategy left (-1: the memory
    no choice can avoid already exceeds the limit somewhere)."""

    def __init__(self, node: int, memory: bool) -> None:
        super().__init__(node)
        self.node = node
        self.memory = memory


@dataclass(frozen=True)
class Size:
    """Nodes, edges and total strategies of a core."""

    nodes: int
    edges: int
    strategies: int

    @staticmethod
    def of(core: Core) -> Size:
        """Measure a core."""
        edges = sum(len(core.adj[v]) for v in core.alive) // 2
        return Size(len(core.alive), edges, sum(core.k(v) for v in core.alive))


def reduce_core(core: Core, deadline: float | None = None, clock: Callable[[], float] = time.monotonic) -> Counter:
    """Apply every reduction until none applies or ``clock()`` passes ``deadline``; return counts
    per kind. The deadline is read before each node's step and before each round's row work (slack,
    compression, implied rows), so the reductions end within one step of it: what they leave is
    still exact, only less reduced."""
    counts: Counter = Counter()
    memo = Memo()
    queue = deque(sorted(core.alive))
    queued = set(queue)
    rows_pay = True

    def push(nodes) -> None:
        """Queue nodes for another look."""
        for w in nodes:
            if w not in queued and w in core.alive:
                queued.add(w)
                queue.append(w)

    def late() -> bool:
        return deadline is not None and clock() > deadline

    while True:
        while queue:
            if late():
                return counts
            v = queue.popleft()
            queued.discard(v)
            if v in core.alive:
                step(core, v, push, counts, memo)
        if late():
            return counts
        changed, empty = prune_by_slack(core)
        if empty is not None:
            raise NoAssignment(empty, memory=True)
        if capacity_deficit(core):
            raise NoAssignment(-1, memory=True)
        counts["slack"] += len(changed)
        before = {v for v in core.alive if core.segments[v]}
        compress_rows(core)
        if rows_pay:
            rows = 0 if core.capacity is None else len(core.capacity)
            dropped = drop_dominated_rows(core, deadline=deadline)
            counts["rows"] += dropped
            rows_pay = dropped >= ROWS_WORTH * rows
        freed = {v for v in before if not core.segments[v]}
        if not changed and not freed:
            return counts
        push(changed | freed)
        push({w for v in changed for w in core.adj[v]})


def step(core: Core, v: int, push, counts: Counter, memo: Memo) -> None:
    """Try every reduction on node v; push the nodes whose situation changed."""
    finite = {w: m < INF for w, m in core.adj[v].items()}
    keep = core.costs[v] < INF
    for f in finite.values():
        keep &= f.any(axis=1)
    if not keep.all():
        if not keep.any():
            raise NoAssignment(v, memory=False)
        counts["forbidden"] += int((~keep).sum())
        core.restrict(v, keep)
        normalize(core, v)
        push(core.adj[v])
        finite = {w: f[keep] for w, f in finite.items()}
    if core.k(v) == 1:
        fold_single(core, v)
        counts["fixed"] += 1
        return
    for w, f in finite.items():
        m = core.adj[v][w]
        if f.all():  # separable: m[s,t] = a[s] + b[t] moves into the node costs
            if _separable(m):
                core.costs[v] = sat(core.costs[v] + m[:, 0])
                core.costs[w] = sat(core.costs[w] + (m[0, :] - m[0, 0]))
                del core.adj[v][w], core.adj[w][v]
                counts["separable"] += 1
                push([w])
            continue
        w_follows = bool((f.sum(axis=1) == 1).all())
        v_follows = bool((f.sum(axis=0) == 1).all())
        if w_follows or v_follows:
            if v_follows and (not w_follows or len(core.adj[v]) < len(core.adj[w])):
                v, w = w, v
            push(core.adj[w])
            absorb(core, v, w)
            counts["merged"] += 1
            push([v])
            return
    keep = prune_dominated(core, v, memo)  # after the cheap merges: a merged node is tested once
    if keep is not None:
        counts["dominated"] += int((~keep).sum())
        core.restrict(v, keep)
        normalize(core, v)
        push(core.adj[v])
        push([v])
        return
    if core.segments[v]:
        return
    degree = len(core.adj[v])
    if degree == 0:
        best = int(np.argmin(core.costs[v]))
        core.const += int(core.costs[v][best])
        core.record(v, (), np.array(best))
        core.remove(v)
        counts["degree0"] += 1
    elif degree == 1:
        (u,) = core.adj[v]
        eliminate_leaf(core, v, u)
        counts["degree1"] += 1
        push([u])
    elif degree == 2:
        a, b = core.adj[v]
        if core.k(a) * core.k(v) * core.k(b) <= MAX_TABLE:
            eliminate_series(core, v, a, b, memo)
            counts["degree2"] += 1
            push([a, b])


def fold_single(core: Core, v: int) -> None:
    """v has one strategy: add its cost to the constant and its edge rows to its neighbours."""
    core.const += int(core.costs[v][0])
    for w, m in core.adj[v].items():
        core.costs[w] = sat(core.costs[w] + m[0, :])
    core.record(v, (), np.array(0))
    core.remove(v)


def absorb(core: Core, v: int, w: int) -> None:
    """Merge w into v, where f[s] is the only strategy of w allowed with strategy s of v."""
    m = core.adj[v][w]
    f = np.argmin(m, axis=1)
    rows = np.arange(len(f))
    core.costs[v] = sat(sat(core.costs[v] + m[rows, f]) + core.costs[w][f])
    core.record(w, (v,), f)
    for x, n in list(core.adj[w].items()):
        if x != v:
            core.add_edge(v, x, n[f, :])
    moved = [Segment(seg.start, seg.stop, seg.usage[f]) for seg in core.segments[w]]
    core.remove(w)
    normalize(core, v, moved)


def eliminate_leaf(core: Core, v: int, u: int) -> None:
    """R1: v hangs off u only: u pays min_t (m[s,t] + c_v[t]) and v follows the argmin."""
    t = sat(core.adj[u][v] + core.costs[v][None, :])
    best = np.argmin(t, axis=1)
    core.costs[u] = sat(core.costs[u] + t[np.arange(len(best)), best])
    core.record(v, (u,), best)
    core.remove(v)


def eliminate_series(core: Core, v: int, a: int, b: int, memo: Memo | None = None) -> None:
    """R2: v sits between a and b: a new edge (a, b) holds min_t (m_av + c_v + m_vb)."""
    key = None if memo is None else (digest(core.adj[a][v]), digest(core.costs[v]), digest(core.adj[v][b]))
    if key is not None and key in memo.series:
        best, merged = memo.series[key]
    else:
        t = sat(core.adj[a][v][:, :, None] + core.costs[v][None, :, None])
        t = sat(t + core.adj[v][b][None, :, :])
        best = np.argmin(t, axis=1)
        merged = np.take_along_axis(t, best[:, None, :], axis=1)[:, 0, :]
        if key is not None:
            memo.series[key] = best, merged
    core.record(v, (a, b), best)
    core.remove(v)
    core.add_edge(a, b, merged)


def prune_dominated(core: Core, v: int, memo: Memo | None = None) -> np.ndarray | None:
    """Mask of v's strategies to keep after dropping dominated ones, or None if none is dominated.

    b dominates a when c[b] - c[a] + sum over edges of max_t (m[b,t] - m[a,t]) <= 0 (the max over
    the t that a allows; b must allow all of them) and b's usage is <= a's in every segment.
    """
    k = core.k(v)
    if k < 2 or len(core.adj[v]) > MAX_DOMINANCE_DEGREE:
        return None
    if any(k * k * m.shape[1] > MAX_DOMINANCE_WORK for m in core.adj[v].values()):
        return None
    # a sum over edges and an "or" over edges and segments: their order does not matter
    key = None if memo is None else (digest(core.costs[v]), tuple(sorted(digest(m) for m in core.adj[v].values())),
                                     tuple(sorted(digest(seg.usage) for seg in core.segments[v])))
    if key is not None and key in memo.dominated:
        return memo.dominated[key]
    keep = _undominated(core, v)
    if key is not None:
        memo.dominated[key] = keep
    return keep


def _undominated(core: Core, v: int) -> np.ndarray | None:
    """The dominance test of ``prune_dominated`` (its preconditions checked there), one compiled
    call per edge and segment, where numpy took eight array operations on k x k x k_w temporaries
    per edge (measured: see benchmarks/README.md, "Solver throughput")."""
    c = core.costs[v]
    total, blocked = _pair_costs(c)
    for m in core.adj[v].values():
        _add_edge(m, total, blocked)
    for seg in core.segments[v]:
        _add_usage(seg.usage, blocked)
    keep = _survivors(total, blocked)
    return None if keep.all() else keep


@njit(cache=True)
def _pair_costs(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """total[a, b] = c[b] - c[a] (what b costs more than a at the node), and b blocked as a
    dominator of a where b is forbidden or b == a."""
    k = len(c)
    total = np.empty((k, k), dtype=np.int64)
    blocked = np.zeros((k, k), dtype=np.bool_)
    for a in range(k):
        for b in range(k):
            blocked[a, b] = c[b] >= INF or a == b
            total[a, b] = 0 if blocked[a, b] else c[b] - c[a]
    return total, blocked


@njit(cache=True)
def _add_edge(m: np.ndarray, total: np.ndarray, blocked: np.ndarray) -> None:
    """Add one edge's worst case to total[a, b]: max over the t that a allows of m[b,t] - m[a,t];
    b is blocked where it forbids a t that a allows, where a allows none, or where the worst case
    is beyond _SAFE (the sum over MAX_DOMINANCE_DEGREE edges must stay exact in int64)."""
    k, kw = m.shape
    for a in range(k):
        for b in range(k):
            if blocked[a, b]:
                continue
            worst, allowed = 0, False
            for t in range(kw):
                if m[a, t] >= INF:
                    continue
                if m[b, t] >= INF:
                    blocked[a, b] = True
                    break
                gap = m[b, t] - m[a, t]
                if not allowed or gap > worst:
                    worst, allowed = gap, True
            if blocked[a, b]:
                continue
            if not allowed or abs(worst) > _SAFE:
                blocked[a, b] = True
            else:
                total[a, b] += worst


@njit(cache=True)
def _add_usage(usage: np.ndarray, blocked: np.ndarray) -> None:
    """A segment: b cannot dominate a where it uses more memory."""
    k = len(usage)
    for a in range(k):
        for b in range(k):
            if usage[b] > usage[a]:
                blocked[a, b] = True


@njit(cache=True)
def _survivors(total: np.ndarray, blocked: np.ndarray) -> np.ndarray:
    """The strategies to keep: a goes when some b still kept is never worse (total[a, b] <= 0,
    not blocked). In index order, so of strategies equal in every respect the last one stays."""
    k = total.shape[0]
    keep = np.ones(k, dtype=np.bool_)
    for a in range(k):
        for b in range(k):
            if keep[b] and not blocked[a, b] and total[a, b] <= 0:
                keep[a] = False
                break
    return keep


@njit(cache=True)
def _separable(m: np.ndarray) -> bool:
    """True when m[s,t] = a[s] + b[t] exactly (m has no forbidden entries): compiled, it stops at
    the first entry that says no (measured: see benchmarks/README.md, "Solver throughput")."""
    k, kw = m.shape
    for s in range(1, k):
        shift = m[s, 0] - m[0, 0]
        for t in range(1, kw):
            if m[s, t] - m[0, t] != shift:
                return False
    return True
