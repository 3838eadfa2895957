"""The child-process engines (toulbar2 branch and bound / neighbourhood search, HiGHS's MILP) on
random reduced cores: optima equal brute force, plans are exact, verdicts hold."""

from __future__ import annotations

import itertools
import os
import time

import numpy as np
import pytest

from autoshard.solver.core.reduced import FrozenCore, Core
from autoshard.solver.procs.engine_events import EngineEvent, ToulbarText, receive, send
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.engines.toulbar import can_take, knapsack_rows, solve_penalised
from autoshard.solver.procs.forks import call_forked
from autoshard.solver.run.workers import EngineWorker

from tests.solver.helpers import FakeClock, core_of, infeasible_beyond_the_smallest_peak_bound, optimum, random_problem


HANG = 300.0
"""Seconds without a single event after which an engine counts as hung: a guard against a hang,
not a measure of speed (these engines end within a second on these cores)."""


def ended(events: list) -> bool:
    """True once the parent queued "end": the last event of an engine, after all it reported."""
    return any(e.kind == "end" for e in events)


def run(comp: FrozenCore, method: str, upper: int | None = None, toulbar: bool = False,
        plans: int | None = None, gap: float = 0.0) -> list:
    """The engine's events until it ends or (plan-only engines, which run until stopped) it has
    reported ``plans`` plans."""
    worker = EngineWorker(comp, method, upper, gap=gap, toulbar=toulbar)
    worker.start()
    events: list = []
    try:
        while not ended(events) and (plans is None or sum(e.kind == "plan" for e in events) < plans):
            heard = worker.poll(HANG)
            assert heard, f"{method} hung"
            events += heard
    finally:
        worker.stop()
    assert worker.error is None
    return events


def test_toulbar2_under_a_relative_gap_searches_to_the_end_and_proves():
    """--gap reaches toulbar2 as the parent's stopping rule, not as toulbar2's own (pytoulbar2
    sets its relative gap only to whole numbers): the engine still ends with the optimum."""
    comp = next(c for seed in range(40) if (c := core_of(seed)) is not None and c.n >= 2 and can_take(c)
                and optimum(c) is not None)
    events = run(comp, "toulbar2", gap=0.05)
    assert any(e.kind == "optimal" and e.cost == optimum(comp) for e in events), events


@pytest.mark.parametrize("method", ["toulbar2", "highs"])
def test_exact_engines_prove_the_brute_force_optimum(method):
    checked = 0
    for seed in range(40):
        comp = core_of(seed)
        if comp is None or comp.n < 2 or not can_take(comp):
            continue
        best = optimum(comp)
        events = run(comp, method)
        plans = [e for e in events if e.kind == "plan"]
        for e in plans:
            assert comp.cost(e.choice) == e.cost and comp.is_feasible(e.choice)
        for e in events:
            if e.kind == "bound":
                assert best is None or e.cost <= best
        if best is None:  # HiGHS's infeasibility under memory rows is no proof (its tolerances on bytes)
            proved = any(e.kind == "none" for e in events)
            assert not plans and proved == (method == "toulbar2" or not comp.has_memory)
        else:
            assert plans[-1].cost == best and any(e.kind == "optimal" and e.cost == best for e in events)
        checked += 1
        if checked == 8:
            break
    assert checked == 8


def test_an_upper_bound_at_the_optimum_gets_no_plan_and_says_so():
    for seed in range(40):
        comp = core_of(seed)
        if comp is not None and comp.n >= 2 and can_take(comp) and (best := optimum(comp)) is not None:
            events = run(comp, "toulbar2", upper=best)
            assert not [e for e in events if e.kind == "plan"] and any(e.kind == "none" for e in events)
            return
    pytest.fail("no feasible core among the seeds")


def first_core(nodes: int) -> FrozenCore:
    """The first random core with memory rows and a feasible plan that toulbar2 takes."""
    for seed in range(100):
        comp = core_of(seed, nodes)
        if comp is not None and comp.n >= 3 and comp.has_memory and can_take(comp):
            return comp
    raise AssertionError("no core among the seeds")


@pytest.mark.parametrize("method, toulbar", [("toulbar2-vns", False), ("second-search", False), ("second-search", True)])
def test_plan_only_engines_give_exact_fitting_plans(method, toulbar):
    comp = first_core(12)
    best = optimum(comp)
    plans = [e for e in run(comp, method, toulbar=toulbar, plans=1) if e.kind == "plan"]
    assert plans and plans[-1].cost >= best
    for e in plans:
        assert comp.cost(e.choice) == e.cost and comp.is_feasible(e.choice)


def test_toulbar2_minimises_the_penalised_problem_and_prints_nothing(capfd):
    """solve_penalised on small cores with integer penalties: the brute-force minimum of cost +
    penalty with the memory rows left out; its output never reaches fds 1 and 2 (in the lagrange
    engine they are the pipe the parent reads plans from)."""
    checked = 0
    for seed in range(100):
        if checked == 10:
            break
        comp = core_of(seed)
        if comp is None or comp.n < 2 or not can_take(comp, rows=False):
            continue
        rng = np.random.default_rng(seed)
        penalty = [rng.integers(0, 50, len(c)).astype(np.float64) for c in comp.costs]
        pen = lambda x: comp.cost(list(x)) + sum(p[s] for p, s in zip(penalty, x))  # noqa: E731
        best = min(pen(x) for x in itertools.product(*[range(len(c)) for c in comp.costs]))
        x = solve_penalised(comp, np.concatenate(penalty), 1, seed)
        assert x is not None and pen(x) == best
        checked += 1
    assert checked == 10
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def assert_rows_are_the_profile(comp: FrozenCore) -> None:
    """Each knapsack row r reads as usage of the scope's strategies <= capacity[r]: the same
    (capacity, usage) pairs as the core's own profile, for several assignments."""
    rows = knapsack_rows(comp)
    live = [r for r in range(len(comp.capacity)) if any(a <= r < b for segs in comp.segments for a, b, _ in segs)]
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = [int(rng.integers(len(c))) for c in comp.costs]
        profile = comp.profile(x)
        ours = set()
        for scope, params in rows:
            assert scope == sorted(scope)
            numbers = [int(v) for v in params.split()]
            pos, used = 1, 0
            for node in scope:
                count = numbers[pos]
                pairs = numbers[pos + 1 : pos + 1 + 2 * count]
                used -= sum(w for s, w in zip(pairs[::2], pairs[1::2]) if s == x[node])
                pos += 1 + 2 * count
            assert pos == len(numbers)
            ours.add((-numbers[0], used))
        assert ours == {(int(comp.capacity[r]), int(profile[r])) for r in live}


def test_knapsack_rows_are_the_memory_rows():
    assert_rows_are_the_profile(first_core(10))


def test_knapsack_rows_add_a_node_s_overlapping_segments_and_skip_its_gaps():
    """Node 0's segments overlap on row 2 (their usages add there), node 1's leave rows 2-4 out
    (it is in no scope there), node 2 has none, and rows 3 and 4 are the same row (kept once)."""
    u = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    comp = FrozenCore(
        nodes=[0, 1, 2],
        costs=[u(0, 1, 2), u(3, 0), u(1, 1)],
        edges=[],
        capacity=u(9, 9, 9, 9, 9, 9),
        segments=[[(0, 3, u(1, 0, 4)), (2, 5, u(2, 2, 0))], [(1, 2, u(5, 0)), (5, 6, u(0, 3))], []],
    )
    rows = knapsack_rows(comp)
    assert [scope for scope, _ in rows] == [[0], [0, 1], [0], [0], [1]]
    assert rows[2][1] == "-9 3 0 -3 1 -2 2 -4"  # row 2: node 0's two segments added
    assert_rows_are_the_profile(comp)


def _raise() -> None:
    raise ValueError("in the child")


def test_a_forked_call_returns_its_value_and_is_abandoned_at_its_deadline():
    comp = core_of(3)
    assert comp is not None
    assert call_forked(lambda: comp.cost([0] * comp.n), None) == comp.cost([0] * comp.n)
    assert call_forked(_raise, None) is None  # an exception in the child: no value
    clock = FakeClock(step=1.0)
    assert call_forked(lambda: time.sleep(30) or "late", clock.now + 0.5, clock=clock) is None  # past it: killed
    heard = []
    assert call_forked(lambda: time.sleep(30), None, lambda: heard.append(1) or len(heard) >= 3) is None
    assert len(heard) == 3  # the caller may give up between looks


def test_a_relaxation_is_stopped_once_its_plans_cost_less_than_the_lower_bound():
    """toulbar2 without memory rows reports plans that need not fit; once one costs less than the
    proven lower bound, none it could still report fits, and the portfolio stops it."""
    from autoshard.solver.run.engine_pool import EnginePool
    from autoshard.solver.model.solution import SolveOptions
    from autoshard.solver.run.state import RunState

    checked = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        problem = random_problem(rng, 7, max_k=4, memory=True, forbid_prob=0.1)
        comp = core_of(seed)
        if comp is None or comp.n < 2 or not comp.has_memory or optimum(comp) is None:
            continue
        free = min(comp.cost(list(x)) for x in itertools.product(*[range(len(c)) for c in comp.costs]))
        worker = EngineWorker(comp, "toulbar2-no-rows", None)
        worker.start()
        heard: list = []
        while not ended(heard):  # every event taken here: the pool below hears none of them
            assert (new := worker.poll(HANG)), "toulbar2-no-rows hung"
            heard += new
        assert worker.cheapest is not None and worker.cheapest >= free  # no plan below the relaxation's optimum
        for lower, stopped in ((worker.cheapest, False), (worker.cheapest + 1, True)):
            pool = EnginePool(RunState(problem, SolveOptions(), lambda event: None))
            pool.engines.append(worker)
            pool.state.lower = lower
            pool.poll()
            assert (worker.pid is None) == stopped
        worker.stop()
        checked += 1
    assert checked >= 5


def test_toulbar2_proves_no_plan_fits_where_its_search_prints_nothing():
    """toulbar2 finds the network contradictory before searching and prints no verdict; the value
    its Solve returns is the verdict."""
    problem = infeasible_beyond_the_smallest_peak_bound()
    core = Core(problem)
    attach_memory(core, problem)
    comp = core.freeze()
    events = run(comp, "toulbar2")
    assert [e.kind for e in events] == ["none", "end"]


def test_toulbar2_progress_lines_become_events_with_the_constant_added_back():
    text = ToulbarText(n=3, const=100)
    lines = ["Initial lower and upper bounds: [7, 50] 86%", "New solution: 42 (0 backtracks)", "0 2 1",
             "Optimality gap: [12.5, 42] 70 %", "New solution: 40", "not a plan", "junk"]
    events = [e for e in map(text.line, lines) if e is not None]
    assert events == [EngineEvent("bound", 107), EngineEvent("plan", 142, [0, 2, 1]), EngineEvent("bound", 113)]


def test_events_cross_the_pipe_typed_and_a_cut_frame_ends_the_stream():
    read, write = os.pipe()
    sent = [EngineEvent("plan", 5, [1, 0]), EngineEvent("error", message="MemoryError: ")]
    for event in sent:
        send(write, event)
    os.write(write, b"\x40\x00\x00\x00\x00\x00\x00\x00abc")  # a frame of 64 bytes cut after 3
    os.close(write)
    assert list(receive(read)) == sent


def test_a_core_whose_tables_would_not_fit_is_not_given_to_toulbar2(monkeypatch):
    from autoshard.solver.engines import toulbar

    comp = next(c for c in map(core_of, range(40)) if c is not None and c.n >= 2 and can_take(c))
    entries = toulbar.table_entries(comp)
    assert entries == sum(len(c) for c in comp.costs) + sum(m.size for _, _, m in comp.edges)
    monkeypatch.setattr(toulbar, "MAX_TABLE_ENTRIES", entries - 1)
    assert not can_take(comp) and not can_take(comp, rows=False)


def test_frozen_arrays_store_each_distinct_matrix_once_and_cost_the_same(monkeypatch):
    from autoshard.solver.core import pool

    monkeypatch.setattr(pool, "POOLED_ENTRIES", 1)  # these cores' matrices are small: pool them all
    comp = next(c for c in map(core_of, range(40)) if c is not None and len(c.edges) >= 2)
    twice = FrozenCore(comp.nodes + [n + 10**6 for n in comp.nodes], comp.costs * 2,
                       comp.edges + [(u + comp.n, v + comp.n, m.copy()) for u, v, m in comp.edges], None,
                       [[] for _ in range(2 * comp.n)], comp.const)
    single = FrozenCore(comp.nodes, comp.costs, comp.edges, None, [[] for _ in range(comp.n)], comp.const)
    assert twice.arrays.nb_mats.size == single.arrays.nb_mats.size  # the copies' matrices are pooled
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = [int(rng.integers(len(c))) for c in comp.costs]
        assert twice.cost(x + x) == 2 * single.cost(x) - single.const


def test_objective_size_with_a_limit_decides_as_the_full_count_does():
    """Counting may stop once past the limit, but never changes which side of it a core falls on."""
    from autoshard.solver.engines.cegis import objective_size

    cores = [c for c in map(core_of, range(30)) if c is not None]
    for comp in cores:
        full = objective_size(comp)
        for limit in (0, full // 2, full - 1, full, full + 1):
            assert (objective_size(comp, limit) > limit) == (full > limit)
        assert objective_size(comp, full) == full
