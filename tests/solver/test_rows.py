"""Dropping memory rows other rows imply (memory.drop_dominated_rows) keeps exactly the plans that fit."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver.core.reduced import Core
from autoshard.solver.core.rows import attach_memory, compress_rows, drop_dominated_rows, merge_rows

from tests.solver.helpers import random_problem


def fitting(problem: ShardingProblem, core: Core) -> tuple[set, set]:
    """The assignments that fit by the problem's own profile and by the core's rows."""
    comp = core.freeze()
    assert comp.nodes == list(range(len(problem.node_costs)))
    by_problem, by_core = set(), set()
    for x in itertools.product(*[range(len(c)) for c in problem.node_costs]):
        if max(problem.usage_profile(list(x)).values(), default=0) <= problem.usage_limit:
            by_problem.add(x)
        if bool((comp.profile(np.array(x)) <= comp.capacity).all()):  # true for no rows at all
            by_core.add(x)
    return by_problem, by_core


def compressed(seed: int, most_nodes: int) -> tuple[ShardingProblem, Core]:
    """A random problem of 2 to ``most_nodes`` nodes and its core on compressed rows."""
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, int(rng.integers(2, most_nodes + 1)), max_k=3, forbid_prob=0.0)
    core = Core(problem)
    attach_memory(core, problem)
    compress_rows(core)
    return problem, core


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 10**6), window=st.integers(1, 6))
def test_dropped_rows_change_no_plan_that_fits(seed, window):
    problem, core = compressed(seed, 6)
    rows = len(core.capacity)
    dropped = drop_dominated_rows(core, window)
    assert len(core.capacity) == rows - dropped
    by_problem, by_core = fitting(problem, core)
    assert by_problem == by_core


def implied_rows(core: Core, window: int) -> list[bool]:
    """Which rows stay, by the definition on dense per-row usages: in row order, r goes when a
    row q still kept, at most ``window`` rows away, has sum_i max_s (u_ir[s] - u_iq[s]) <=
    cap_r - cap_q."""
    rows, cap = len(core.capacity), core.capacity
    dense = []
    for v in sorted(core.alive):
        if core.segments[v]:
            u = np.zeros((rows, core.k(v)), dtype=np.int64)
            for seg in core.segments[v]:
                u[seg.start:seg.stop] += seg.usage
            dense.append(u)
    kept = [True] * rows
    for r in range(rows):
        near = [q for q in range(max(0, r - window), min(rows, r + window + 1)) if q != r and kept[q]]
        if any(sum(int((u[r] - u[q]).max()) for u in dense) <= cap[r] - cap[q] for q in near):
            kept[r] = False
    return kept


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), window=st.integers(1, 4))
def test_the_rows_dropped_are_those_the_definition_drops(seed, window):
    """Against the definition on dense usages (several segments per node after merging)."""
    _, core = compressed(seed, 8)
    kept, times = implied_rows(core, window), core.row_times.copy()
    assert drop_dominated_rows(core, window) == kept.count(False)
    assert core.row_times.tolist() == times[kept].tolist()


def test_a_row_whose_tensors_stay_live_at_the_next_row_is_dropped():
    """A long-lived tensor and two short ones: at the second row all three are live, so the first
    row (two of them) can only overflow when the second does."""
    usages = [np.array([4, 0]), np.array([3, 0]), np.array([3, 0])]
    intervals = [(0, 10), (1, 3), (2, 4)]
    costs = [np.array([0, 5]), np.array([0, 5]), np.array([0, 5])]
    problem = ShardingProblem(costs, usages, intervals, [], [], usage_limit=6, name="nested")
    core = Core(problem)
    attach_memory(core, problem)
    compress_rows(core)
    assert len(core.capacity) == 2
    assert drop_dominated_rows(core) == 1 and len(core.capacity) == 1
    by_problem, by_core = fitting(problem, core)
    assert by_problem == by_core


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_merged_rows_keep_exactly_the_plans_that_fit(seed):
    """merge_rows on random capacities and segments (several per node, overlapping ones too):
    the same assignments fit, and each kept row is an original row of the same capacity."""
    rng = np.random.default_rng(seed)
    rows = int(rng.integers(1, 9))
    capacity = rng.integers(-2, 30, rows).astype(np.int64)
    sizes = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(1, 5)))]
    segments = []
    for k in sizes:
        spans = []
        for _ in range(int(rng.integers(0, 3))):
            start = int(rng.integers(0, rows))
            spans.append((start, int(rng.integers(start + 1, rows + 1)), rng.integers(0, 12, k).astype(np.int64)))
        segments.append(spans)
    merged, spans, kept = merge_rows(capacity, segments)
    assert (capacity[kept] == merged).all()

    def usage(segs, count, x):
        total = np.zeros(count, dtype=np.int64)
        for node, s in zip(segs, x):
            for start, stop, u in node:
                total[start:stop] += u[s]
        return total

    for x in itertools.product(*[range(k) for k in sizes]):
        fits = bool((usage(segments, rows, x) <= capacity).all())
        assert fits == bool((usage(spans, len(merged), x) <= merged).all())
