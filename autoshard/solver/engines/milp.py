"""The core's ILP (ilp.py) solved by HiGHS (highspy): the reference optimum the tests and
the benchmark compare against (``solve_problem_milp``), the exact engine beside toulbar2
(run/workers.py); its LP relaxation is what ``bounds/lp.py`` turns into a proven lower bound.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable

import highspy
import numpy as np
from scipy.sparse import diags_array

from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver.core.reduced import FrozenCore, Core
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.core.ilp import Linearised, linearise
from autoshard.solver.procs.silence import silenced
from autoshard.solver.core.branching import Region, capped, dive
from autoshard.solver.core.certify import tolerant_bound


LEVEL_BITS = 16
"""Memory levels are handed to HiGHS in units that put the largest capacity near 2**16. In bytes
(capacities near 2**36 beside 0/1 columns) its MIP presolve declared fitting LLaMA-3-8B cores
infeasible; with capacities near 2**10 its root LP took minutes where it takes seconds near 2**16
(benchmarks/README.md, "Measurements behind the design")."""

_scheduler_pid: int | None = None
"""The process whose HiGHS thread pool exists: a forked child inherits the pool's state but not
its threads, and HiGHS waits on them forever unless the pool is reset first."""


def _own_scheduler() -> None:
    """Reset HiGHS's thread pool when it was started by the process this one was forked from."""
    global _scheduler_pid
    if _scheduler_pid is not None and _scheduler_pid != os.getpid():
        highspy.Highs.resetGlobalScheduler(False)
    _scheduler_pid = os.getpid()


@dataclass(frozen=True)
class MilpResult:
    """What HiGHS returned: a plan (or None), its exact cost, HiGHS's dual bound and whether it proved it."""

    choice: list[int] | None
    cost: int | None
    bound: float | None
    optimal: bool
    elapsed: float
    infeasible: bool = False
    certified: int | None = None  # a bound certified before the MILP (branching.py), cost units, constant included


Progress = Callable[[str, int, list[int] | None], None]
"""``progress(kind, value, plan)`` while HiGHS runs: ``("plan", cost, choice)`` for each better
plan that fits (cost exact, choice in the core's local indices), ``("bound", lower, None)`` each
time the proven lower bound rises (already less the tolerance margin of ``highs_lower_bound``)."""


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


def highs_lower_bound(comp: FrozenCore, dual_bound: float) -> int:
    """HiGHS's dual bound (of the core's objective, without its constant) as an integer lower
    bound of the problem (``certify.tolerant_bound``)."""
    return tolerant_bound(dual_bound) + comp.const


def solve_core_milp(
    compact: FrozenCore, time_limit: float | None = None, exact: bool = False, gap: float = 0.0,
    start: list[int] | None = None, progress: Progress | None = None,
) -> MilpResult:
    """HiGHS MILP on a FrozenCore; the choice is in the core's local strategy indices.

    ``exact`` asks for a zero relative gap (HiGHS stops at 0.01% by default), for proofs;
    ``gap`` > 0 for that relative gap instead. ``start``: a plan HiGHS begins from (its cost
    prunes the search from the first node). ``progress`` hears plans and bounds as they come,
    so a caller that is stopped at a deadline keeps what HiGHS had found. A core with tallies
    and memory rows is first narrowed by branching on its counts (branching.py): HiGHS then searches
    only the region that can hold a plan cheaper than ``start``, and a region that holds none
    proves ``start`` optimal.
    """
    begun = time.monotonic()
    if compact.capacity is not None and len(compact.capacity) and int(compact.capacity.min()) < 0:
        return MilpResult(None, None, None, False, 0.0)  # unavoidable usage over the limit
    lin = linearise(compact)
    _own_scheduler()
    with silenced():  # the constructor prints HiGHS's banner
        highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("mip_rel_gap", float(gap) if gap > 0 else 0.0 if exact else 1e-4)
    model = _highs_lp(lin, 0 if compact.capacity is None else len(compact.capacity))
    known = None if start is None else compact.cost(start)
    region = Region()
    if compact.tallies and compact.has_memory:
        region = dive(model, compact, lin, known, None if time_limit is None else begun + time_limit)
        if region.plan is not None:
            start, known = region.plan, region.cost
            if progress is not None:
                progress("plan", known, list(start))
        if progress is not None and region.bound is not None and (known is None or region.bound < known):
            progress("bound", region.bound, None)
        if region.closed and start is not None:  # a proof, unless children were set aside
            return MilpResult(list(start), known, None, region.aside is None, time.monotonic() - begun,
                              certified=region.bound)
    if time_limit is not None:
        highs.setOptionValue("time_limit", max(1.0, float(time_limit) - (time.monotonic() - begun)))
    highs.passModel(model)
    for row in region.rows:
        highs.addRow(row.lower, row.upper, len(row.columns), row.columns, np.ones(len(row.columns)))
    if start is not None:
        picked = lin.offsets[:-1] + np.asarray(start, dtype=np.int64)
        highs.setSolution(len(picked), picked.astype(np.int32), np.ones(len(picked)))
    if progress is not None:
        _listen(highs, compact, lin, progress, known, region.bound, region.aside)
    with silenced():
        highs.run()
    elapsed = time.monotonic() - begun
    status = highs.getModelStatus()
    info = highs.getInfo()
    # an infeasible verdict (no proof with memory rows: tolerances) sets the dual bound to the cutoff
    trusted = np.isfinite(info.mip_dual_bound) and status != highspy.HighsModelStatus.kInfeasible
    bound = capped(float(info.mip_dual_bound) + compact.const, region.aside) if trusted else None
    if info.primal_solution_status != highspy.SolutionStatus.kSolutionStatusFeasible:
        return MilpResult(None, None, bound, False, elapsed, infeasible=status == highspy.HighsModelStatus.kInfeasible
                          and not region.rows, certified=region.bound)
    choice = lin.choice(np.asarray(highs.getSolution().col_value))
    cost = compact.cost(choice)
    optimal = status == highspy.HighsModelStatus.kOptimal and (region.aside is None or cost <= region.aside)
    if region.rows and known is not None and cost >= known:  # the region holds nothing cheaper than the start
        choice, cost = list(start), known
    return MilpResult(choice, cost, bound, optimal, elapsed, certified=region.bound)


def _highs_lp(lin: Linearised, rows_mem: int) -> highspy.HighsLp:
    """The linearised ILP as HiGHS's model: equality rows, the x columns integer, and the last
    ``rows_mem`` rows and columns (the memory levels) in a power-of-two unit that puts the
    largest capacity near 2**LEVEL_BITS: the same constraints, divided through exactly."""
    a = lin.a_eq.tocsr()
    upper = lin.upper.copy()
    if rows_mem:
        levels = slice(lin.columns - rows_mem, lin.columns)
        unit = 2.0 ** max(0, math.floor(math.log2(max(float(upper[levels].max()), 1.0))) - LEVEL_BITS)
        row_scale = np.ones(a.shape[0])
        row_scale[a.shape[0] - rows_mem:] = 1 / unit
        col_scale = np.ones(lin.columns)
        col_scale[levels] = unit  # level' = level / unit keeps its +-1 coefficients
        a = (diags_array(row_scale) @ a @ diags_array(col_scale)).tocsr()
        upper[levels] /= unit
    a = a.tocsc()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = lin.columns, a.shape[0]
    lp.col_cost_ = lin.c
    lp.col_lower_, lp.col_upper_ = np.zeros(lin.columns), upper
    lp.row_lower_ = lp.row_upper_ = lin.b_eq
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
    lp.integrality_ = [highspy.HighsVarType.kInteger] * lin.nx + [highspy.HighsVarType.kContinuous] * (
        lin.columns - lin.nx)
    return lp


def _listen(highs: highspy.Highs, comp: FrozenCore, lin: Linearised, progress: Progress, known: int | None,
            reported: int | None = None, cap: int | None = None) -> None:
    """Pass HiGHS's better plans (checked exactly on the core) and rising bounds to ``progress``.
    Bounds are passed only below the cheapest plan known (``known``: the start's cost): one that
    reaches it says the search has ended, and only HiGHS's final status tells a proof from a
    tolerance-made verdict of infeasibility. ``reported``: the bound already passed on; ``cap``:
    the bound of the region HiGHS does not search (branching.py's children set aside)."""
    best: list[int | None] = [known, reported]  # cheapest plan known, highest bound reported

    def improved(event: highspy.HighsCallbackEvent) -> None:
        choice = lin.choice(np.asarray(event.data_out.mip_solution))
        cost = comp.cost(choice)
        if comp.is_feasible(choice) and (best[0] is None or cost < best[0]):
            best[0] = cost
            progress("plan", cost, choice)

    def polled(event: highspy.HighsCallbackEvent) -> None:
        dual = float(event.data_out.mip_dual_bound)
        if np.isfinite(dual):
            lower = int(capped(highs_lower_bound(comp, dual), cap))
            if (best[1] is None or lower > best[1]) and (best[0] is None or lower < best[0]):
                best[1] = lower
                progress("bound", lower, None)

    highs.cbMipImprovingSolution.subscribe(improved)
    highs.cbMipInterrupt.subscribe(polled)
