"""Branch and bound on memory usage levels, each branch bounded by the exact Lagrangian dual.

The dual's maximum (exact_lagrangian.dual_search) can stay well below the optimum when a few nodes
hold most of a tight row (IOPDDL V: 0.844; no multipliers close that gap). Splitting the plans by
the usage of one such node closes it branch by branch: with lam the multipliers of the branch's
parent and w_i[s] = sum_r lam_r usage_{i,r}[s] the priced usage of node i's strategy s, the
children of a branch B are

    B_l = B ∩ {x : w_i[x_i] = l}     for each level l of w_i over the strategies B allows,

which partition B. Every plan of B_l costs at least max_lam L_l(lam), the dual of the core with
only those strategies of node i allowed (the cut plans of the parent that B_l allows and its
multipliers warm-start it: every plan x of B_l gives the cut L_l(lam) <= cost(x) + lam . (usage(x) -
capacity), which seeds the cutting-plane model, and the closing test's minimum, when proved, is the
dual's first step), so a branch whose certified dual is at least ``upper`` (the best plan's
cost) holds no cheaper plan and is closed. The branched node is the one whose levels spread most
under lam; where no level spreads under lam (rows at lam 0), the node with most distinct usage
vectors is split by them. A branch whose every node's usage is fixed cannot be split: its plans
all fit, and the cheapest of them without penalties (toulbar2's proved minimum at lam = 0, an
exact integer) is its optimum, or none fits and it is closed. With every branch closed, no plan costs less than
``upper``: it is optimal. Until then the bound is the least bound of the open branches (each a
branch's own dual, or its parent's) and of those that could not be split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autoshard.solver.bounds.exact_lagrangian import DUAL_SECONDS, DUAL_WALL, Runner, dual_search
from autoshard.solver.bounds.lagrangian import row_penalties
from autoshard.solver.core.reduced import INF, FrozenCore
from autoshard.solver.engines.toulbar import prove_below

MAX_STEPS = 25
"""Most exact minima per branch (V's branches converge in 1-9)."""


@dataclass
class Branch:
    """The strategies a branch allows (per node), the bound it inherits (its parent's dual) and
    the multipliers it starts from (its parent's)."""

    allowed: list[np.ndarray]
    bound: int
    lam: np.ndarray


class LevelBranching:
    """Best-first branch and bound on ``comp``'s usage levels below ``upper``, from the root's
    multipliers ``lam`` and its cut plans ``known`` (dual_search's); ``step`` settles one branch."""

    def __init__(self, comp: FrozenCore, rng: np.random.Generator, seed: int, run: Runner, upper: int,
                 lam: np.ndarray, known: list[np.ndarray], root_bound: int) -> None:
        self.comp, self.rng, self.seed, self.run, self.upper = comp, rng, seed, run, upper
        self.usage = [_row_usage(comp, i) for i in range(comp.n)]
        self.cuts: list[tuple[np.ndarray, float, np.ndarray]] = []  # every minimiser so far: (x, cost, overflow)
        self._keep(known)
        self.stuck: list[int] = []  # bounds of branches that cannot be split further
        root = Branch([c < INF for c in comp.costs], root_bound, lam)
        self.open = [root] if root_bound < upper else []
        self.branches = 0

    @property
    def done(self) -> bool:
        """Whether every branch is settled: closed, or stuck below ``upper``."""
        return not self.open

    @property
    def bound(self) -> int:
        """A certified lower bound on every plan's cost below ``upper`` (``upper`` itself once every
        branch is closed: no plan is cheaper)."""
        return min([self.upper, *self.stuck, *(b.bound for b in self.open)])

    def lower(self, upper: int) -> None:
        """A cheaper plan's cost as ``upper``: a branch closed holds no plan below the old one, so
        none below this; the open branches whose bound reaches it are closed."""
        self.upper = min(self.upper, upper)
        self.open = [b for b in self.open if b.bound < self.upper]

    def step(self) -> bool:
        """Settle the open branch of least bound (the last opened among equals), so the bound rises
        as branches close (with ``upper`` fixed, the branches settled before the end are the same
        in any order): its dual; closed at or above ``upper``, else split. False when its dual
        search gave no minimum (the branch stays open)."""
        branch = self.open.pop(min(range(len(self.open)), key=lambda j: (self.open[j].bound, -j)))
        self.branches += 1
        costs = [np.where(keep, c, INF) for c, keep in zip(self.comp.costs, branch.allowed)]
        sub = FrozenCore(self.comp.nodes, costs, self.comp.edges, self.comp.capacity, self.comp.segments,
                         self.comp.const)
        closing = self._closing(sub, branch.lam)
        if closing is None:
            self.open.append(branch)
            return False
        if closing is True:
            return True
        lagrangian = dual_search(sub, self.rng, self.seed + self.branches, self.run)
        lagrangian.lam = branch.lam.copy()
        cuts = self._allowed_cuts(branch.allowed)
        assert lagrangian.model is not None
        for _, cost, overflow in cuts:
            lagrangian.model.seed(cost, overflow)
        known = lagrangian.minimiser.known = [x for x, _, _ in cuts]
        lagrangian.minimiser.give(branch.lam, closing)
        best = branch.bound
        while not lagrangian.converged and lagrangian.steps < MAX_STEPS and best < self.upper:
            result = lagrangian.step(self.upper, np.inf)
            if not result.answered:
                self.open.append(branch)
                return False
            best = max(best, result.bound if result.bound is not None else best)
        self._keep(known[len(cuts):])
        if best < self.upper:
            children = self._children(Branch(branch.allowed, best, lagrangian.model.centre))
            if children:
                self.open.extend(children)
                return True
            if not self._fits(branch):  # usage fixed and over a row: no plan of the branch fits
                return True
            # usage fixed and within the rows: its cheapest plan without penalties is its optimum
            lagrangian.lam = np.zeros(len(self.comp.capacity))
            result = lagrangian.step(self.upper, np.inf)
            best = max(best, result.bound if result.bound is not None else best)
            if best < self.upper:
                self.stuck.append(best)
        return True

    def _closing(self, sub: FrozenCore, lam: np.ndarray) -> tuple[np.ndarray, bool] | bool | None:
        """The closing test at the parent's multipliers: toulbar2 bounded by
        u = floor(upper + lam . capacity - margin) + 1 on the penalised branch ``sub``. When no
        plan's penalised cost (floored penalties) is below u, every plan x of the branch that fits
        costs cost(x) >= cost(x) + floor-penalty(x) - lam . capacity >= u - lam . capacity > upper - 1,
        so none is cheaper than ``upper``: True (closed). Else the plan below u it found and whether
        it proved it the cheapest (then the branch's minimum at lam: its dual's first step), or None
        when the search gave no answer in time."""
        priced = float(lam @ self.comp.capacity)
        cap = math.floor(self.upper + priced - 1e-9 * (abs(self.upper) + abs(priced)) - 1e-6) + 1
        floored = np.floor(row_penalties(sub, lam)) if lam.any() else np.zeros(sub.arrays.c_off[-1])
        found = self.run(lambda: prove_below(sub, floored, float(cap), DUAL_SECONDS, self.seed + self.branches),
                         DUAL_WALL)
        if found is None:
            return None
        x, proved = found
        if x is None:
            return True if proved else None
        return np.asarray(x, dtype=np.int64), proved

    def _children(self, branch: Branch) -> list[Branch]:
        """``branch`` split by the priced usage levels (under its lam) of the node whose levels
        spread most, else by the usage vectors of the node with most of them (empty when every
        node's usage is fixed); each child inherits its bound and lam."""
        lam, best, node = branch.lam, 0.0, -1
        for i, keep in enumerate(branch.allowed):
            priced = self.usage[i][keep] @ lam
            if len(priced) and priced.max() - priced.min() > best:
                best, node = float(priced.max() - priced.min()), i
        if node >= 0:
            key = self.usage[node] @ lam
            levels = [key == level for level in np.unique(key[branch.allowed[node]])]
        else:
            counts = [len(np.unique(self.usage[i][keep], axis=0)) for i, keep in enumerate(branch.allowed)]
            node = int(np.argmax(counts))
            if counts[node] < 2:
                return []
            vectors = self.usage[node]
            levels = [(vectors == v).all(axis=1) for v in np.unique(vectors[branch.allowed[node]], axis=0)]
        children = []
        for level in levels:
            allowed = list(branch.allowed)
            allowed[node] = branch.allowed[node] & level
            children.append(Branch(allowed, branch.bound, lam))
        return children

    def _keep(self, plans: list[np.ndarray]) -> None:
        """New minimisers as cuts: (x, cost(x), usage(x) - capacity)."""
        capacity = self.comp.capacity.astype(np.float64)
        self.cuts.extend((x, float(self.comp.cost(x)), self.comp.profile(x) - capacity) for x in plans)

    def _allowed_cuts(self, allowed: list[np.ndarray]) -> list[tuple[np.ndarray, float, np.ndarray]]:
        """The cuts whose plans the branch ``allowed`` holds."""
        return [cut for cut in self.cuts if all(keep[s] for keep, s in zip(allowed, cut[0]))]

    def _fits(self, branch: Branch) -> bool:
        """Whether the plans of a branch whose usage is fixed fit (all of them, or none)."""
        x = np.array([int(np.flatnonzero(keep)[0]) for keep in branch.allowed])
        return bool((self.comp.profile(x) <= self.comp.capacity).all())


def _row_usage(comp: FrozenCore, i: int) -> np.ndarray:
    """Node i's usage on every row, per strategy: (strategies, rows)."""
    usage = np.zeros((len(comp.costs[i]), len(comp.capacity)))
    for start, stop, use in comp.segments[i]:
        usage[:, start:stop] += use[:, None]
    return usage
