"""A FrozenCore as the flat arrays the compiled (numba) loops take, and the offset helpers.

Node i's costs are ``costs[c_off[i]:c_off[i+1]]``. Edge e's matrix is stored once, its lower
node's strategies as rows, row-major at ``nb_mats[edge_moff[e]:]``; large matrices with equal
contents (a model's repeated layers) are stored once between them (``core/pool.py``). Node i's
neighbours are ``nb_other[nb_ptr[i]:nb_ptr[i+1]]``; from neighbour entry p (neighbour j), the
edge's price with i on s and j on t is

    m_ij(s, t) = nb_mats[nb_moff[p] + s * nb_own[p] + t * nb_their[p]]

(the strides read the one stored block either way round). Node i's memory segments are rows
``seg_start..seg_stop`` with usage ``seg_use[seg_uoff[q]:]`` for q in ``seg_ptr[i]..seg_ptr[i+1]``,
equal usages (a model's repeated layers) stored once (``core/pool.py``).

These arrays can be the core's one copy of its numbers: ``FrozenCore.share_arrays`` makes the
core's own costs, matrices and usages views into them, and TRW-S reads ``nb_mats`` as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoshard.solver.core.pool import matrix_pool, vector_pool


@dataclass
class FrozenCoreArrays:
    """A FrozenCore flat (the layout is the module docstring's)."""

    c_off: np.ndarray
    widest: int  # the most strategies of a node
    costs: np.ndarray
    nb_ptr: np.ndarray
    nb_other: np.ndarray
    nb_moff: np.ndarray
    nb_own: np.ndarray
    nb_their: np.ndarray
    nb_mats: np.ndarray
    edge_moff: np.ndarray
    seg_ptr: np.ndarray
    seg_start: np.ndarray
    seg_stop: np.ndarray
    seg_uoff: np.ndarray
    seg_use: np.ndarray

    @staticmethod
    def of(costs: list[np.ndarray], edges: list[tuple[int, int, np.ndarray]],
           segments: list[list[tuple[int, int, np.ndarray]]]) -> FrozenCoreArrays:
        """A FrozenCore's costs, edges and segments flattened; each node's neighbour entries in the
        order of the edge list, as ``FrozenCore.__post_init__`` lists them."""
        segs = [seg for row in segments for seg in row]
        sizes = [len(c) for c in costs]
        ends = [w for u, v, _ in edges for w in (u, v)]
        nb_ptr = offsets(np.bincount(np.array(ends, dtype=np.int64), minlength=len(costs)).tolist())
        pool, edge_moff = matrix_pool([m if u < v else m.T for u, v, m in edges])
        seg_use, seg_uoff = vector_pool([usage for _, _, usage in segs])
        nb_other, nb_moff, nb_own, nb_their = _entries([(u, v) for u, v, _ in edges], sizes, edge_moff, nb_ptr)
        return FrozenCoreArrays(
            offsets(sizes),
            max(sizes, default=0),
            flat(costs),
            nb_ptr,
            nb_other,
            nb_moff,
            nb_own,
            nb_their,
            pool,
            edge_moff,
            offsets([len(row) for row in segments]),
            np.array([start for start, _, _ in segs], dtype=np.int64),
            np.array([stop for _, stop, _ in segs], dtype=np.int64),
            seg_uoff,
            seg_use,
        )

    def k(self, i: int) -> int:
        """Number of strategies of node i."""
        return int(self.c_off[i + 1] - self.c_off[i])

    def lower_first(self, e: int, u: int, v: int) -> np.ndarray:
        """Edge e (between u and v) as stored: the lower node's strategies as rows, a view of
        ``nb_mats``."""
        rows, cols = self.k(min(u, v)), self.k(max(u, v))
        at = int(self.edge_moff[e])
        return self.nb_mats[at:at + rows * cols].reshape(rows, cols)

    def edge_matrix(self, e: int, u: int, v: int) -> np.ndarray:
        """Edge e with u's strategies as rows and v's as columns, a view of ``nb_mats``."""
        block = self.lower_first(e, u, v)
        return block if u < v else block.T

    def neighbour_args(self) -> tuple[np.ndarray, ...]:
        """What the compiled loops over neighbour entries take: each node's costs, its entries and
        how each reads its edge's block (module formulation)."""
        return (self.c_off, self.costs, self.nb_ptr, self.nb_other, self.nb_moff, self.nb_own, self.nb_their,
                self.nb_mats)

    def segment_args(self) -> tuple[np.ndarray, ...]:
        """What the compiled loops over memory segments take."""
        return self.c_off, self.seg_ptr, self.seg_start, self.seg_stop, self.seg_uoff, self.seg_use


def _entries(edges: list[tuple[int, int]], sizes: list[int], edge_moff: np.ndarray,
             nb_ptr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every neighbour entry's neighbour, block offset and strides (``nb_other``, ``nb_moff``,
    ``nb_own``, ``nb_their``), each node's entries appended in edge order starting at ``nb_ptr``:
    at an edge's lower node a step of its own strategy is a row of the block, at the higher one a
    column."""
    free = nb_ptr[:-1].copy()
    other, moff, own, their = (np.empty(int(nb_ptr[-1]), dtype=np.int64) for _ in range(4))
    for e, (u, v) in enumerate(edges):
        for i, j in ((u, v), (v, u)):
            p = free[i]
            free[i] += 1
            other[p], moff[p] = j, edge_moff[e]
            own[p], their[p] = (sizes[j], 1) if i < j else (1, sizes[i])
    return other, moff, own, their


def offsets(sizes: list[int]) -> np.ndarray:
    """0 and the running sums of ``sizes`` (int64): where each of a run of pieces starts."""
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)


def views(whole: np.ndarray, starts: np.ndarray) -> list[np.ndarray]:
    """The pieces of ``whole`` cut at ``starts`` (as ``offsets`` makes them), as views."""
    return [whole[a:b] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]


def flat(pieces: list[np.ndarray]) -> np.ndarray:
    """The int64 pieces end to end (empty when there are none)."""
    return np.concatenate(pieces).astype(np.int64, copy=False) if pieces else np.zeros(0, dtype=np.int64)
