"""Branching on tallies: whole-number counts that the LP relaxation splits (``problem.Tally``).

Identical layers let the LP's optimum split one layer's choice (20.6 of 32 layers recompute).
Branching on a single node does not raise the bound there, since another layer takes the
fraction, so HiGHS's branch and bound stalls at the LP bound. The count itself is whole in
every plan:

    K_t = sum over the groups g of tally t of  sum_{s marked in g} x[node_g, s]  in {0, 1, ..., |t|}

``dive`` solves the LP and picks the tally whose count is the most fractional (value v). It
then solves both children, K_t <= floor(v) and K_t >= ceil(v). A child holds no plan cheaper
than the cheapest known one (``known``) when its certified bound reaches that cost, and none
at all when its LP is infeasible: it is closed. A child whose bound is within ASIDE of that
cost, but below it, is *set aside*: the region keeps its bound but is not searched further
(its LP is tight at the known plan, up to the duals' tolerance). While exactly one child stays
open and not set aside the dive goes on inside it. It stops when both children stay open, when
no count is fractional, or at its deadline. Each LP optimum on the way, the children's
included, every node rounded to its largest value, is kept as a plan when it fits and costs
less than ``known`` (which it then becomes) before the children are judged against it. Every
plan cheaper than ``known`` lies in the open region, so

    lower bound on such plans = min over the open children of their certified LP bounds

and the MILP then searches only the region the dive went on in (the rows it returns); every
bound it gives is capped at the least bound of the children set aside (``Region.aside``).
The bounds are certified as in lp.py: the Lagrangian dual function at HiGHS's duals, valid
for any duals (certify.py).

"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import highspy
import numpy as np
from scipy.sparse import csc_array

from autoshard.solver.core.reduced import FrozenCore
from autoshard.solver.core.ilp import Linearised
from autoshard.solver.procs.silence import silenced
from autoshard.solver.core.certify import lagrangian_bound

INFEASIBLE = 2**62
"""The bound of a child whose LP has no solution."""
FRACTIONAL = 1e-6
"""A count within this of a whole number is taken as whole (HiGHS's primal tolerance is 1e-7)."""
ASIDE = 1e-6
"""A child whose bound is below the known cost by at most this share of it is set aside."""


@dataclass(frozen=True)
class CountRow:
    """``lower <= sum of z[columns] <= upper``: one tally's count held to one side of a branch."""

    columns: np.ndarray
    lower: float
    upper: float


@dataclass
class Region:
    """Where every plan cheaper than the known one lies: the region searched on (``rows``) and
    the children set aside, whose least bound is ``aside``; a certified lower bound on those
    plans (None before the first LP finished); ``closed`` when the region searched on holds
    none; the cheapest plan that rounding the LPs' optima gave when it beat the known one
    (``plan``)."""

    rows: list[CountRow] = field(default_factory=list)
    bound: int | None = None
    aside: int | None = None
    closed: bool = False
    plan: list[int] | None = None
    cost: int | None = None


def tally_columns(comp: FrozenCore, offsets: np.ndarray) -> list[np.ndarray]:
    """The ILP columns x[node, s] each tally of ``comp`` sums (``offsets``: where each node's block starts)."""
    return [np.concatenate([offsets[node] + marked for node, marked in tally]).astype(np.int32)
            for tally in comp.tallies]


def dive(model: highspy.HighsLp, comp: FrozenCore, lin: Linearised, known: int | None,
         deadline: float | None) -> Region:
    """Branch on the most fractional tally while one child closes (module docstring). ``model``
    is the core's ILP ``lin`` as HiGHS takes it (milp._highs_lp); its integrality is ignored here."""
    counts = tally_columns(comp, lin.offsets)
    region = Region()
    if not counts:
        return region
    lp = highspy.HighsLp()  # the model without its integrality: the relaxation
    lp.num_col_, lp.num_row_ = model.num_col_, model.num_row_
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = model.col_cost_, model.col_lower_, model.col_upper_
    lp.row_lower_, lp.row_upper_ = model.row_lower_, model.row_upper_
    lp.a_matrix_ = model.a_matrix_
    with silenced():  # the constructor prints HiGHS's banner
        highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.passModel(lp)
    if not _solve(highs, deadline):
        return region
    region.bound = certified_bound(highs, comp.const)
    for _ in range(4 * len(counts) + 8):
        x = np.asarray(highs.getSolution().col_value)
        known = _round(comp, lin.choice(x), known, region)
        values = [float(x[cols].sum()) for cols in counts]
        t = most_fractional(values)
        if t is None:
            break
        children = [CountRow(counts[t], -np.inf, float(math.floor(values[t]))),
                    CountRow(counts[t], float(math.ceil(values[t])), np.inf)]
        bounds = []
        for child in children:
            bound, x = _child_bound(highs, child, comp.const, deadline)
            if bound is None:
                return region  # out of time: the region so far stands
            if x is not None:
                known = _round(comp, lin.choice(x), known, region)
            bounds.append(bound)
        ceiling = INFEASIBLE if known is None else known
        open_children = [c for c, b in zip(children, bounds) if b < ceiling]
        searched = [c for c, b in zip(children, bounds) if b < ceiling - ASIDE * ceiling]
        if len(open_children) == 2 and len(searched) == 1:
            aside = max(bounds)
            region.aside = aside if region.aside is None else min(region.aside, aside)
            open_children = searched
        if len(open_children) != 1:
            region.bound = capped(max(region.bound, min(bounds)), region.aside)
            region.closed = not open_children
            break
        kept = open_children[0]
        region.rows.append(kept)
        _add(highs, kept)
        region.bound = capped(max(region.bound, bounds[children.index(kept)]), region.aside)
        if not _solve(highs, deadline):
            break
    return region


def capped(bound: float, aside: int | None) -> float:
    """``bound`` on the region searched on, as a bound on it and the children set aside."""
    return bound if aside is None else min(bound, aside)


def most_fractional(values: list[float]) -> int | None:
    """The index of the value farthest from a whole number, or None when every one is within
    FRACTIONAL of one (the count to branch on)."""
    distance = [min(v - math.floor(v), math.ceil(v) - v) for v in values]
    if not distance or max(distance) <= FRACTIONAL:
        return None
    return int(np.argmax(distance))


def _round(comp: FrozenCore, choice: list[int], known: int | None, region: Region) -> int | None:
    """The LP optimum rounded (each node's largest value) as a plan, kept in ``region`` when it
    fits and beats ``known`` (once the counts are whole, one or two fractional nodes are typically
    all that is left, and rounding them often lands within microseconds of the bound). Returns
    the cheapest cost known."""
    cost = comp.cost(choice)
    if (known is None or cost < known) and comp.is_feasible(choice):
        region.plan, region.cost = choice, cost
        return cost
    return known


def certified_bound(highs: highspy.Highs, const: int) -> int:
    """A valid integer lower bound of the LP ``highs`` has just run, plus ``const``, from its row
    duals (certify.py: valid for any duals, so neither HiGHS's tolerances nor an LP cut short
    can inflate it)."""
    lp = highs.getLp()
    a = csc_array((np.asarray(lp.a_matrix_.value_), np.asarray(lp.a_matrix_.index_),
                   np.asarray(lp.a_matrix_.start_)), shape=(lp.num_row_, lp.num_col_))
    bound, _ = lagrangian_bound(np.asarray(lp.col_cost_, dtype=np.float64), a,
                                np.asarray(highs.getSolution().row_dual, dtype=np.float64),
                                np.asarray(lp.row_lower_), np.asarray(lp.row_upper_),
                                np.asarray(lp.col_lower_), np.asarray(lp.col_upper_), const)
    return bound


def _add(highs: highspy.Highs, row: CountRow) -> None:
    highs.addRow(row.lower, row.upper, len(row.columns), row.columns, np.ones(len(row.columns)))


def _child_bound(highs: highspy.Highs, child: CountRow, const: int,
                 deadline: float | None) -> tuple[int | None, np.ndarray | None]:
    """The certified bound of the LP with ``child``'s row added (INFEASIBLE when that LP is
    infeasible; None when no duals came back: the deadline) and its optimum (None if it has
    none), the row taken off again."""
    _add(highs, child)
    last = highs.getNumRow() - 1
    try:
        optimal = _solve(highs, deadline)
        if not optimal and highs.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
            return INFEASIBLE, None
        bound = certified_bound(highs, const) if highs.getSolution().dual_valid else None
        return bound, np.asarray(highs.getSolution().col_value) if optimal else None
    finally:
        highs.deleteRows(1, np.array([last], dtype=np.int32))


def _solve(highs: highspy.Highs, deadline: float | None) -> bool:
    """Run HiGHS's LP within the deadline; True when it reached an optimum. A warm start from a
    run that ended without an optimum (status Unknown) can end with no status at all and no
    duals; such a run is repeated once from scratch."""
    for _ in range(2):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0.1:
                return False
            highs.setOptionValue("time_limit", left)
        highs.run()
        if highs.getModelStatus() != highspy.HighsModelStatus.kNotset:
            break
        highs.clearSolver()
    return highs.getModelStatus() == highspy.HighsModelStatus.kOptimal
