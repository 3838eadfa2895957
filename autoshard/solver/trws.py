"""Sequential tree-reweighted message passing (TRW-S, Kolmogorov 2006) on a Compact.

It solves the dual of the problem's LP relaxation (the local polytope) approximately. On the
reduced IOPDDL cores that LP is tight or nearly so, which makes TRW-S a strong source of plans
(``primal``: nodes decided in order, each on its best strategy given the decided neighbours and
the messages of the others) and of lower bounds (``bound``). ``penalty`` adds a per-node vector
to the costs: the Lagrangian term of the memory rows (see lagrange.py).

Arithmetic is float64 with forbidden entries at +inf; the bound is made safe against rounding
by ``safe_bound``.
"""

from __future__ import annotations

import math
import time

import numpy as np

from autoshard.solver.core import INF, Compact
from autoshard.solver.cut import DualCut

_CAP = 1e250  # messages are clipped here so inf - inf never appears


class MessagePassing:
    """Messages of TRW-S over a Compact; ``sweep`` runs one forward and one backward pass."""

    def __init__(self, comp: Compact) -> None:
        self.comp = comp
        n = comp.n
        self.theta = [np.where(c < INF, c.astype(np.float64), np.inf) for c in comp.costs]
        self.edges: list[tuple[int, int, np.ndarray]] = []
        self.flipped: list[bool] = []
        self.inc: list[list[tuple[int, int, bool]]] = [[] for _ in range(n)]
        for u, v, m in comp.edges:
            self.flipped.append(u > v)
            if u > v:
                u, v, m = v, u, m.T
            e = len(self.edges)
            self.edges.append((u, v, np.where(m < INF, m.astype(np.float64), np.inf)))
            self.inc[u].append((e, v, True))
            self.inc[v].append((e, u, False))
        self.to_u = [np.zeros(len(self.theta[u])) for u, _, _ in self.edges]
        self.to_v = [np.zeros(len(self.theta[v])) for _, v, _ in self.edges]
        self.gamma = [
            1.0 / max(1, sum(j < i for _, j, _ in self.inc[i]), sum(j > i for _, j, _ in self.inc[i]))
            for i in range(n)
        ]
        self._by_shape: list[tuple[list[int], np.ndarray, float]] | None = None

    def _hat(self, i: int, penalty: list[np.ndarray] | None) -> np.ndarray:
        hat = self.theta[i] if penalty is None else self.theta[i] + penalty[i]
        for e, _, is_u in self.inc[i]:
            hat = hat + (self.to_u[e] if is_u else self.to_v[e])
        return hat

    def sweep(self, penalty: list[np.ndarray] | None = None, deadline: float | None = None) -> bool:
        """One forward and one backward pass of message updates; False when cut short at
        ``deadline`` (the messages stay valid)."""
        n = self.comp.n
        for forward in (True, False):
            for i in range(n) if forward else range(n - 1, -1, -1):
                if deadline is not None and i % 256 == 0 and time.monotonic() > deadline:
                    return False
                hat = self._hat(i, penalty)
                g = self.gamma[i]
                for e, j, is_u in self.inc[i]:
                    if (j > i) != forward:
                        continue
                    m = self.edges[e][2]
                    if is_u:
                        msg = np.minimum(((g * hat - self.to_u[e])[:, None] + m).min(axis=0), _CAP)
                        self.to_v[e] = msg - msg.min()
                    else:
                        msg = np.minimum(((g * hat - self.to_v[e])[None, :] + m).min(axis=1), _CAP)
                        self.to_u[e] = msg - msg.min()
        return True

    def primal(self, penalty: list[np.ndarray] | None = None) -> np.ndarray:
        """Decide nodes in order: best strategy given decided neighbours and others' messages."""
        n = self.comp.n
        x = np.full(n, -1, dtype=np.int64)
        for i in range(n):
            vec = self.theta[i] if penalty is None else self.theta[i] + penalty[i]
            for e, j, is_u in self.inc[i]:
                m = self.edges[e][2]
                if x[j] >= 0:
                    vec = vec + (m[:, x[j]] if is_u else m[x[j], :])
                else:
                    vec = vec + (self.to_u[e] if is_u else self.to_v[e])
            x[i] = int(np.argmin(vec))
        return x

    def _edge_part(self, e: int, hats: list[np.ndarray]) -> np.ndarray:
        """Edge ``e``'s share of the reparametrised costs: its matrix minus the messages, plus an
        even split of its endpoints' reparametrised node costs."""
        u, v, m = self.edges[e]
        return (m - self.to_u[e][:, None] - self.to_v[e][None, :]
                + hats[u][:, None] / len(self.inc[u]) + hats[v][None, :] / len(self.inc[v]))

    def _groups(self) -> list[tuple[list[int], np.ndarray, float]]:
        """The edges grouped by matrix shape: their ids, their matrices stacked, and the sum of
        their largest finite magnitudes (built on the first ``bound``)."""
        if self._by_shape is None:
            ids: dict[tuple[int, int], list[int]] = {}
            for e, (_, _, m) in enumerate(self.edges):
                ids.setdefault(m.shape, []).append(e)
            self._by_shape = []
            for group in ids.values():
                mats = np.stack([self.edges[e][2] for e in group])
                top = sum(float(np.abs(self.edges[e][2][np.isfinite(self.edges[e][2])]).max(initial=0.0)) for e in group)
                self._by_shape.append((group, mats, top))
        return self._by_shape

    def bound(self, penalty: list[np.ndarray] | None = None) -> tuple[float, float]:
        """A lower bound on min cost + penalty, and the sum of magnitudes for ``safe_bound``.

        Any split of the reparametrised costs among nodes and edges bounds the minimum by the
        sum of the parts' minima; each node's reparametrised cost is split evenly over its edges.
        """
        hats = [self._hat(i, penalty) for i in range(self.comp.n)]
        total, scale = 0.0, 0.0
        for i, hat in enumerate(hats):
            if not self.inc[i]:
                low = float(hat.min())
                total += low
                scale += abs(low)
        for ids, mats, top in self._groups():  # edges of one shape at once (S: 365 shapes, 13374 edges)
            share = [(hats[u] / len(self.inc[u]), hats[v] / len(self.inc[v])) for u, v, _ in (self.edges[e] for e in ids)]
            rows = np.stack([a for a, _ in share]) - np.stack([self.to_u[e] for e in ids])
            cols = np.stack([b for _, b in share]) - np.stack([self.to_v[e] for e in ids])
            low = (mats + rows[:, :, None] + cols[:, None, :]).min(axis=(1, 2))
            total += float(low.sum())
            scale += float(np.abs(low).sum()) + top
        return total, scale


    def cut(self, penalty: list[np.ndarray] | None, offset: float) -> DualCut:
        """The split bound as a z3 cut: each edge part's excess over its minimum, floored, on the
        pair's indicator (and isolated nodes' excess on their strategies). For every plan that fits,
        cost >= const + sum of the excesses it uses, where const is the bound plus ``offset``
        (minus lam . capacity for a Lagrangian penalty)."""
        hats = [self._hat(i, penalty) for i in range(self.comp.n)]
        total, scale = offset, abs(offset)
        node_terms, pair_terms = [], []
        for i, hat in enumerate(hats):
            if not self.inc[i]:
                low = float(hat.min())
                total, scale = total + low, scale + abs(low)
                excess = np.floor(hat - low - 1e-9 * (np.abs(hat) + abs(low)) - 1e-6)
                for s in np.flatnonzero(np.isfinite(hat) & (excess >= 1)):
                    node_terms.append((i, int(s), int(excess[s]), True))
        for e, (_, _, m) in enumerate(self.edges):
            part = self._edge_part(e, hats)
            low = float(part.min())
            total, scale = total + low, scale + abs(low) + float(np.abs(m[np.isfinite(m)]).max(initial=0.0))
            excess = np.where(np.isfinite(part) & (part < _CAP), part - low, 0.0)
            excess = np.floor(excess - 1e-9 * (np.abs(part) + abs(low)) - 1e-6)  # never above the true excess
            for s, t in zip(*np.nonzero(excess >= 1)):
                a, b = (int(t), int(s)) if self.flipped[e] else (int(s), int(t))
                pair_terms.append((e, a, b, int(excess[s, t]), True))
        return DualCut(safe_bound(total, scale), node_terms, pair_terms)


def safe_bound(value: float, scale: float) -> int:
    """An integer lower bound on integer costs from a float64 bound ``value``: ceil after a
    margin ~100 times the worst rounding of a sum whose terms' magnitudes add up to ``scale``."""
    if not math.isfinite(value):
        return -(2**62) if value < 0 else 2**62
    return math.ceil(value - 1e-12 * (scale + abs(value)) - 1e-9)
