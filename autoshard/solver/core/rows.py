"""The memory constraint on a compressed time axis.

    for every time t:  sum_{i : start_i <= t < end_i} usage_i[s_i] <= limit

Memory in use only rises when an interval starts, so checking at the distinct start times (the
*rows*) is exact. Each node owns *segments* (row range, usage vector); a row's capacity is the
limit minus the usage no choice can avoid. ``attach_memory`` builds rows and segments,
``normalize`` moves each segment's minimum into the capacity (so every segment has a zero
entry), ``prune_by_slack`` forbids strategies that could never fit, ``compress_rows`` drops
rows no assignment can overflow and merges rows that see the same segments, and
``drop_dominated_rows`` drops rows another row implies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numba import njit

from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver.core.reduced import INF, Core, Segment


@dataclass(frozen=True)
class PeakBound:
    """The smallest achievable peak memory: ``value`` is exact when ``exact``, else a lower bound."""

    value: int
    exact: bool
    time: int


def attach_memory(core: Core, problem: ShardingProblem) -> None:
    """Give ``core`` rows (distinct interval starts) and one segment per node with nonzero usage."""
    if problem.usage_limit is None:
        return
    live = [
        v
        for v, ((start, end), usage) in enumerate(zip(problem.intervals, problem.node_usages))
        if start < end and len(usage) and int(usage.max()) > 0
    ]
    times = np.unique(np.array([problem.intervals[v][0] for v in live], dtype=np.int64))
    core.row_times = times
    core.capacity = np.full(len(times), int(problem.usage_limit), dtype=np.int64)
    for v in live:
        start, end = problem.intervals[v]
        r0, r1 = np.searchsorted(times, [start, end], side="left")
        core.segments[v].append(Segment(int(r0), int(r1), np.asarray(problem.node_usages[v], dtype=np.int64)))
    for v in live:
        normalize(core, v)


def normalize(core: Core, v: int, new: list[Segment] | None = None) -> None:
    """Move each segment's minimum into the capacity and drop all-zero segments.

    With ``new``, only those segments are normalized and appended (v's strategies did not change,
    so its other segments are still normalized); otherwise all of v's segments are redone and
    segments over the same rows are summed.
    """
    if new is None:
        merged: dict[tuple[int, int], np.ndarray] = {}
        for seg in core.segments[v]:
            key = (seg.start, seg.stop)
            merged[key] = merged[key] + seg.usage if key in merged else seg.usage
        core.segments[v] = []
        new = [Segment(start, stop, usage) for (start, stop), usage in merged.items()]
    for seg in new:
        low = int(seg.usage.min())
        if low:
            core.capacity[seg.start : seg.stop] -= low
            seg.usage = seg.usage - low
        if seg.usage.any():
            core.segments[v].append(seg)


def prune_by_slack(core: Core) -> tuple[set[int], int | None]:
    """Forbid strategies whose usage alone exceeds a row's capacity.

    Returns the nodes whose strategies changed and, if some node has nothing left (no assignment
    fits), that node.
    """
    changed: set[int] = set()
    if core.capacity is None:
        return changed, None
    for v in list(core.alive):
        segs = core.segments[v]
        if not segs:
            continue
        keep = np.ones(core.k(v), dtype=bool)
        for seg in segs:
            keep &= seg.usage <= int(core.capacity[seg.start : seg.stop].min())
        if not keep.all():
            if not keep.any():
                return changed, v
            core.restrict(v, keep)
            normalize(core, v)
            changed.add(v)
    return changed, None


def capacity_deficit(core: Core) -> bool:
    """True when some row's capacity is negative: the unavoidable usage alone is over the limit."""
    return core.capacity is not None and len(core.capacity) > 0 and int(core.capacity.min()) < 0


def compress_rows(core: Core) -> None:
    """Drop rows that no assignment can overflow and merge rows that see the same segments."""
    if core.capacity is None or len(core.capacity) == 0:
        return
    alive = sorted(core.alive)
    spans = [[(seg.start, seg.stop, seg.usage) for seg in core.segments[v]] for v in alive]
    capacity, spans, rows = merge_rows(core.capacity, spans)
    for v, kept in zip(alive, spans):
        core.segments[v] = [Segment(start, stop, usage) for start, stop, usage in kept]
    core.capacity = capacity
    core.row_times = core.row_times[rows]


Spans = list[list[tuple[int, int, np.ndarray]]]
"""Per node, its segments as (first row, row past the last, usage per strategy)."""


def merge_rows(capacity: np.ndarray, segments: Spans) -> tuple[np.ndarray, Spans, np.ndarray]:
    """The same memory constraint on fewer rows: rows between consecutive segment ends see the
    same usages, so only the smallest capacity among them binds (one row per such block), and a
    block where even every node's largest usage fits can never overflow (dropped). Returns the
    capacities, the segments renumbered onto the kept rows, and each kept row's original index."""
    rows = len(capacity)
    upper = np.zeros(rows + 1, dtype=np.int64)
    cuts = {0, rows}
    for spans in segments:
        for start, stop, usage in spans:
            top = int(usage.max())
            upper[start] += top
            upper[stop] -= top
            cuts.update((start, stop))
    active = np.cumsum(upper[:-1]) > capacity
    bounds = np.array(sorted(cuts), dtype=np.int64)
    starts = bounds[:-1]
    masked = np.where(active, capacity, INF)
    block_cap = np.minimum.reduceat(masked, starts)
    block_live = np.logical_or.reduceat(active, starts)
    block_row = np.array([b + int(np.argmin(masked[b:e])) for b, e in zip(starts, bounds[1:])], dtype=np.int64)
    new_index = np.concatenate([[0], np.cumsum(block_live)])
    merged: Spans = []
    for spans in segments:
        kept = []
        for start, stop, usage in spans:
            first = int(new_index[np.searchsorted(bounds, start)])
            last = int(new_index[np.searchsorted(bounds, stop)])
            if first < last:
                kept.append((first, last, usage))
        merged.append(kept)
    return block_cap[block_live].astype(np.int64), merged, block_row[block_live]


ROW_WINDOW = 8
"""Rows on either side each row is compared with by ``drop_dominated_rows``: a wider window drops
somewhat more rows at proportionally more work (measured: see benchmarks/README.md,
"Measurements behind the design")."""


def drop_dominated_rows(core: Core, window: int = ROW_WINDOW, deadline: float | None = None) -> int:
    """Drop the rows another row implies; returns how many were dropped.

    Row r is implied by row q when every assignment that fits q fits r:

        use_r(x) - cap_r <= use_q(x) - cap_q  for all x,   use_r(x) = sum_i u_{i,r}[x_i],

    and since the left side minus the right is a sum of per-node terms, the worst x is found node
    by node:  sum_i max_s (u_{i,r}[s] - u_{i,q}[s]) <= cap_r - cap_q.  The relation is transitive,
    so a row implied by a row still kept can go (a chain of implications ends at a kept row). Each
    row is compared with the ``window`` nearest rows on either side, walking the segments that
    start and stop between them: rows far apart rarely imply each other (their live nodes differ).
    Compiled (``_drop_implied``) over the segments' ends sorted by row, 256 rows per call between
    looks at the deadline (measured: see benchmarks/README.md, "Solver throughput").
    """
    if core.capacity is None or len(core.capacity) < 2:
        return 0
    rows = len(core.capacity)
    owners = [v for v in core.alive if core.segments[v]]
    sizes = np.array([core.k(v) for v in owners], dtype=np.int64)
    ends: list[tuple[int, int, int, int]] = []  # (row boundary, owner's slot, +1 start / -1 stop, usage offset)
    usages: list[np.ndarray] = []
    offset = 0
    for slot, v in enumerate(owners):
        for seg in core.segments[v]:
            ends += [(seg.start, slot, 1, offset), (seg.stop, slot, -1, offset)]
            usages.append(seg.usage)
            offset += len(seg.usage)
    table = np.array(sorted(ends), dtype=np.int64).reshape(-1, 4)
    at = np.searchsorted(table[:, 0], np.arange(rows + 2))  # row b's ends: table[at[b]:at[b + 1]]
    usage = np.concatenate(usages) if usages else np.zeros(0, dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    kept = np.ones(rows, dtype=bool)
    for r in range(0, rows, 256):
        if deadline is not None and time.monotonic() > deadline:
            break
        _drop_implied(r, min(rows, r + 256), window, at, table, usage, first, core.capacity, kept)
    if kept.all():
        return 0
    remap_rows(core, kept)
    return int((~kept).sum())


@njit(cache=True)
def _drop_implied(
    low: int, high: int, window: int, at: np.ndarray, table: np.ndarray, usage: np.ndarray,
    first: np.ndarray, cap: np.ndarray, kept: np.ndarray,
) -> None:
    """Mark rows low..high-1 not kept where a kept row within ``window`` on either side implies
    them. Walking from r to q, diff holds u_{i,r} - u_{i,q} of each owner i touched (owner i's
    strategies at first[i]..first[i+1]), worst its maximum, and total the sum of the maxima."""
    n = len(first) - 1
    diff = np.zeros(first[n], dtype=np.int64)
    worst = np.zeros(n, dtype=np.int64)
    seen = np.zeros(n, dtype=np.bool_)
    touched = np.empty(n, dtype=np.int64)
    rows = len(cap)
    for r in range(low, high):
        for direction in (1, -1):
            total, count, q, implied = 0, 0, r, False
            for _ in range(window):
                boundary = q + 1 if direction > 0 else q
                q += direction
                if q < 0 or q >= rows:
                    break
                for e in range(at[boundary], at[boundary + 1]):
                    i, sign, u = table[e, 1], table[e, 2], table[e, 3]
                    if not seen[i]:
                        seen[i] = True
                        touched[count] = i
                        count += 1
                    top = -INF
                    for s in range(first[i + 1] - first[i]):
                        d = diff[first[i] + s] - direction * sign * usage[u + s]
                        diff[first[i] + s] = d
                        top = max(top, d)
                    total += top - worst[i]
                    worst[i] = top
                if kept[q] and total <= cap[r] - cap[q]:
                    implied = True
                    break
            for j in range(count):
                i = touched[j]
                seen[i], worst[i] = False, 0
                diff[first[i]:first[i + 1]] = 0
            if implied:
                kept[r] = False
                break


def remap_rows(core: Core, keep: np.ndarray) -> None:
    """Keep only the rows where ``keep`` is True: segments shrink to the kept rows they cover
    (those covering none go) and segments over the same rows are summed."""
    index = np.concatenate([[0], np.cumsum(keep)])
    core.capacity = core.capacity[keep]
    core.row_times = core.row_times[keep]
    for v in core.alive:
        if not core.segments[v]:
            continue
        kept = []
        for seg in core.segments[v]:
            start, stop = int(index[seg.start]), int(index[seg.stop])
            if start < stop:
                kept.append(Segment(start, stop, seg.usage))
        core.segments[v] = kept
        normalize(core, v)


def smallest_peak(problem: ShardingProblem) -> PeakBound:
    """The smallest peak any assignment can reach, exactly when per-node minimum usages combine.

    The lower bound is max over times of the sum of each live node's smallest usage among its
    allowed strategies; it is exact when picking those strategies uses no forbidden edge.
    """
    pick = []
    for cost, usage in zip(problem.node_costs, problem.node_usages):
        allowed = np.flatnonzero(cost < INF)
        allowed = allowed if len(allowed) else np.arange(len(cost))
        low = usage[allowed].min()
        best = allowed[usage[allowed] == low]
        pick.append(int(best[np.argmin(cost[best])]))
    profile = problem.usage_profile(pick)
    if not profile:
        return PeakBound(0, True, 0)
    time = max(profile, key=lambda t: profile[t])
    exact = problem.evaluate(pick).uses_forbidden is False
    return PeakBound(int(profile[time]), exact, int(time))
