"""A FrozenCore as the flat arrays the compiled (numba) loops take, and the offset helpers.

Node i's costs are ``costs[c_off[i]:c_off[i+1]]``. Its neighbours are
``nb_other[nb_ptr[i]:nb_ptr[i+1]]``; neighbour entry p holds the edge's matrix oriented (i's
strategies, the neighbour's), row-major at ``nb_mats[nb_moff[p]:]``: every edge twice, once per
end, and large matrices with equal contents (a model's repeated layers) stored once
(``core/pool.py``). Edge e of the core's edge list has its two entries at ``edge_entries[e]`` (at
its first node, at its second). Node i's memory segments are rows ``seg_start..seg_stop`` with
usage ``seg_use[seg_uoff[q]:]`` for q in ``seg_ptr[i]..seg_ptr[i+1]``.

These arrays can be the core's one copy of its numbers: ``FrozenCore.share_arrays`` makes the
core's own costs, matrices and usages views into them, and TRW-S reads ``nb_mats`` as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from autoshard.solver.core.pool import matrix_pool

if TYPE_CHECKING:
    from autoshard.solver.core.reduced import FrozenCore


@dataclass
class FrozenCoreArrays:
    """A FrozenCore flat (the layout is the module docstring's)."""

    c_off: np.ndarray
    widest: int  # the most strategies of a node
    costs: np.ndarray
    nb_ptr: np.ndarray
    nb_other: np.ndarray
    nb_moff: np.ndarray
    nb_mats: np.ndarray
    edge_entries: np.ndarray  # (edges, 2): edge e's neighbour entries at its first and second node
    seg_ptr: np.ndarray
    seg_start: np.ndarray
    seg_stop: np.ndarray
    seg_uoff: np.ndarray
    seg_use: np.ndarray

    @staticmethod
    def of(comp: FrozenCore) -> FrozenCoreArrays:
        """``comp`` flattened. Its neighbour lists hold each edge at both ends in the order of its
        edge list (``FrozenCore.__post_init__``), which is how ``edge_entries`` is read off."""
        nbrs = [(j, m) for row in comp.nbrs for j, m in row]
        segs = [seg for row in comp.segments for seg in row]
        sizes = [len(c) for c in comp.costs]
        nb_ptr = offsets([len(row) for row in comp.nbrs])
        pool, moff = matrix_pool([m for _, m in nbrs])
        return FrozenCoreArrays(
            offsets(sizes),
            max(sizes, default=0),
            flat(comp.costs),
            nb_ptr,
            np.array([j for j, _ in nbrs], dtype=np.int64),
            moff,
            pool,
            _edge_entries([(u, v) for u, v, _ in comp.edges], nb_ptr),
            offsets([len(row) for row in comp.segments]),
            np.array([start for start, _, _ in segs], dtype=np.int64),
            np.array([stop for _, stop, _ in segs], dtype=np.int64),
            offsets([len(usage) for _, _, usage in segs])[:-1],
            flat([usage for _, _, usage in segs]),
        )

    def k(self, i: int) -> int:
        """Number of strategies of node i."""
        return int(self.c_off[i + 1] - self.c_off[i])

    def entry_matrix(self, p: int, i: int) -> np.ndarray:
        """Neighbour entry p of node i: its matrix (i's strategies by the neighbour's), a view of
        ``nb_mats``."""
        rows, cols = self.k(i), self.k(int(self.nb_other[p]))
        at = int(self.nb_moff[p])
        return self.nb_mats[at:at + rows * cols].reshape(rows, cols)

    def segment_args(self) -> tuple[np.ndarray, ...]:
        """What the compiled loops over memory segments take."""
        return self.c_off, self.seg_ptr, self.seg_start, self.seg_stop, self.seg_uoff, self.seg_use


def _edge_entries(edges: list[tuple[int, int]], nb_ptr: np.ndarray) -> np.ndarray:
    """Per edge, the positions of its neighbour entries at both ends, when every node's entries are
    appended in edge order starting at ``nb_ptr``."""
    free = nb_ptr[:-1].copy()
    out = np.empty((len(edges), 2), dtype=np.int64)
    for e, (u, v) in enumerate(edges):
        out[e] = free[u], free[v]
        free[u] += 1
        free[v] += 1
    return out


def offsets(sizes: list[int]) -> np.ndarray:
    """0 and the running sums of ``sizes`` (int64): where each of a run of pieces starts."""
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)


def views(whole: np.ndarray, starts: np.ndarray) -> list[np.ndarray]:
    """The pieces of ``whole`` cut at ``starts`` (as ``offsets`` makes them), as views."""
    return [whole[a:b] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]


def flat(pieces: list[np.ndarray]) -> np.ndarray:
    """The int64 pieces end to end (empty when there are none)."""
    return np.concatenate(pieces).astype(np.int64, copy=False) if pieces else np.zeros(0, dtype=np.int64)
