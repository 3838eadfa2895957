"""The standard linearised ILP of a FrozenCore, which HiGHS solves (milp.py) and relaxes (lp.py,
branching.py):

    x[i,s] in {0,1},  y[e,s,t] in [0,1],  0 <= level[r] <= capacity[r]
    minimise   sum c_i[s] x[i,s] + sum m_e[s,t] y[e,s,t]
    subject to sum_s x[i,s] = 1                                  (one strategy per node)
               sum_t y[e,s,t] = x[u,s],  sum_s y[e,s,t] = x[v,t]  (y is the pair's indicator)
               level[r] = level[r-1] + usage of segments starting at r - usage of those ending at r
                                                                  (memory in use at row r)
    forbidden entries (cost >= INF) have upper bound 0.

The memory rows are written as a running level (each segment enters twice) rather than as one
inequality per row listing every live segment: the same LP, but linear in size — the latter
grows with rows times live segments and does not fit in memory on large instances (measured: see
benchmarks/README.md, "Measurements behind the design").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_array, csr_array

from autoshard.solver.core.reduced import INF, FrozenCore


@dataclass
class Linearised:
    """min c.z  s.t.  a_eq z = b_eq,  0 <= z <= upper; the first ``nx`` entries of z are the
    x[i,s] (node i's block starts at ``offsets[i]``), then the y, then the memory levels."""

    c: np.ndarray
    a_eq: csr_array
    b_eq: np.ndarray
    upper: np.ndarray
    offsets: np.ndarray

    @property
    def nx(self) -> int:
        """Number of node variables."""
        return int(self.offsets[-1])

    @property
    def columns(self) -> int:
        """Number of variables."""
        return len(self.c)

    def choice(self, z: np.ndarray) -> list[int]:
        """Each node's strategy with the largest x value."""
        return [int(np.argmax(z[self.offsets[i] : self.offsets[i + 1]])) for i in range(len(self.offsets) - 1)]


def linearise(comp: FrozenCore) -> Linearised:
    """Build the standard ILP of ``comp`` (forbidden entries get cost 0 and upper bound 0)."""
    offsets = np.concatenate([[0], np.cumsum([len(c) for c in comp.costs])]).astype(np.int64)
    nx = int(offsets[-1])
    flat = np.concatenate(comp.costs) if comp.costs else np.zeros(0, dtype=np.int64)
    objective, upper = [np.where(flat < INF, flat, 0).astype(np.float64)], [(flat < INF).astype(np.float64)]
    rows, cols, vals = [np.repeat(np.arange(comp.n), np.diff(offsets))], [np.arange(nx)], [np.ones(nx)]
    row, col = comp.n, nx
    for u, v, m in comp.edges:
        ku, kv = m.shape
        ids = col + np.arange(ku * kv).reshape(ku, kv)
        objective.append(np.where(m < INF, m, 0).astype(np.float64).ravel())
        upper.append((m < INF).astype(np.float64).ravel())
        rows += [np.repeat(row + np.arange(ku), kv), row + np.arange(ku)]
        cols += [ids.ravel(), offsets[u] + np.arange(ku)]
        vals += [np.ones(ku * kv), -np.ones(ku)]
        row += ku
        rows += [np.tile(row + np.arange(kv), ku), row + np.arange(kv)]
        cols += [ids.ravel(), offsets[v] + np.arange(kv)]
        vals += [np.ones(ku * kv), -np.ones(kv)]
        row += kv
        col += ku * kv
    capacity = np.zeros(0) if comp.capacity is None else comp.capacity.astype(np.float64)
    rows_mem = len(capacity)
    level = col + np.arange(rows_mem)  # column of level[r]; row (row + r) defines it
    rows += [row + np.arange(rows_mem), row + np.arange(1, rows_mem)]
    cols += [level, level[:-1]]
    vals += [np.ones(rows_mem), -np.ones(max(rows_mem - 1, 0))]
    for i, segs in enumerate(comp.segments):
        for start, stop, usage in segs:
            nz = np.flatnonzero(usage)
            rows.append(np.full(len(nz), row + start))
            cols.append(offsets[i] + nz)
            vals.append(-usage[nz].astype(np.float64))
            if stop < rows_mem:
                rows.append(np.full(len(nz), row + stop))
                cols.append(offsets[i] + nz)
                vals.append(usage[nz].astype(np.float64))
    objective.append(np.zeros(rows_mem))
    upper.append(capacity)
    row += rows_mem
    col += rows_mem
    b_eq = np.zeros(row)
    b_eq[: comp.n] = 1.0
    a_eq = coo_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(row, col)).tocsr()
    return Linearised(np.concatenate(objective), a_eq, b_eq, np.concatenate(upper), offsets)
