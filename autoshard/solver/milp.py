"""The standard linearised ILP of a FrozenCore, solved by HiGHS (scipy): the reference optimum the
tests and the benchmark compare against (``solve_problem_milp``), and the LP relaxation that
``relax.py`` turns into a proven lower bound.

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

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array, csr_array

from autoshard.solver.problem import ShardingProblem
from autoshard.solver.core import INF, FrozenCore, Core
from autoshard.solver.memory import attach_memory


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """File descriptors 1 and 2 on /dev/null for the duration: HiGHS's C++ code prints debug
    lines of its own (e.g. ``HighsMipSolverData::transformNewIntegerFeasibleSolution``) that
    ``disp=False`` does not stop, and they must not land in the user's output; toulbar2
    (toulbar.py) likewise, and in a worker child fds 1 and 2 are the pipe the parent reads."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


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


@dataclass(frozen=True)
class MilpResult:
    """What HiGHS returned: a plan (or None), its exact cost, HiGHS's dual bound and whether it proved it."""

    choice: list[int] | None
    cost: int | None
    bound: float | None
    optimal: bool
    elapsed: float
    infeasible: bool = False


def solve_problem_milp(problem: ShardingProblem, time_limit: float | None = None) -> MilpResult:
    """HiGHS on the unreduced problem (its plan's cost is evaluated exactly on ``problem``)."""
    start = time.monotonic()
    core = Core(problem)
    attach_memory(core, problem)
    compact = core.freeze()
    left = None if time_limit is None else max(1.0, time_limit - (time.monotonic() - start))
    result = solve_core_milp(compact, left)
    elapsed = time.monotonic() - start
    if result.choice is None:
        return MilpResult(None, None, result.bound, False, elapsed)
    choice = core.expand(dict(zip(compact.nodes, result.choice)))
    ev = problem.evaluate(choice)
    if not ev.feasible:
        return MilpResult(None, None, result.bound, False, elapsed)
    return MilpResult(choice, ev.cost, result.bound, result.optimal, elapsed)


def solve_core_milp(
    compact: FrozenCore, time_limit: float | None = None, exact: bool = False, gap: float = 0.0
) -> MilpResult:
    """HiGHS MILP on a FrozenCore; the choice is in the core's local strategy indices.

    ``exact`` asks for a zero relative gap (HiGHS stops at 0.01% by default), for proofs;
    ``gap`` > 0 for that relative gap instead.
    """
    start = time.monotonic()
    if compact.capacity is not None and len(compact.capacity) and int(compact.capacity.min()) < 0:
        return MilpResult(None, None, None, False, 0.0)  # unavoidable usage over the limit
    lin = linearise(compact)
    integrality = np.zeros(lin.columns)
    integrality[: lin.nx] = 1
    constraints = [LinearConstraint(lin.a_eq, lin.b_eq, lin.b_eq)]
    options: dict = {"disp": False}
    if exact or gap > 0:
        options["mip_rel_gap"] = float(gap) if gap > 0 else 0.0
    if time_limit is not None:
        options["time_limit"] = max(1.0, float(time_limit) - (time.monotonic() - start))
    with silenced():
        res = milp(lin.c, constraints=constraints, integrality=integrality, bounds=Bounds(0, lin.upper),
                   options=options)
    elapsed = time.monotonic() - start
    bound = getattr(res, "mip_dual_bound", None)
    bound = None if bound is None or not np.isfinite(bound) else float(bound) + compact.const
    if res.x is None:
        return MilpResult(None, None, bound, False, elapsed, infeasible=res.status == 2)
    choice = lin.choice(res.x)
    return MilpResult(choice, compact.cost(choice), bound, res.status == 0, elapsed)
