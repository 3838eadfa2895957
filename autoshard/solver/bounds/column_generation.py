"""The Lagrangian dual of the memory rows by column generation (Dantzig-Wolfe), and branching
on tallies under it.

The master LP mixes a pool of plans x_1..x_m (any plans, fitting or not):

    min  sum_j w_j cost(x_j)
    s.t. sum_j w_j usage_r(x_j) <= capacity_r          every memory row r        (duals lam_r >= 0)
         sum_j w_j K_t(x_j) <= k  or  >= k            the count rows of a branch (duals mu >= 0)
         sum_j w_j = 1,  w >= 0

with one artificial plan (no usage, counts inside the branch, twice the dearest cost) that keeps
it feasible. Its duals price a new plan: TRW-S on the core with every strategy's cost raised by
lam . usage (and by +-mu on a branch's marked strategies, problem.Tally), whose dual value gives

    L(lam, mu) = min_x cost(x) + lam . (usage(x) - capacity) + sum_b mu_b (K_b(x) - k_b) s_b

a lower bound on every fitting plan of the branch for any lam, mu >= 0 (weak duality; s_b = +1
for K <= k, -1 for K >= k). TRW-S's primal, polished by local search under the same penalties,
joins the pool. The duals are smoothed towards the multipliers of the best bound so far
(Wentges): lam <- a lam_best + (1 - a) lam_master. The search ends when the bound meets the
master's value (the dual is solved over the pool), when it stalls, or at its deadline.

Why: lagrangian.py's subgradient steps crawl once hundreds of rows carry weight (measured: see
benchmarks/README.md, "Column generation for the memory rows"); the master LP finds the
multipliers of every row at once, in a few dozen pricing steps.

``dive`` then branches on the most fractional count of the master's mix (``branching.branch``,
the one dive, here without setting children aside): each child's bound comes from its own column
generation (the pool is shared: a plan is a column in every branch); a child whose bound reaches
the cheapest known plan is closed, and the dive goes on while exactly one child stays open. A
child's search first prices at the root's best multipliers (no weight on the branch rows), from
TRW-S's messages as they stood at that bound: L there bounds the child too, and the child's own
master duals, from a pool built for the root, would start it far below.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from scipy.sparse import csr_array

from autoshard.solver.core.reduced import INF, FrozenCore
from autoshard.solver.core.local_search import Search
from autoshard.solver.bounds.lagrangian import row_penalties
from autoshard.solver.core.branching import Branch, Dive, branch
from autoshard.solver.bounds.trws import MessagePassing
from autoshard.solver.core.certify import safe_bound
from autoshard.solver.core.highs import LpModel, solve_lp

SMOOTHING = 0.5
"""Wentges' weight a of the best multipliers so far in each pricing step's multipliers."""
SWEEPS = 20
"""TRW-S sweeps per pricing step (the messages carry over between steps). The bound at new
multipliers is only as good as the messages' convergence there, and a step's master solve and
polish cost as much as a few sweeps, so a step sweeps many times before it prices (measured on
LLaMA-3-8B's memory-bound cores: see benchmarks/README.md, "Column generation for the memory rows")."""
POLISH_SECONDS = 0.1
"""Longest local search on a priced plan under the penalties: the column needs to be a good plan
at these multipliers, not the best one, and the time is better spent on sweeps."""
SOLVED = 1e-5
"""Relative distance between the master's value and the bound at which the dual counts as solved."""
STALL = 15
"""Pricing steps in a row that moved nothing (the master's value did not fall, and TRW-S's bound
rose by at most SOLVED over the step before) after which a branch's search stops. A step that
leaves the master as it was but raises the bound is progress: the messages are still converging
at these multipliers, and their primal is what finds the column that moves the master."""


@dataclass
class HullResult:
    """A certified lower bound on the fitting plans of the branches searched (None before the
    first pricing step), the master's value, and its mix's count per tally."""

    bound: int | None
    master: float | None
    counts: list[float] = field(default_factory=list)


class ColumnGeneration:
    """The master LP over a shared pool of plans and TRW-S pricing (module docstring)."""

    def __init__(self, comp: FrozenCore, rng: np.random.Generator, offer: Callable[[np.ndarray], object],
                 bounded: Callable[[int], object] = lambda bound: None) -> None:
        """``offer`` hears every priced plan that fits; ``bounded`` hears each better bound on
        every fitting plan as it is found (the root's, then each open child's that the dive
        enters), for a caller that may be stopped before the search returns (the hull engine's
        child, killed at the run's deadline)."""
        assert comp.capacity is not None
        self.comp, self.rng, self.offer, self.bounded = comp, rng, offer, bounded
        self.mp = MessagePassing(comp)
        self.capacity = comp.capacity.astype(np.float64)
        self.centre = np.zeros(len(self.capacity))  # the root's best multipliers once known: the branches' centre
        self.messages: tuple[np.ndarray, np.ndarray] | None = None  # TRW-S's messages at the centre's bound
        self.marked = [np.asarray([comp.arrays.c_off[node] + s for node, m in tally for s in m], dtype=np.int64)
                       for tally in comp.tallies]
        self.costs: list[float] = []
        self.usages: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []

    def add(self, x: np.ndarray) -> None:
        """Put plan ``x`` into the pool (unless it uses a forbidden strategy or pair)."""
        x = np.asarray(x, dtype=np.int64)
        cost = self.comp.cost(x)
        if cost >= INF:
            return
        self.costs.append(float(cost))
        self.usages.append(self.comp.profile(x).astype(np.float64))
        flat = self.comp.arrays.c_off[:-1] + x
        self.counts.append(np.array([np.isin(m, flat).sum() for m in self.marked], dtype=np.float64))

    def search(self, branches: list[Branch], deadline: float) -> HullResult:
        """Price plans for ``branches`` until the dual is solved, stalls, or ``deadline``."""
        best = HullResult(None, None)
        lam_best, mu_best = self.centre, np.zeros(len(branches))
        stale, last_bound, last_master = 0, -math.inf, math.inf
        if branches and self.messages is not None:  # the messages as they stood at the centre's bound
            self.mp.flat.to_u[:], self.mp.flat.to_v[:] = self.messages
        while time.monotonic() < deadline and stale < STALL:
            master = self._master(branches)
            if master is None:
                break
            value, lam_m, mu_m, counts = master
            # a branch's first step: the centre itself; the root's untried (zero) centre counts less
            a = SMOOTHING if best.bound is not None else 1.0 if branches else 0.5 * SMOOTHING
            lam, mu = a * lam_best + (1 - a) * lam_m, a * mu_best + (1 - a) * mu_m
            bound, x = self._price(branches, lam, mu, deadline)
            if x is not None:
                self.add(x)
            moved = value < last_master or bound > last_bound + SOLVED * abs(last_bound)
            stale = 0 if moved else stale + 1
            last_bound, last_master = bound, value
            if best.bound is None or bound > best.bound:
                best.bound = bound
                lam_best, mu_best = lam, mu
                if not branches:
                    self.centre = lam
                    self.messages = self.mp.flat.to_u.copy(), self.mp.flat.to_v.copy()
                    self.bounded(bound)
            best.master, best.counts = value, counts
            if value - best.bound <= SOLVED * abs(value):
                break
        return best

    def _master(self, branches: list[Branch]) -> tuple[float, np.ndarray, np.ndarray, list[float]] | None:
        """Solve the master LP: its value, the memory rows' and branch rows' duals (>= 0, in cost
        per unit) and the mix's counts; None when HiGHS gives no optimum."""
        if not self.costs:
            return None
        scale_cost = max(abs(c) for c in self.costs) or 1.0
        scale_use = float(self.capacity.max()) or 1.0
        artificial = np.array([2.0 * scale_cost])
        cost = np.concatenate([np.array(self.costs), artificial]) / scale_cost
        use = np.column_stack(self.usages + [np.zeros(len(self.capacity))]) / scale_use
        rows, rhs = [use], [self.capacity / scale_use]
        tallies = np.column_stack(self.counts) if self.counts[0].size else np.zeros((0, len(self.costs)))
        for b in branches:  # sense * K <= sense * k
            counts = np.append(tallies[b.tally], b.k)
            rows.append(b.sense * counts[None, :])
            rhs.append(np.array([b.sense * b.k], dtype=np.float64))
        upper = np.concatenate(rhs + [[1.0]])  # the <= rows, then sum_j w_j = 1
        lower = np.concatenate([np.full(len(upper) - 1, -np.inf), [1.0]])
        a = csr_array(np.vstack(rows + [np.ones((1, len(cost)))]))
        answer = solve_lp(LpModel(cost, a, lower, upper, np.zeros(len(cost)), np.full(len(cost), np.inf)))
        if answer.status != "optimal" or answer.duals is None:
            return None
        duals = -answer.duals[:-1] * scale_cost
        lam = np.maximum(duals[: len(self.capacity)] / scale_use, 0.0)
        mu = np.maximum(duals[len(self.capacity):], 0.0)
        w = answer.x[:-1]
        counts = [float(w @ tallies[t]) for t in range(len(self.marked))]
        return float(answer.value) * scale_cost, lam, mu, counts

    def _price(self, branches: list[Branch], lam: np.ndarray, mu: np.ndarray,
               deadline: float) -> tuple[int, np.ndarray | None]:
        """TRW-S on the penalised core: the certified L(lam, mu) and its polished primal. Cut
        short at ``deadline``, the bound at the messages as they stand and no primal: TRW-S's
        bound holds for any messages, and the sweeps since the last step are what moved it."""
        penalty = row_penalties(self.comp, lam)
        offset, scale = -float(lam @ self.capacity), float(np.abs(lam * self.capacity).sum())
        for b, m in zip(branches, mu):
            penalty[self.marked[b.tally]] += b.sense * m
            offset -= b.sense * m * b.k
            scale += abs(m * b.k)
        swept = all(self.mp.sweep(penalty, deadline) for _ in range(SWEEPS))
        value, magnitude = self.mp.bound(penalty)
        bound = safe_bound(value + offset, magnitude + scale)
        if not swept:
            return bound, None
        polish = Search(self.comp, self.mp.primal(penalty), self.rng, penalty=penalty)
        polish.descend(min(deadline, time.monotonic() + POLISH_SECONDS))
        if self.comp.is_feasible(polish.x):
            self.offer(polish.x)
        return bound, polish.x


class PooledCounts:
    """Column generation as the relaxation of ``branching.branch``: each child's bound from its
    own column generation over the shared pool, in an equal share of the time left."""

    def __init__(self, generation: ColumnGeneration, known: Callable[[], int | None], deadline: float,
                 counts: list[float]) -> None:
        self.generation, self.known, self.deadline = generation, known, deadline
        self.path: list[Branch] = []  # the branches taken
        self.found: list[HullResult] = []  # the children of the last step
        self.at = counts  # the master's counts inside the branches taken

    def counts(self) -> list[float]:
        return self.at

    def child(self, branch: Branch, index: int) -> int | None:
        if index == 0:
            self.found = []
        result = self.generation.search(self.path + [branch], _share(self.deadline, 2 - index))
        if result.bound is None:
            return None
        self.found.append(result)
        return result.bound

    def enter(self, branch: Branch, index: int) -> bool:
        """Into the only open child: the other holds no plan cheaper than the known one, so this
        child's bound holds for every fitting plan and the generation's ``bounded`` hears it."""
        self.path.append(branch)
        self.at = self.found[index].counts
        bound = self.found[index].bound
        if bound is not None:
            self.generation.bounded(bound)
        return True

    def ceiling(self) -> float:
        known = self.known()
        return math.inf if known is None else known

    def more(self) -> bool:
        return time.monotonic() < self.deadline


def dive(generation: ColumnGeneration, known: Callable[[], int | None], deadline: float) -> Dive:
    """Column generation at the root until its dual is solved, it stalls or ``deadline``, then
    ``branching.branch`` on the most fractional count of the master's mix while exactly one child
    stays open, each child in an equal share of the time left; ``known``: the cheapest plan's cost
    as it stands. The root goes first and for as long as it moves: a child's search starts at the
    root's best bound and, on LLaMA-3-8B's 2x8 cores, did not pass it in 45 s (benchmarks/README.md,
    "Column generation for the memory rows"), where the root's own kept rising."""
    root = generation.search([], deadline)
    if root.bound is None:
        return Dive()
    return branch(PooledCounts(generation, known, deadline, root.counts), root.bound)


def _share(deadline: float, parts: int) -> float:
    """The moment 1/``parts`` of the time left to ``deadline`` has passed."""
    now = time.monotonic()
    return now + max(0.0, deadline - now) / max(1, parts)
