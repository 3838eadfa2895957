"""Sequential tree-reweighted message passing (TRW-S, Kolmogorov 2006) on a FrozenCore.

It solves the dual of the problem's LP relaxation (the local polytope) approximately. On the
reduced cores that LP is often tight or nearly so, which makes TRW-S a strong source of plans
(``primal``: nodes decided in order, each on its best strategy given the decided neighbours and
the messages of the others) and of lower bounds (``bound``). ``penalty`` adds a per-node vector
to the costs: the Lagrangian term of the memory rows (see lagrangian.py).

Arithmetic is float64 with forbidden entries at +inf; the bound is made safe against rounding
by ``safe_bound``. The edge matrices are read where the core keeps them, as int64 in its flat
arrays' pool (``FrozenCore.arrays``), each entry converted as it is read (``_entry``: forbidden
entries to +inf): a float copy of them would be as large again as the pool. The node-by-node
loops (a pass of message updates, the reparametrised node costs, the primal) are compiled by
numba over flat arrays: in numpy the call overhead per message made most of a Lagrangian step
(measured: see benchmarks/README.md, "Solver throughput"). The per-node and per-edge arrays the
rest of the solver reads (``to_u``, ``to_v``) are views into those flat arrays, so they see every
update.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from autoshard.solver.core.flat_core import offsets, views
from autoshard.solver.core.reduced import INF, FrozenCore
from autoshard.solver.core.certify import safe_bound
from autoshard.solver.core.dual_cut import DualCut

_CAP = 1e250  # messages are clipped here so inf - inf never appears
CHUNK = 256
"""Nodes per compiled call of a pass: the deadline is checked between calls."""


class MessagePassing:
    """Messages of TRW-S over a FrozenCore; ``sweep`` runs one forward and one backward pass."""

    def __init__(self, comp: FrozenCore) -> None:
        self.comp = comp
        n = comp.n
        self.edges, self.m_off = lower_first(comp)
        self.flipped = [u > v for u, v, _ in comp.edges]
        self.inc: list[list[tuple[int, int, bool]]] = [[] for _ in range(n)]
        for e, (u, v, _) in enumerate(self.edges):
            self.inc[u].append((e, v, True))
            self.inc[v].append((e, u, False))
        self.gamma = np.array([
            1.0 / max(1, sum(j < i for _, j, _ in self.inc[i]), sum(j > i for _, j, _ in self.inc[i]))
            for i in range(n)
        ])
        self.flat = _FlatGraph(self)
        # the per-node arrays become views of the flat ones: one copy in memory
        self.theta = views(self.flat.theta, self.flat.th_off)
        self.to_u = views(self.flat.to_u, self.flat.u_off)
        self.to_v = views(self.flat.to_v, self.flat.v_off)
        self._top: float | None = None

    def sweep(self, penalty: np.ndarray | None = None, deadline: float | None = None) -> bool:
        """One forward and one backward pass of message updates; False when cut short at
        ``deadline`` (the messages stay valid)."""
        f, n = self.flat, self.comp.n
        nodes, messages = f.node_args(penalty), f.message_args()
        for forward in (True, False):
            for start in range(0, n, CHUNK):
                if deadline is not None and time.monotonic() > deadline:
                    return False
                lo, hi = (start, min(n, start + CHUNK)) if forward else (max(0, n - start - CHUNK), n - start)
                _pass(lo, hi, forward, f.widest, self.gamma, *nodes, *messages)
        return True

    def primal(self, penalty: np.ndarray | None = None) -> np.ndarray:
        """Decide nodes in order: best strategy given decided neighbours and others' messages."""
        return _primal(self.flat.widest, *self.flat.node_args(penalty), *self.flat.message_args())

    def bound(self, penalty: np.ndarray | None = None) -> tuple[float, float]:
        """A lower bound on min cost + penalty, and the sum of magnitudes for ``safe_bound``.

        Any split of the reparametrised costs among nodes and edges bounds the minimum by the
        sum of the parts' minima; each node's reparametrised cost is split evenly over its edges.
        """
        value, scale, _, _ = self._split(penalty, np.zeros(0))
        return value, scale

    def floors(self, penalty: np.ndarray | None = None) -> tuple[float, float, list[np.ndarray]]:
        """The split bound (``bound``'s value and scale) and, per node and strategy, the least a
        plan that takes the strategy pays above it: each part of the split (edges, isolated
        nodes) is at least its minimum over the entries the strategy leaves it, so

            cost + penalty of x  >=  bound + floor_i[x_i]          for every plan x and node i

        (in float64: the caller leaves a margin, as ``safe_bound`` does)."""
        f = self.flat
        parts = np.empty(f.p_off[-1])
        value, scale, flat_hats, lows = self._split(penalty, parts)
        hats = views(flat_hats, f.th_off)
        floors = [np.zeros(len(c)) for c in self.comp.costs]
        for i in f.isolated:
            floors[i] += hats[i] - hats[i].min()
        for e, (u, v, m) in enumerate(self.edges):
            with np.errstate(invalid="ignore"):  # forbidden entries stay infinite
                part = parts[f.p_off[e]:f.p_off[e + 1]].reshape(m.shape) - lows[e]
            part[np.isnan(part)] = np.inf
            floors[u] += part.min(axis=1)
            floors[v] += part.min(axis=0)
        return value, scale, floors

    def _split(self, penalty: np.ndarray | None, parts: np.ndarray) -> tuple[float, float, np.ndarray, np.ndarray]:
        """The split bound's value and scale, the reparametrised node costs (flat) and each edge
        part's minimum; ``parts`` (unless empty) is filled with the edge parts themselves."""
        f = self.flat
        nodes, messages = f.node_args(penalty), f.message_args()
        hats = _all_hats(*nodes, *messages)
        total, scale = 0.0, 0.0
        for i in f.isolated:
            low = float(hats[f.th_off[i]:f.th_off[i + 1]].min())
            total += low
            scale += abs(low)
        lows = _edge_parts(hats, f.th_off, f.degree, f.edge_u, f.edge_v, *messages, f.p_off, parts)
        if self._top is None:  # the sum of the edges' largest finite magnitudes
            self._top = sum(_largest_allowed(m) for _, _, m in self.edges)
        return total + float(lows.sum()), scale + float(np.abs(lows).sum()) + self._top, hats, lows

    def cut(self, penalty: np.ndarray | None, offset: float) -> DualCut:
        """The split bound as a z3 cut: each edge part's excess over its minimum, floored, on the
        pair's indicator (and isolated nodes' excess on their strategies). For every plan that fits,
        cost >= const + sum of the excesses it uses, where const is the bound plus ``offset``
        (minus lam . capacity for a Lagrangian penalty)."""
        f = self.flat
        flat_hats = _all_hats(*f.node_args(penalty), *f.message_args())
        hats = views(flat_hats, f.th_off)
        parts = np.empty(f.p_off[-1])
        lows = _edge_parts(flat_hats, f.th_off, f.degree, f.edge_u, f.edge_v, *f.message_args(), f.p_off, parts)
        total, scale = offset, abs(offset)
        node_terms, pair_terms = [], []
        for i in f.isolated:
            hat = hats[i]
            low = float(hat.min())
            total, scale = total + low, scale + abs(low)
            excess = np.floor(hat - low - 1e-9 * (np.abs(hat) + abs(low)) - 1e-6)
            for s in np.flatnonzero(np.isfinite(hat) & (excess >= 1)):
                node_terms.append((i, int(s), int(excess[s]), True))
        for e, (_, _, m) in enumerate(self.edges):
            part, low = parts[f.p_off[e]:f.p_off[e + 1]].reshape(m.shape), float(lows[e])
            total, scale = total + low, scale + abs(low) + _largest_allowed(m)
            excess = np.where(np.isfinite(part) & (part < _CAP), part - low, 0.0)
            excess = np.floor(excess - 1e-9 * (np.abs(part) + abs(low)) - 1e-6)  # never above the true excess
            for s, t in zip(*np.nonzero(excess >= 1)):
                a, b = (int(t), int(s)) if self.flipped[e] else (int(s), int(t))
                pair_terms.append((e, a, b, int(excess[s, t]), True))
        return DualCut(safe_bound(total, scale), node_terms, pair_terms)


def lower_first(comp: FrozenCore) -> tuple[list[tuple[int, int, np.ndarray]], np.ndarray]:
    """Edge e of ``comp.edges`` oriented lower node first, as (u, v, matrix) with u < v, the matrix
    an int64 view of ``comp.arrays``' pool, and each one's offset in the pool."""
    a = comp.arrays
    edges = [(min(u, v), max(u, v), a.lower_first(e, u, v)) for e, (u, v, _) in enumerate(comp.edges)]
    return edges, a.edge_moff


def _largest_allowed(m: np.ndarray) -> float:
    """The largest magnitude among ``m``'s entries that are not forbidden (0.0 when none is)."""
    return float(np.abs(m[m < INF]).max(initial=0))


class _FlatGraph:
    """The costs, incidence lists, edge matrices and messages of a MessagePassing as flat
    arrays with offsets, which is what the compiled loops take."""

    def __init__(self, mp: MessagePassing) -> None:
        costs = mp.comp.arrays.costs
        self.th_off, self.widest = mp.comp.arrays.c_off, mp.comp.arrays.widest  # theta is laid out as the costs
        sizes = np.diff(self.th_off).tolist()
        self.theta = costs.astype(np.float64)
        self.theta[costs >= INF] = np.inf
        self.zeros = np.zeros_like(self.theta)
        inc = [(e, j, is_u) for row in mp.inc for e, j, is_u in row]
        self.inc_ptr = offsets([len(row) for row in mp.inc])
        self.inc_edge = np.array([e for e, _, _ in inc], dtype=np.int64)
        self.inc_other = np.array([j for _, j, _ in inc], dtype=np.int64)
        self.inc_is_u = np.array([is_u for _, _, is_u in inc], dtype=np.bool_)
        # edge e's matrix starts at m_off[e] in the core's pool (lower_first); its parts (the
        # bound's per-entry split) are its own, at p_off[e]
        self.mats, self.m_off = mp.comp.arrays.nb_mats, mp.m_off
        self.p_off = offsets([m.size for _, _, m in mp.edges])
        self.u_off = offsets([sizes[u] for u, _, _ in mp.edges])
        self.v_off = offsets([sizes[v] for _, v, _ in mp.edges])
        self.to_u = np.zeros(self.u_off[-1])
        self.to_v = np.zeros(self.v_off[-1])
        self.edge_u = np.array([u for u, _, _ in mp.edges], dtype=np.int64)
        self.edge_v = np.array([v for _, v, _ in mp.edges], dtype=np.int64)
        self.degree = np.diff(self.inc_ptr).astype(np.float64)
        self.isolated = [i for i, row in enumerate(mp.inc) if not row]

    def node_args(self, penalty: np.ndarray | None) -> tuple[np.ndarray, ...]:
        """Offsets, costs, the penalty (zeros when None) and the incidence lists."""
        pen = self.zeros if penalty is None else penalty
        return self.th_off, self.theta, pen, self.inc_ptr, self.inc_edge, self.inc_other, self.inc_is_u

    def message_args(self) -> tuple[np.ndarray, ...]:
        """Edge matrices and both directions' messages, with their offsets."""
        return self.mats, self.m_off, self.to_u, self.u_off, self.to_v, self.v_off


@njit(inline="always")
def _entry(mats, at):  # pragma: no cover
    """Entry ``at`` of the int64 pool as float64, +inf where it is forbidden (at least INF)."""
    value = mats[at]
    return np.inf if value >= INF else float(value)


@njit(cache=True)
def _hat_into(i, out, at, th_off, theta, pen, inc_ptr, inc_edge, inc_is_u, to_u, u_off, to_v, v_off):  # pragma: no cover
    """Node i's costs plus penalty plus incoming messages (in incidence order), into out[at:]."""
    a, k = th_off[i], th_off[i + 1] - th_off[i]
    for s in range(k):
        out[at + s] = theta[a + s] + pen[a + s]
    for p in range(inc_ptr[i], inc_ptr[i + 1]):
        e = inc_edge[p]
        if inc_is_u[p]:
            b = u_off[e]
            for s in range(k):
                out[at + s] += to_u[b + s]
        else:
            b = v_off[e]
            for s in range(k):
                out[at + s] += to_v[b + s]


@njit(cache=True)
def _all_hats(th_off, theta, pen, inc_ptr, inc_edge, inc_other, inc_is_u, mats, m_off, to_u, u_off, to_v, v_off):  # pragma: no cover
    """Every node's reparametrised costs, flat (laid out as ``theta``)."""
    out = np.empty(len(theta))
    for i in range(len(th_off) - 1):
        _hat_into(i, out, th_off[i], th_off, theta, pen, inc_ptr, inc_edge, inc_is_u, to_u, u_off, to_v, v_off)
    return out


@njit(cache=True)
def _pass(lo, hi, forward, widest, gamma, th_off, theta, pen, inc_ptr, inc_edge, inc_other, inc_is_u, mats, m_off, to_u, u_off, to_v, v_off):  # pragma: no cover
    """TRW-S updates of nodes lo..hi-1 (in that order when ``forward``, else the reverse): each
    node's messages to its later neighbours (earlier ones going backward),

        msg_ij(t) = min_s (gamma_i hat_i(s) - msg_ji(s) + theta_ij(s, t)),  clipped at _CAP,

    less its minimum (``widest``: the most strategies of a node)."""
    hat = np.empty(widest)
    w = np.empty(widest)
    msg = np.empty(widest)
    for step in range(hi - lo):
        i = lo + step if forward else hi - 1 - step
        _hat_into(i, hat, 0, th_off, theta, pen, inc_ptr, inc_edge, inc_is_u, to_u, u_off, to_v, v_off)
        g, ki = gamma[i], th_off[i + 1] - th_off[i]
        for p in range(inc_ptr[i], inc_ptr[i + 1]):
            j = inc_other[p]
            if (j > i) != forward:
                continue
            e, j_size = inc_edge[p], th_off[j + 1] - th_off[j]
            mb, ub, vb = m_off[e], u_off[e], v_off[e]
            if inc_is_u[p]:  # i is the edge's row node: the message goes to its columns
                for t in range(j_size):
                    msg[t] = np.inf
                for s in range(ki):
                    h = g * hat[s] - to_u[ub + s]
                    row = mb + s * j_size
                    for t in range(j_size):
                        val = h + _entry(mats, row + t)
                        if val < msg[t]:
                            msg[t] = val
                out, ob = to_v, vb
            else:  # i is the column node: the message goes to the rows
                for t in range(ki):
                    w[t] = g * hat[t] - to_v[vb + t]
                for s in range(j_size):
                    best = np.inf
                    row = mb + s * ki
                    for t in range(ki):
                        val = w[t] + _entry(mats, row + t)
                        if val < best:
                            best = val
                    msg[s] = best
                out, ob = to_u, ub
            low = np.inf
            for t in range(j_size):
                if msg[t] > _CAP:
                    msg[t] = _CAP
                if msg[t] < low:
                    low = msg[t]
            for t in range(j_size):
                out[ob + t] = msg[t] - low


@njit(cache=True)
def _edge_parts(hats, th_off, degree, edge_u, edge_v, mats, m_off, to_u, u_off, to_v, v_off, p_off, parts):  # pragma: no cover
    """Per edge uv, the minimum of its part of the reparametrised costs (its matrix less the
    messages, plus an even split of its ends' reparametrised node costs),

        part_uv(s, t) = theta_uv(s, t) + (hat_u(s) / deg_u - msg_vu(s)) + (hat_v(t) / deg_v - msg_uv(t)),

    and the parts themselves into ``parts`` (edge e's at ``p_off[e]``) unless it is empty: the bound
    needs only the minima, the cut every entry."""
    keep = len(parts) > 0
    out = np.empty(len(edge_u))
    for e in range(len(edge_u)):
        u, v = edge_u[e], edge_v[e]
        ku, kv = th_off[u + 1] - th_off[u], th_off[v + 1] - th_off[v]
        hu, hv, mb = th_off[u], th_off[v], m_off[e]
        low = np.inf
        for s in range(ku):
            row = hats[hu + s] / degree[u] - to_u[u_off[e] + s]
            for t in range(kv):
                val = _entry(mats, mb + s * kv + t) + row + (hats[hv + t] / degree[v] - to_v[v_off[e] + t])
                if keep:
                    parts[p_off[e] + s * kv + t] = val
                if val < low:
                    low = val
        out[e] = low
    return out


@njit(cache=True)
def _primal(widest, th_off, theta, pen, inc_ptr, inc_edge, inc_other, inc_is_u, mats, m_off, to_u, u_off, to_v, v_off):  # pragma: no cover
    """Each node in order on its cheapest strategy, given the decided neighbours' strategies
    (their edge costs) and the others' messages; ties to the lowest index (``widest``: the most
    strategies of a node)."""
    n = len(th_off) - 1
    x = np.full(n, -1, dtype=np.int64)
    vec = np.empty(widest)
    for i in range(n):
        a, k = th_off[i], th_off[i + 1] - th_off[i]
        for s in range(k):
            vec[s] = theta[a + s] + pen[a + s]
        for p in range(inc_ptr[i], inc_ptr[i + 1]):
            e, j = inc_edge[p], inc_other[p]
            if x[j] >= 0:
                mb = m_off[e]
                if inc_is_u[p]:  # i's strategies are the rows: column x[j]
                    j_size = th_off[j + 1] - th_off[j]
                    for s in range(k):
                        vec[s] += _entry(mats, mb + s * j_size + x[j])
                else:  # i's strategies are the columns: row x[j]
                    for s in range(k):
                        vec[s] += _entry(mats, mb + x[j] * k + s)
            elif inc_is_u[p]:
                for s in range(k):
                    vec[s] += to_u[u_off[e] + s]
            else:
                for s in range(k):
                    vec[s] += to_v[v_off[e] + s]
        best = 0
        for s in range(1, k):
            if vec[s] < vec[best]:
                best = s
        x[i] = best
    return x
