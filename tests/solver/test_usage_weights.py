"""Usage weights (usage_weights.py): peaks, which nodes can overflow and which broke, against
row-by-row brute force on random cores; the bisection's invariants and convergence."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.solver.core.local_search import segment_index
from autoshard.solver.search.usage_weights import NEAR, STEP, UsageWeights, bisect, broken_nodes, can_overflow, node_peaks
from tests.solver.helpers import core_of




def row_usage(comp, i: int, row: int) -> np.ndarray:
    """Node i's usage per strategy on one row: its segments covering the row, summed."""
    out = np.zeros(len(comp.costs[i]), dtype=np.int64)
    for start, stop, u in comp.segments[i]:
        if start <= row < stop:
            out += u
    return out


def cores(count: int) -> list:
    found = []
    for seed in range(200):
        comp = core_of(seed, 9)
        if comp is not None and comp.has_memory:
            found.append(comp)
        if len(found) == count:
            return found
    raise AssertionError("too few cores with memory rows among the seeds")


def test_peaks_overflow_and_broken_nodes_match_the_rows_one_by_one():
    rng = np.random.default_rng(0)
    for comp in cores(12):
        rows = range(len(comp.capacity))
        peaks = node_peaks(comp)
        most = [sum(int(row_usage(comp, i, r).max()) for i in range(comp.n)) for r in rows]
        live = can_overflow(comp)
        for i in range(comp.n):
            on = [r for r in rows if any(a <= r < b for a, b, _ in comp.segments[i])]
            peak = np.max([row_usage(comp, i, r) for r in on], axis=0) if on else np.zeros(len(comp.costs[i]))
            assert np.array_equal(peaks[i], peak - peak.min())
            varies = any(len(np.unique(row_usage(comp, i, r))) > 1 for r in on)
            assert live[i] == (varies and any(most[r] > comp.capacity[r] for r in on))
        for _ in range(5):
            y = np.array([rng.integers(len(c)) for c in comp.costs])
            usage = comp.profile(y)
            hit = broken_nodes(comp, y, *segment_index(comp))
            for i in range(comp.n):
                assert hit[i] == any(usage[r] > comp.capacity[r] for r in rows
                                     if any(a <= r < b for a, b, _ in comp.segments[i]))


def test_a_plan_that_fits_lowers_every_weight_and_one_that_overflows_raises_the_broken_ones():
    for comp in cores(12):
        weights = UsageWeights(comp)
        if not weights.live.any():
            continue
        rng = np.random.default_rng(1)
        y = np.array([rng.integers(len(c)) for c in comp.costs])
        before = weights.w.copy()
        hit = broken_nodes(comp, y, weights.owner, weights.starts, weights.stops) & weights.live
        assert weights.update(y) == int(hit.sum())
        assert np.all(weights.w[hit] > before[hit])
        kept = weights.live & ~hit
        assert np.all(weights.w[kept] < before[kept])
        assert np.all(weights.w[~weights.live] == 0)
        assert len(weights.penalty()) == sum(len(c) for c in comp.costs) and weights.penalty().min() >= 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1e-3, 1e3), min_size=1, max_size=6), st.integers(0, 2**31 - 1))
def test_bisection_brackets_a_fixed_threshold_within_one_step(thresholds, seed):
    """A node breaks exactly while its weight is below its threshold t: once both bounds are
    known they bracket t (lb < t <= ub) and the weight stays strictly inside them; a bracket
    narrowed to NEAR is widened by STEP on the side it hit, so in the long run it spans at most
    STEP / (1 - NEAR) and the weight is within the square root of that of t."""
    t = np.array(thresholds)
    n = len(t)
    rng = np.random.default_rng(seed)
    w = rng.uniform(1e-3, 1e3, n)
    lb, ub = np.zeros(n), np.full(n, np.inf)
    live = np.ones(n, dtype=bool)
    for step in range(100):
        w, lb, ub = bisect(w, lb, ub, w < t, live)
        assert np.all(lb < w) and np.all(w < ub)
        known = (lb > 0) & np.isfinite(ub)
        assert np.all((lb[known] < t[known]) & (t[known] <= ub[known]))
        if step >= 40:
            assert known.all() and np.all(ub / lb <= STEP / (1 - NEAR) + 1e-9)
            assert np.all(np.abs(np.log(w / t)) <= 0.5 * np.log(STEP / (1 - NEAR)) + 1e-9)


def test_bisection_follows_a_threshold_that_moves_past_its_bracket():
    """A threshold that jumps far above the bracket (or below it, as other nodes change) is
    bracketed again: the bound it passed widens by STEP each time the weight reaches it."""
    w, lb, ub = np.array([1.0]), np.zeros(1), np.full(1, np.inf)
    live = np.ones(1, dtype=bool)
    for threshold in (5.0, 5.0 * STEP**6, 5.0 / STEP**8):
        for _ in range(120):  # each STEP passed takes a few bisections to reach the bound
            w, lb, ub = bisect(w, lb, ub, w < threshold, live)
        assert lb[0] < threshold <= ub[0] and ub[0] / lb[0] <= STEP / (1 - NEAR) + 1e-9
