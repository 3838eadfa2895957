"""Anytime behaviour under short limits: a feasible plan on time, also on large problems."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from autoshard.solver.model.iopddl import load_problem, problem_from_json
from autoshard.solver import SolveOptions, solve
from autoshard.solver.run.state import FINISH_PER_BUILD, FINISH_RESERVE, FINISH_SHARE, TEARDOWN_SHARE, RunState

from tests.solver.helpers import EXAMPLE, FakeClock, large_problem, needs_shared

SYNTHETIC = Path(__file__).parents[2] / "benchmarks" / "synthetic_iopddl.py"


def test_short_limit_on_a_large_problem_returns_a_fitting_plan():
    """The LP (HiGHS ignores its time limit while it builds the model), the Lagrangian set-up and
    the engines' teardown all end with the limit, and the call returns a fitting plan (how close
    to the limit it returns is benchmarks/iopddl.py's measurement, not a unit test's)."""
    problem = large_problem(np.random.default_rng(0), 4000)
    solution = solve(problem, SolveOptions(timeout=3.0))
    assert solution.cost is not None and problem.evaluate(solution.choice).feasible
    assert solution.cost == problem.evaluate(solution.choice).cost


def test_the_phases_deadline_keeps_a_finishing_reserve_and_overruns_are_read_on_the_runs_clock():
    """With a limit T the phases work to T less the reserve (at most FINISH_SHARE of T), stopping
    the engines waits until half-way into the reserve, and a phase that ends past the deadline
    is recorded by how far: all read on the run's clock, here a fake one."""
    clock = FakeClock(now=50.0)
    state = RunState(large_problem(np.random.default_rng(2), 20), SolveOptions(timeout=10.0), lambda event: None,
                     clock=clock)
    assert state.limit == 60.0 and state.deadline == 60.0
    state.set_reserve(build=0.5)
    reserve = FINISH_RESERVE + FINISH_PER_BUILD * 0.5
    assert state.deadline == pytest.approx(60.0 - reserve)
    assert state.teardown_by == pytest.approx(state.deadline + TEARDOWN_SHARE * reserve)
    state.set_reserve(build=100.0)  # a slow build: the reserve is capped at a share of the limit
    assert state.deadline == pytest.approx(60.0 - FINISH_SHARE * 10.0)
    assert state.left() == state.deadline - 50.0 and not state.out_of_time()
    assert state.share(0.5) == 50.0 + 0.5 * (state.deadline - 50.0) and state.soon(100.0) == state.deadline
    with state.timed("lns"):
        clock.now = state.deadline + 0.25
    with state.timed("lns"):
        clock.now = state.deadline - 1.0  # on time: the worst overrun stands
    assert state.overruns == {"lns": pytest.approx(0.25)} and not state.out_of_time()
    clock.now = state.deadline
    assert state.out_of_time() and state.elapsed() == state.deadline - 50.0


def test_a_tiny_limit_still_gives_the_greedy_plan():
    """Reductions are cut short and the rest is skipped, but the minimum-memory start is kept."""
    problem = large_problem(np.random.default_rng(1), 1500)
    solution = solve(problem, SolveOptions(timeout=0.3))
    assert solution.cost is not None and problem.evaluate(solution.choice).feasible


def _synthetic():
    spec = importlib.util.spec_from_file_location("synthetic_iopddl", SYNTHETIC)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_shared
def test_synthetic_union_is_feasible_and_keeps_the_tightness(tmp_path):
    source = json.loads(EXAMPLE.read_text())
    one = load_problem(EXAMPLE)
    problem = problem_from_json(_synthetic().union(source, copies=3, shift=0.0, extra_edges=0))
    assert problem.num_nodes == 3 * one.num_nodes and problem.usage_limit == 3 * one.usage_limit
    assert solve(problem, SolveOptions(timeout=10)).cost == 3 * 445  # each copy at its optimum fits
    denser = problem_from_json(_synthetic().union(source, copies=3, shift=0.0, extra_edges=4))
    assert len(denser.edges) == 3 * len(one.edges) + 4
    assert solve(denser, SolveOptions(timeout=10)).cost is not None
    path = tmp_path / "x.json.gz"
    _synthetic().main([str(EXAMPLE), str(path), "--copies", "2", "--shift", "1"])
    shifted = problem_from_json(json.loads(gzip.decompress(path.read_bytes())))
    assert shifted.usage_limit == one.usage_limit  # one after the other: the same peak


def test_a_start_that_fits_is_the_answer_once_the_reductions_end_past_the_limit(monkeypatch):
    """Past the limit after the reductions, with a start that fits, the run answers with the start
    and neither freezes the core nor places the start on it (seconds at 405B's 31k nodes)."""
    from autoshard.solver.core import reduced
    from autoshard.solver.run import solve as run_solve

    problem = large_problem(np.random.default_rng(3), 200)
    start = tuple(int(np.argmin(u)) for u in problem.node_usages)  # the smallest-memory plan fits
    assert problem.evaluate(list(start)).feasible
    clock = FakeClock(now=0.0)
    state = RunState(problem, SolveOptions(timeout=10.0, start=start), lambda event: None, clock=clock)
    assert state.start_from(start, "baseline") and not run_solve.start_suffices(state)
    run_solve.build(state)

    def slow_reductions(core, deadline):
        clock.now = state.deadline + 1.0
        return {}

    def frozen(self):
        raise AssertionError("the core was frozen past the limit")

    monkeypatch.setattr(run_solve, "reduce_core", slow_reductions)
    monkeypatch.setattr(reduced.Core, "freeze", frozen)
    run_solve.reduce(state)
    assert run_solve.start_suffices(state)
    solution = run_solve.answer(state)
    assert tuple(solution.choice) == start and solution.cost == problem.cost(list(start))
