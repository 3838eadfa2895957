"""Branching on tallies: whole-number counts that a relaxation splits (``problem.Tally``).

Identical layers let a relaxation's optimum split one layer's choice (20.6 of 32 layers
recompute). Branching on a single node does not raise the bound there, since another layer
takes the fraction, so HiGHS's branch and bound stalls at the LP bound. The count itself is
whole in every plan:

    K_t = sum over the groups g of tally t of  sum_{s marked in g} x[node_g, s]  in {0, 1, ..., |t|}

``branch`` is the one dive, over any relaxation that gives certified bounds and counts (the
``Relaxation`` protocol: the LP here, ``LpCounts``; the Lagrangian dual by column generation,
bounds/column_generation.py). It picks the tally whose count is the most fractional (value v)
and bounds both children, K_t <= floor(v) and K_t >= ceil(v). A child holds no plan cheaper than
the cheapest known one when its certified bound reaches that cost, and none at all when it is
infeasible: it is closed. A child whose bound is within ``aside`` (a share) of that cost, but
below it, is *set aside*: the dive keeps its bound but does not search it (its relaxation is
tight at the known plan, up to the duals' tolerance). While exactly one child stays open and not
set aside the dive goes on inside it. It stops when both children stay open, when no count is
fractional, or when the relaxation says so (its deadline). Every plan cheaper than the known
one lies in the open region, so

    lower bound on such plans = min over the open children of their certified bounds

capped at the least bound of the children set aside (``Dive.aside``).

``dive`` is the LP's dive, before HiGHS's MILP (engines/milp.py): each LP optimum on the way, the
children's included, every node rounded to its largest value, is kept as a plan when it fits
and costs less than the known one (which it then becomes) before the children are judged
against it; the MILP then searches only the region the dive went on in (the rows it returns).
The LP's bounds are certified by the Lagrangian dual function at HiGHS's duals, valid for any
duals (core/certify.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from autoshard.solver.core.certify import lagrangian_bound
from autoshard.solver.core.highs import Highs, LpModel
from autoshard.solver.core.ilp import Linearised
from autoshard.solver.core.reduced import FrozenCore

INFEASIBLE = 2**62
"""The bound of a child whose LP has no solution."""
FRACTIONAL = 1e-6
"""A count within this of a whole number is taken as whole (HiGHS's primal tolerance is 1e-7)."""
ASIDE = 1e-6
"""A child of the LP's dive whose bound is below the known cost by at most this share of it is set aside."""


@dataclass(frozen=True)
class Branch:
    """``K_t <= k`` (``sense`` +1) or ``K_t >= k`` (``sense`` -1) for tally ``t``."""

    tally: int
    sense: int
    k: int


@dataclass
class Dive:
    """Where a dive ended: the branches every plan cheaper than the known one lies in (beside the
    children set aside, whose least bound is ``aside``), a certified bound on those plans (None
    when the relaxation gave none), and ``closed`` when the branches hold none."""

    branches: list[Branch] = field(default_factory=list)
    bound: int | None = None
    aside: int | None = None
    closed: bool = False


class Relaxation(Protocol):
    """What ``branch`` dives in: a relaxation of the plans inside the branches taken so far."""

    def counts(self) -> list[float]:
        """Each tally's count at the relaxation's optimum (inside the branches taken)."""

    def child(self, branch: Branch, index: int) -> int | None:
        """The certified bound with ``branch`` added (INFEASIBLE when nothing is left), for the
        ``index``-th of the two children; None when out of time."""

    def enter(self, branch: Branch, index: int) -> bool:
        """Go on inside ``branch`` (the ``index``-th child); False when out of time."""

    def ceiling(self) -> float:
        """The cost of the cheapest plan known (a child at or above it is closed)."""

    def more(self) -> bool:
        """Whether another branching step may start."""


def branch(relaxation: Relaxation, bound: int, aside: float = 0.0) -> Dive:
    """The dive from the root's certified ``bound`` (module docstring): branch on the most
    fractional count while exactly one child stays open and not set aside (``aside`` > 0)."""
    dive = Dive(bound=bound)
    while relaxation.more():
        counts = relaxation.counts()
        t = most_fractional(counts)
        if t is None:
            break
        children = [Branch(t, 1, math.floor(counts[t])), Branch(t, -1, math.ceil(counts[t]))]
        bounds = []
        for i, child in enumerate(children):
            value = relaxation.child(child, i)
            if value is None:
                return dive  # out of time: the dive so far stands
            bounds.append(value)
        ceiling = relaxation.ceiling()
        open_children = [i for i, b in enumerate(bounds) if b < ceiling]
        if aside > 0 and len(open_children) == 2:
            searched = [i for i in open_children if bounds[i] < ceiling - aside * ceiling]
            if len(searched) == 1:
                dive.aside = max(bounds) if dive.aside is None else min(dive.aside, max(bounds))
                open_children = searched
        if len(open_children) != 1:
            dive.bound = capped(max(dive.bound, min(bounds)), dive.aside)
            dive.closed = not open_children
            break
        kept = open_children[0]
        dive.branches.append(children[kept])
        dive.bound = capped(max(dive.bound, bounds[kept]), dive.aside)
        if not relaxation.enter(children[kept], kept):
            break
    return dive


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


@dataclass(frozen=True)
class CountRow:
    """``lower <= sum of z[columns] <= upper``: one tally's count held to one side of a branch."""

    columns: np.ndarray
    lower: float
    upper: float


@dataclass
class Region:
    """The LP's dive as the MILP takes it: the count rows of the branches searched on, the
    ``Dive``'s bound, aside and closed, and the cheapest plan that rounding the LPs' optima gave
    when it beat the known one (``plan``, ``cost``)."""

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


class LpCounts:
    """The LP relaxation of the core's ILP as a ``Relaxation``: HiGHS's LP with the count rows of
    the branches taken, each optimum rounded into a plan on the way (``_round``)."""

    def __init__(self, highs: Highs, comp: FrozenCore, lin: Linearised, known: int | None,
                 deadline: float | None, region: Region) -> None:
        self.highs, self.comp, self.lin, self.deadline, self.region = highs, comp, lin, deadline, region
        self.known = known  # the cheapest plan's cost, lowered by each rounded optimum that beats it
        self.columns = tally_columns(comp, lin.offsets)
        self.rounds = 4 * len(self.columns) + 8

    def row(self, branch: Branch) -> CountRow:
        """``branch`` as a row of the LP."""
        bound = float(branch.k)
        return CountRow(self.columns[branch.tally], -np.inf if branch.sense > 0 else bound,
                        bound if branch.sense > 0 else np.inf)

    def counts(self) -> list[float]:
        x = self.highs.x()
        self.known = _round(self.comp, self.lin.choice(x), self.known, self.region)
        return [float(x[cols].sum()) for cols in self.columns]

    def child(self, branch: Branch, index: int) -> int | None:
        bound, x = _child_bound(self.highs, self.row(branch), self.comp.const, self.deadline)
        if bound is not None and x is not None:
            self.known = _round(self.comp, self.lin.choice(x), self.known, self.region)
        return bound

    def enter(self, branch: Branch, index: int) -> bool:
        row = self.row(branch)
        self.highs.add_row(row.columns, row.lower, row.upper)
        return self.highs.run_until(self.deadline)

    def ceiling(self) -> float:
        return INFEASIBLE if self.known is None else self.known

    def more(self) -> bool:
        self.rounds -= 1
        return self.rounds >= 0


def dive(model: LpModel, comp: FrozenCore, lin: Linearised, known: int | None,
         deadline: float | None) -> Region:
    """The LP's dive (module docstring) from the cheapest known plan's cost ``known``. ``model``
    is the core's ILP ``lin`` as HiGHS takes it (milp.ilp_model); its integrality is ignored here."""
    region = Region()
    if not comp.tallies:
        return region
    highs = Highs(model.relaxed())
    if not highs.run_until(deadline):
        return region
    relaxation = LpCounts(highs, comp, lin, known, deadline, region)
    ended = branch(relaxation, certified_bound(highs, comp.const), ASIDE)
    region.rows = [relaxation.row(b) for b in ended.branches]
    region.bound, region.aside, region.closed = ended.bound, ended.aside, ended.closed
    return region


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


def certified_bound(highs: Highs, const: int) -> int:
    """A valid integer lower bound of the LP ``highs`` has just run, plus ``const``, from its row
    duals (certify.py: valid for any duals, so neither HiGHS's tolerances nor an LP cut short
    can inflate it)."""
    lp = highs.model()
    bound, _ = lagrangian_bound(lp.c, lp.a, highs.duals(), lp.row_lower, lp.row_upper, lp.col_lower,
                                lp.col_upper, const)
    return bound


def _child_bound(highs: Highs, child: CountRow, const: int,
                 deadline: float | None) -> tuple[int | None, np.ndarray | None]:
    """The certified bound of the LP with ``child``'s row added (INFEASIBLE when that LP is
    infeasible; None when no duals came back: the deadline) and its optimum (None if it has
    none), the row taken off again."""
    highs.add_row(child.columns, child.lower, child.upper)
    try:
        optimal = highs.run_until(deadline)
        if not optimal and highs.infeasible:
            return INFEASIBLE, None
        bound = certified_bound(highs, const) if highs.duals() is not None else None
        return bound, highs.x() if optimal else None
    finally:
        highs.drop_last_row()
