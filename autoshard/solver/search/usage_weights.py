"""Usage weights per node, tuned by bisection on the plans they give (the contest winner's
"usage-constrained relaxation", Staudt and Blacher; written from its description).

The memory rows are dropped and each node i that can overflow a row pays for its memory:

    minimise  sum_i c_i(x_i) + sum_(i,j) c_ij(x_i, x_j) + sum_i w_i (peak_i(x_i) - min_s peak_i(s))

where peak_i(s) is node i's largest usage over its rows with strategy s. toulbar2 minimises that
(``toulbar.solve_penalised``). Of its plan y, node i is *broken* when a row it is live on
overflows. Each w_i is then bisected on a log scale between the largest weight at which it was
broken (lb_i) and the smallest at which it was not (ub_i):

    broken:      lb_i <- w_i   (ub_i <- STEP ub_i when w_i has reached ub_i: the threshold moved)
    not broken:  ub_i <- w_i   (lb_i <- lb_i / STEP when w_i has reached lb_i)
    next:        w_i = sqrt(lb_i ub_i), or ub_i / STEP while lb_i = 0, or STEP lb_i while ub_i = inf

so lb_i < threshold_i <= ub_i holds for a node that breaks exactly below a threshold, and a
bracket narrowed to NEAR is widened again by STEP on the side it hit: the weight keeps tracking
a threshold that moves as the other nodes change, within sqrt(STEP / (1 - NEAR)) ~ 1.8x of it.

Unlike the Lagrangian multipliers of lagrangian.py (one per row, moved by subgradient steps that
need a lower bound and over-penalise once they have grown), a node's weight moves only on
whether that node's own rows overflowed, and needs no bound. The winner spreads eight weights
per node between the bounds, one per parallel toulbar2 call; with one process here, one call per
step and a geometric bisection. Measured: see benchmarks/README.md, "Measurements behind the
design".
"""

from __future__ import annotations

import numpy as np

from autoshard.solver.core.reduced import INF, FrozenCore
from autoshard.solver.core.local_search import node_blocks, segment_index

STEP = 3.0
"""Factor a weight moves by while only one side of its threshold is known."""
NEAR = 0.05
"""A weight within this share of its bound has reached it."""
TOULBAR_SECONDS = 5
"""CPU seconds of toulbar2's neighbourhood search per plan: here one process has one core (the
winner ran eight longer calls at a time), and longer calls did not win consistently (measured: see
benchmarks/README.md, "Measurements behind the design" and "Tried and dropped")."""


class UsageWeights:
    """Per-node usage weights of ``comp`` (a core with memory rows) and their bisection."""

    def __init__(self, comp: FrozenCore) -> None:
        self.comp = comp
        self.peak = node_peaks(comp)
        self.live = can_overflow(comp)
        self.owner, self.starts, self.stops = segment_index(comp)
        weighted = np.flatnonzero(self.live)
        spread = sum(_cost_range(comp.costs[i]) for i in weighted)
        usage = sum(float(self.peak[i].max()) for i in weighted)
        # a first weight at which a unit of memory costs what a node's choice costs, on average
        self.w = np.where(self.live, spread / max(usage, 1.0), 0.0)
        self.lb = np.zeros(comp.n)
        self.ub = np.full(comp.n, np.inf)

    def penalty(self) -> np.ndarray:
        """Each node's penalty per strategy, w_i (peak_i(s) - min peak_i), flat."""
        return np.concatenate([w * p for w, p in zip(self.w, self.peak)]).astype(np.float64)

    def update(self, y: np.ndarray) -> int:
        """Bisect every weight on plan ``y`` (module docstring); returns how many nodes broke."""
        hit = broken_nodes(self.comp, y, self.owner, self.starts, self.stops) & self.live
        self.w, self.lb, self.ub = bisect(self.w, self.lb, self.ub, hit, self.live)
        return int(hit.sum())


def bisect(
    w: np.ndarray, lb: np.ndarray, ub: np.ndarray, hit: np.ndarray, live: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One bisection step of the weights ``w`` with bounds ``lb`` < ``w`` < ``ub`` (ub may be
    inf): ``hit`` nodes broke at w, the other ``live`` ones did not; the rest keep weight 0.
    Returns the next weights and bounds (the rule of the module docstring)."""
    kept = ~hit & live
    hit = hit & live
    lb, ub = lb.copy(), ub.copy()
    lb[hit] = w[hit]
    ub[kept] = w[kept]
    grow = hit & (w >= (1 - NEAR) * ub)
    ub[grow] *= STEP
    shrink = kept & (w <= (1 + NEAR) * lb)
    lb[shrink] /= STEP
    finite = np.isfinite(ub)
    mid = np.sqrt(lb * np.where(finite, ub, 0.0))
    nxt = np.where(~live, 0.0, np.where(~finite, STEP * lb, np.where(lb > 0, mid, ub / STEP)))
    return nxt, lb, ub


def node_peaks(comp: FrozenCore) -> list[np.ndarray]:
    """Per node, each strategy's largest usage on any one row, less the smallest such (float):
    the largest over its disjoint row ranges (local_search.node_blocks, where overlapping segments
    add up)."""
    out = []
    for c, blocks in zip(comp.costs, node_blocks(comp)):
        peak = np.max([u for _, _, u in blocks], axis=0).astype(np.float64) if blocks else np.zeros(len(c))
        out.append(peak - peak.min())
    return out


def can_overflow(comp: FrozenCore) -> np.ndarray:
    """Nodes whose usage depends on their strategy and that are live on a row some plan could
    overflow (every node there at its largest usage): the only ones that get a weight."""
    live = np.zeros(comp.n, dtype=bool)
    if comp.capacity is None or not len(comp.capacity):
        return live
    most = np.zeros(len(comp.capacity) + 1)
    for segs in comp.segments:
        for start, stop, u in segs:
            most[start] += float(u.max())
            most[stop] -= float(u.max())
    over = np.concatenate([[0], np.cumsum(np.cumsum(most[:-1]) > comp.capacity)])
    for i, segs in enumerate(comp.segments):
        varies = any(u.max() > u.min() for _, _, u in segs)
        live[i] = varies and any(over[stop] > over[start] for start, stop, _ in segs)
    return live


def broken_nodes(comp: FrozenCore, y: np.ndarray, owner: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Nodes live on a row that plan ``y`` overflows (``owner``, ``starts``, ``stops``: the
    segments, local_search.segment_index)."""
    hit = np.zeros(comp.n, dtype=bool)
    if not len(owner):
        return hit
    over = np.concatenate([[0], np.cumsum(comp.profile(y) > comp.capacity)])
    np.logical_or.at(hit, owner, over[stops] > over[starts])
    return hit


def _cost_range(c: np.ndarray) -> float:
    """Spread of a node's allowed costs."""
    allowed = c[c < INF]
    return float(allowed.max() - allowed.min()) if len(allowed) else 0.0
