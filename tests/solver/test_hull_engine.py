"""The hull bound as an engine in a child process (run/workers.py "hull"): its bounds hold against the
enumerated optimum, its plans fit and cost what they say, each better root bound is heard as it is found,
and the portfolio gives it the second processor on cores of repeated layers that memory binds, HiGHS
taking that processor once it has ended."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from autoshard.solver.api import SolveOptions, solve
from autoshard.solver.bounds.column_generation import ColumnGeneration, dive
from autoshard.solver.core.branching import Branch
from autoshard.solver.engines.milp import solve_problem_milp
from autoshard.solver.run.engine_pool import EnginePool
from autoshard.solver.run.portfolio import Portfolio
from autoshard.solver.run.state import RunState
import autoshard.solver.run.workers as workers
from tests.solver.test_branching import layers_that_must_partly_recompute
from tests.solver.test_column_generation import hull_value, with_random_tally
from autoshard.solver.core.reduced import Core
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.run.workers import Engine, EngineWorker
from tests.solver.helpers import exited
from tests.solver.test_engines import HANG, ended
from tests.solver.test_milp import cores, fitting_plans


def run_hull(comp, upper: int | None, plan: list[int] | None, seconds: float | None = None) -> list:
    """The hull engine's events from ``plan`` (costing ``upper``; None: no plan known) until it
    ends; ``seconds``: the time the run leaves it (None: no limit)."""
    worker = EngineWorker(comp, "hull", upper, plan=plan, seconds=seconds)
    worker.start()
    events: list = []
    try:
        while not ended(events):
            heard = worker.poll(HANG)
            assert heard, "the hull engine hung"
            events += heard
    finally:
        worker.stop()
    assert worker.error is None
    return events


def test_the_hull_engine_s_bounds_hold_and_its_plans_fit_and_cost_what_they_say() -> None:
    """Its bounds are below the enumerated optimum, its last the one the dive from the same plan
    reaches in this process; only cheaper plans are reported, and each fits and costs what it says."""
    rng = np.random.default_rng(11)
    for comp, best in cores(10):
        counted = with_random_tally(comp, rng)
        start = fitting_plans(counted)[0]  # the dearest plan that fits
        upper = counted.cost(start)
        events = run_hull(counted, upper, start)
        bounds = [e.cost for e in events if e.kind == "bound"]
        plans = [e for e in events if e.kind == "plan"]
        assert bounds and max(bounds) <= best
        for e in plans:
            assert counted.is_feasible(e.choice) and counted.cost(e.choice) == e.cost and e.cost < upper
        assert [e.cost for e in plans] == sorted((e.cost for e in plans), reverse=True)  # only cheaper ones
        known = [upper]
        here = ColumnGeneration(counted, np.random.default_rng(1), lambda x: known.append(counted.cost(x)))
        here.add(np.array(start))
        ended_here = dive(here, lambda: min(known), time.monotonic() + 60)
        assert max(bounds) == max(b for b in (ended_here.bound, min(known) if ended_here.closed else None)
                                  if b is not None)


def test_without_a_plan_the_hull_engine_starts_from_trws_primal_and_its_bounds_hold() -> None:
    rng = np.random.default_rng(13)
    heard = 0
    for comp, best in cores(8):
        counted = with_random_tally(comp, rng)
        events = run_hull(counted, None, None)
        bounds = [e.cost for e in events if e.kind == "bound"]
        assert all(b <= best for b in bounds)
        assert all(counted.is_feasible(e.choice) and counted.cost(e.choice) == e.cost for e in events if e.kind == "plan")
        heard += bool(bounds)
    assert heard == 8


def test_each_better_bound_outside_every_branch_is_heard_as_it_is_found() -> None:
    rng = np.random.default_rng(5)
    for comp, best in cores(6):
        counted = with_random_tally(comp, rng)
        heard: list[int] = []
        generation = ColumnGeneration(counted, rng, lambda x: None, bounded=heard.append)
        generation.add(np.array(fitting_plans(counted)[0]))
        root = generation.search([], time.monotonic() + 10)
        assert heard and heard == sorted(set(heard)) and heard[-1] == root.bound
        assert root.bound <= hull_value(counted, []) + 1e-6 * abs(best)
        generation.search([Branch(0, 1, 0)], time.monotonic() + 10)
        assert heard[-1] == root.bound  # a branch's bound holds inside it only: not heard


def test_repeated_layers_that_memory_binds_get_the_hull_engine_after_toulbar2_without_rows(monkeypatch) -> None:
    """With rows too large for toulbar2 and an ILP too large for HiGHS, on a model's core of counted
    layers (problem.Tally) the hull engine takes the processor toulbar2-without-rows hands over, in
    place of the second Lagrangian search; its bounds hold."""
    import autoshard.solver.engines.toulbar as toulbar
    import autoshard.solver.run.portfolio as portfolio

    monkeypatch.setattr(toulbar, "MAX_ROW_TERMS", 0)
    monkeypatch.setattr(portfolio, "MILP_MAX_COLUMNS", 0)
    monkeypatch.setattr(portfolio, "RELAXED_ALONE", 0.0)
    started: list[str] = []
    start = EnginePool.start
    monkeypatch.setattr(EnginePool, "start", lambda self, methods, what: started.extend(methods) or start(self, methods, what))
    problem = layers_that_must_partly_recompute(12)
    reference = solve_problem_milp(problem)
    solution = solve(problem, SolveOptions(timeout=20.0))
    assert started[:2] == ["toulbar2-no-rows", "hull"]
    assert reference.optimal and solution.cost is not None and solution.cost >= reference.cost
    assert solution.lower_bound is not None and solution.lower_bound <= reference.cost
    assert problem.evaluate(solution.choice).feasible


def test_the_bound_of_the_child_the_dive_enters_is_heard_and_holds() -> None:
    """Eight layers of which 3.5 fit: the root recomputes 4.5 of them; with a plan one tick above
    the optimum known, K <= 4 is closed and the dive enters K >= 5, whose bound (the optimum,
    five layers recomputing) is heard before the dive returns."""
    problem = layers_that_must_partly_recompute(8)
    core = Core(problem)
    attach_memory(core, problem)
    comp = core.freeze()
    optimum = 5 * 7
    heard: list[int] = []
    generation = ColumnGeneration(comp, np.random.default_rng(0), lambda x: None, bounded=heard.append)
    generation.add(np.array([1] * 8))  # every layer recomputes: it fits
    ended = dive(generation, lambda: optimum + 1, time.monotonic() + 30)
    assert [(b.sense, b.k) for b in ended.branches][:1] == [(-1, 5)]
    assert max(heard) <= optimum and max(heard) == ended.bound
    assert max(heard) > heard[0]  # the root's first bound is below what entering the child gave


def _portfolio_on(problem, options: SolveOptions = SolveOptions()) -> Portfolio:
    """A portfolio on ``problem``'s unreduced core (no engine started)."""
    state = RunState(problem, options, lambda event: None)
    core = Core(problem)
    attach_memory(core, problem)
    state.built(core)
    state.reduced({})
    return Portfolio(state)


def test_on_counted_layers_that_memory_binds_the_hull_engine_goes_before_highs(monkeypatch) -> None:
    """The second processor's queue: HiGHS first where its ILP is small (it proves within
    seconds), else the hull engine then HiGHS where its ILP is small enough; the hull alone where
    it is not; HiGHS alone without tallies; the second search without proofs."""
    import autoshard.solver.run.portfolio as portfolio

    counted = layers_that_must_partly_recompute(8)
    queue = lambda p, options=SolveOptions(): [m for methods, _ in _portfolio_on(p, options)._second_engines() for m in methods]
    assert queue(counted) == ["highs", "hull"]
    assert queue(replace(counted, tallies=[])) == ["highs"]
    assert queue(counted, SolveOptions(prove=False)) == ["second-search"]
    monkeypatch.setattr(portfolio, "HIGHS_FIRST_COLUMNS", 0)
    assert queue(counted) == ["hull", "highs"]
    monkeypatch.setattr(portfolio, "MILP_MAX_COLUMNS", 0)
    assert queue(counted) == ["hull"]


def test_highs_takes_the_processor_once_the_hull_engine_has_ended_and_proves(monkeypatch) -> None:
    """An engine queued with no latest start waits for the one before to end, then starts from
    the run's best; here a hull engine that ends at once hands over to HiGHS, which proves the
    optimum (five of eight layers recomputing)."""
    monkeypatch.setitem(workers.ENGINES, "hull", Engine("hull", "ends at once", lambda worker, report: None,
                                                        source="hull", bounds=True))
    problem = layers_that_must_partly_recompute(8)
    pool = _portfolio_on(problem).pool
    try:
        pool.start(["hull"], "the hull engine")
        pool.waiting = [(["highs"], "HiGHS", math.inf)]
        assert exited(pool.engines[0].pid), "the hull engine hung"
        while len(pool.engines) < 2:  # its pipe closes once it has exited
            pool.poll(1.0)
        assert exited(pool.engines[1].pid), "HiGHS hung"
        while not pool.engines[1].done:
            pool.poll(1.0)
        pool.poll()
    finally:
        pool.stop()
    assert [e.method for e in pool.engines] == ["hull", "highs"] and not pool.waiting
    assert pool.state.proved() and pool.state.best_cost == 5 * 7
