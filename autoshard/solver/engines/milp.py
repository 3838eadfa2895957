"""The core's ILP (ilp.py) solved by HiGHS (core/highs.py): the reference optimum the tests and
the benchmark compare against (``solve_problem_milp``), the exact engine beside toulbar2
(run/workers.py); its LP relaxation is what ``bounds/lp.py`` turns into a proven lower bound.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.sparse import diags_array

from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver.core.reduced import FrozenCore, Core
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.core.ilp import Linearised, linearise
from autoshard.solver.core.highs import Highs, LpModel
from autoshard.solver.core.branching import Region, capped, dive
from autoshard.solver.core.certify import tolerant_bound


LEVEL_BITS = 16
"""Memory levels are handed to HiGHS in units that put the largest capacity near 2**16. In bytes
(capacities near 2**36 beside 0/1 columns) its MIP presolve declared fitting LLaMA-3-8B cores
infeasible; with capacities near 2**10 its root LP took minutes where it takes seconds near 2**16
(benchmarks/README.md, "Measurements behind the design")."""

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
    model = ilp_model(lin, 0 if compact.capacity is None else len(compact.capacity))
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
    highs = Highs(model, mip_rel_gap=float(gap) if gap > 0 else 0.0 if exact else 1e-4)
    for row in region.rows:
        highs.add_row(row.columns, row.lower, row.upper)
    if start is not None:
        highs.start_from(lin.offsets[:-1] + np.asarray(start, dtype=np.int64))
    if progress is not None:
        _listen(highs, compact, lin, progress, known, region.bound, region.aside)
    highs.run(None if time_limit is None else max(1.0, float(time_limit) - (time.monotonic() - begun)))
    elapsed = time.monotonic() - begun
    dual = highs.dual_bound()
    # an infeasible verdict (no proof with memory rows: tolerances) sets the dual bound to the cutoff
    trusted = np.isfinite(dual) and not highs.infeasible
    bound = capped(dual + compact.const, region.aside) if trusted else None
    if not highs.has_solution():
        return MilpResult(None, None, bound, False, elapsed, infeasible=highs.infeasible and not region.rows,
                          certified=region.bound)
    choice = lin.choice(highs.x())
    cost = compact.cost(choice)
    optimal = highs.optimal and (region.aside is None or cost <= region.aside)
    if region.rows and known is not None and cost >= known:  # the region holds nothing cheaper than the start
        choice, cost = list(start), known
    return MilpResult(choice, cost, bound, optimal, elapsed, certified=region.bound)


def ilp_model(lin: Linearised, rows_mem: int) -> LpModel:
    """The linearised ILP as HiGHS takes it: equality rows, the x columns integer, and the last
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
    return LpModel(lin.c, a.tocsc(), lin.b_eq, lin.b_eq, np.zeros(lin.columns), upper, integers=lin.nx)


def _listen(highs: Highs, comp: FrozenCore, lin: Linearised, progress: Progress, known: int | None,
            reported: int | None = None, cap: int | None = None) -> None:
    """Pass HiGHS's better plans (checked exactly on the core) and rising bounds to ``progress``.
    Bounds are passed only below the cheapest plan known (``known``: the start's cost): one that
    reaches it says the search has ended, and only HiGHS's final status tells a proof from a
    tolerance-made verdict of infeasibility. ``reported``: the bound already passed on; ``cap``:
    the bound of the region HiGHS does not search (branching.py's children set aside)."""
    best: list[int | None] = [known, reported]  # cheapest plan known, highest bound reported

    def improved(z: np.ndarray) -> None:
        choice = lin.choice(z)
        cost = comp.cost(choice)
        if comp.is_feasible(choice) and (best[0] is None or cost < best[0]):
            best[0] = cost
            progress("plan", cost, choice)

    def polled(dual: float) -> None:
        if np.isfinite(dual):
            lower = int(capped(highs_lower_bound(comp, dual), cap))
            if (best[1] is None or lower > best[1]) and (best[0] is None or lower < best[0]):
                best[1] = lower
                progress("bound", lower, None)

    highs.listen(improved, polled)
