"""solve(): optima confirmed by brute force or HiGHS, CEGIS event semantics, infeasibility."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.solver.model.iopddl import load_problem
from autoshard.solver.model.problem import FORBIDDEN, ShardingProblem
from autoshard.solver import Checked, EngineFailed, Finished, Improved, InfeasibleError, LowerBound, SolveOptions, solve
from autoshard.solver.run.engine_pool import EnginePool
from autoshard.solver.engines.milp import solve_problem_milp

from tests.solver.helpers import EXAMPLE, brute_force, infeasible_beyond_the_smallest_peak_bound, needs_shared, random_problem



def run(problem: ShardingProblem, **options):
    events = []
    solution = solve(problem, SolveOptions(**options), events.append)
    return solution, events


@needs_shared
def test_example_solves_to_its_optimum():
    solution, events = run(load_problem(EXAMPLE))
    assert solution.status == "optimal" and solution.cost == 445
    assert load_problem(EXAMPLE).evaluate(solution.choice).cost == 445
    assert isinstance(events[-1], Finished) and events[-1].solution is solution


@needs_shared
def test_raw_cegis_shows_every_plan_until_unsat():
    """reduce=False, warm_start=False: z3's plans with strictly falling cost, then UNSAT."""
    problem = load_problem(EXAMPLE)
    solution, events = run(problem, reduce=False, warm_start=False)
    improved = [e for e in events if isinstance(e, Improved)]
    checks = [e for e in events if isinstance(e, Checked)]
    assert len(improved) >= 2
    assert [e.result for e in checks] == ["sat"] * len(improved) + ["unsat"]
    assert improved[0].bound is None
    for prev, nxt in zip(improved, improved[1:]):
        assert nxt.cost < prev.cost and nxt.bound == prev.cost and nxt.source == "z3"
    for e in improved:
        assert problem.evaluate(list(e.choice)).cost == e.cost
    assert checks[-1].bound == improved[-1].cost
    assert solution.status == "optimal" and solution.proof == "z3" and solution.cost == 445


def test_raw_cegis_on_twenty_nodes_matches_highs():
    rng = np.random.default_rng(21)
    problem = random_problem(rng, 20, max_k=4, edge_prob=0.12, memory=True, forbid_prob=0.05)
    solution, events = run(problem, reduce=False, warm_start=False)
    costs = [e.cost for e in events if isinstance(e, Improved)]
    assert costs == sorted(costs, reverse=True) and len(set(costs)) == len(costs)
    reference = solve_problem_milp(problem)
    assert reference.optimal and solution.status == "optimal" and solution.cost == reference.cost


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), memory=st.booleans(), reduce=st.booleans(), warm=st.booleans())
def test_optimum_matches_brute_force(seed, memory, reduce, warm):
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, int(rng.integers(1, 7)), memory=memory)
    reference = brute_force(problem)
    if reference is None:
        with pytest.raises(InfeasibleError) as err:
            solve(problem, SolveOptions(reduce=reduce, warm_start=warm))
        assert err.value.solution.status == "infeasible" and "\n" not in str(err.value)
        return
    solution = solve(problem, SolveOptions(reduce=reduce, warm_start=warm))
    assert solution.status == "optimal" and solution.cost == reference[0]
    assert problem.evaluate(solution.choice).cost == solution.cost and problem.is_feasible(solution.choice)


def test_no_plan_fits_is_proved_when_the_engines_find_no_plan():
    problem = infeasible_beyond_the_smallest_peak_bound()
    assert brute_force(problem) is None
    with pytest.raises(InfeasibleError) as err:
        solve(problem, SolveOptions(reduce=False, warm_start=True))
    assert err.value.solution.status == "infeasible" and "no plan fits" in str(err.value)


def larger_problem(seed: int) -> ShardingProblem:
    """40 nodes that leave a core of 10-26 nodes after reduction (memory when seed is even)."""
    rng = np.random.default_rng(seed)
    return random_problem(rng, 40, max_k=6, edge_prob=0.1, memory=seed % 2 == 0, forbid_prob=0.03, functional_prob=0.1)


@pytest.mark.parametrize("seed", [201, 204, 206, 208, 210])
def test_optimum_on_larger_problems_matches_highs(seed):
    problem = larger_problem(seed)
    reference = solve_problem_milp(problem)
    solution = solve(problem, SolveOptions())
    assert reference.optimal and solution.status == "optimal"
    assert solution.cost == reference.cost


def test_time_limit_returns_best_plan_with_a_valid_bound():
    problem = larger_problem(208)
    solution, events = run(problem, timeout=1.0, prove=False)
    reference = solve_problem_milp(problem)
    assert solution.status in ("optimal", "feasible") and problem.is_feasible(solution.choice)
    assert solution.lower_bound is None or solution.lower_bound <= reference.cost <= solution.cost
    bounds = [e.value for e in events if isinstance(e, LowerBound)]
    assert bounds == sorted(bounds)


def memory_problem(limit: int) -> ShardingProblem:
    """Two overlapping nodes whose cheapest strategies need 8 + 7 memory, smallest 3 + 2."""
    costs = [np.array([1, 9], dtype=np.int64), np.array([1, 6], dtype=np.int64)]
    usages = [np.array([8, 3], dtype=np.int64), np.array([7, 2], dtype=np.int64)]
    return ShardingProblem(costs, usages, [(0, 10), (5, 12)], [(0, 1)], [np.zeros((2, 2), dtype=np.int64)], limit)


def test_memory_limit_changes_the_plan():
    assert solve(memory_problem(15)).cost == 2
    assert solve(memory_problem(10)).cost == 7  # 8 + 2 fits, 3 + 7 fits: 1 + 6 or 9 + 1
    assert solve(memory_problem(5)).cost == 15


@pytest.mark.parametrize("warm", [True, False])
def test_infeasible_memory_limit_names_the_smallest_peak(warm):
    events = []
    with pytest.raises(InfeasibleError) as err:
        solve(memory_problem(4), SolveOptions(warm_start=warm), events.append)
    message = str(err.value)
    assert "smallest achievable peak is 5" in message and "raise" in message and "\n" not in message
    assert err.value.solution.status == "infeasible"
    assert isinstance(events[-1], Finished) and events[-1].solution.status == "infeasible"


def test_first_check_unsat_is_reported_as_infeasible():
    """Memory alone would fit (peak 5) but the only fitting pair is forbidden: z3's first check is UNSAT."""
    problem = memory_problem(5)
    problem.edge_costs[0][1, 1] = FORBIDDEN
    events = []
    with pytest.raises(InfeasibleError) as err:
        solve(problem, SolveOptions(reduce=False, warm_start=False), events.append)
    checks = [e for e in events if isinstance(e, Checked)]
    assert [c.result for c in checks] == ["unsat"] and checks[0].bound is None
    assert "no plan fits" in str(err.value)
    assert events[-1].solution.status == "infeasible"


def test_forbidden_everywhere_is_infeasible():
    problem = memory_problem(100)
    problem.edge_costs[0][:] = FORBIDDEN
    with pytest.raises(InfeasibleError) as err:
        solve(problem)
    assert "forbidden" in str(err.value)


def test_huge_costs_and_usages_stay_exact():
    """Weights beyond z3's 32-bit pseudo-Boolean coefficients are scaled without losing the optimum."""
    rng = np.random.default_rng(11)
    for seed in range(6):
        rng = np.random.default_rng(seed)
        problem = random_problem(rng, 5, memory=True)
        problem.node_costs = [
            np.where(c >= FORBIDDEN, FORBIDDEN, c * 10**9 + rng.integers(0, 3, len(c))) for c in problem.node_costs
        ]
        problem.edge_costs = [np.where(m >= FORBIDDEN, FORBIDDEN, m * 10**9) for m in problem.edge_costs]
        problem.node_usages = [u * 10**9 for u in problem.node_usages]
        problem.usage_limit = problem.usage_limit * 10**9 + 5
        reference = brute_force(problem)
        if reference is None:
            continue
        solution = solve(problem, SolveOptions(reduce=False, warm_start=False))
        assert solution.cost == reference[0]


@pytest.mark.parametrize("seed", [204, 226])
def test_untimed_solve_proves_by_exact_ilp_when_z3_cannot_take_the_core(seed, monkeypatch):
    import autoshard.solver.run.z3_phases as z3_phases

    monkeypatch.setattr(z3_phases, "Z3_MAX_TERMS", -1)  # z3 refuses the core, as it does cores too large to encode
    problem = larger_problem(seed)
    reference = solve_problem_milp(problem)
    solution = solve(problem, SolveOptions(toulbar=False))
    assert solution.status == "optimal" and solution.proof == "milp"
    assert reference.optimal and solution.cost == reference.cost


def test_a_failing_engine_is_reported_and_the_search_goes_on_without_it(monkeypatch):
    import autoshard.solver.search.turns as turns

    def broken(*args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(turns, "run", broken)  # the forked child runs this
    problem = larger_problem(204)  # memory rows: the second Lagrangian search takes a processor
    events: list[object] = []
    solution = solve(problem, SolveOptions(timeout=3.0, prove=False, toulbar=False), on_event=events.append)
    failed = [(e.method, e.error) for e in events if isinstance(e, EngineFailed)]
    assert failed == [("second-search", "RuntimeError: boom")]
    assert solution.cost is not None and problem.evaluate(solution.choice).feasible


@pytest.mark.parametrize("seed", [204, 226, 7])
def test_toulbar2_proves_the_optimum_that_highs_finds(seed):
    problem = larger_problem(seed)
    reference = solve_problem_milp(problem)
    solution = solve(problem, SolveOptions())
    assert reference.optimal and solution.status == "optimal" and solution.cost == reference.cost
    assert solution.proof in solution.proof_times and problem.evaluate(solution.choice).feasible


def test_gap_stops_early_with_a_bound_that_holds():
    problem = larger_problem(226)
    reference = solve_problem_milp(problem)
    solution = solve(problem, SolveOptions(gap=0.5))
    assert solution.cost is not None and reference.cost <= solution.cost
    assert solution.lower_bound is not None and solution.lower_bound <= reference.cost
    assert solution.cost - solution.lower_bound <= 0.5 * solution.cost


@pytest.mark.parametrize("seed", [204, 206])
def test_memory_rows_too_large_for_toulbar2_leave_it_the_core_without_them(seed, monkeypatch):
    """With rows too large for toulbar2 and an ILP too large for HiGHS, toulbar2 still searches
    the core without its rows first (LLaMA-3-8B on 2x8 at 80 GiB: its optimum fits, so it proves),
    the second Lagrangian search after it."""
    import autoshard.solver.run.portfolio as portfolio
    import autoshard.solver.engines.toulbar as toulbar

    monkeypatch.setattr(toulbar, "MAX_ROW_TERMS", 0)
    monkeypatch.setattr(portfolio, "MILP_MAX_COLUMNS", 0)
    started: list[str] = []
    start = EnginePool.start
    monkeypatch.setattr(EnginePool, "start", lambda self, methods, what: started.extend(methods) or start(self, methods, what))
    problem = larger_problem(seed)
    problem.usage_limit = None
    free = solve_problem_milp(problem)
    problem.usage_limit = problem.evaluate(free.choice).peak  # rows that bind only the plans above it
    reference = solve_problem_milp(problem)
    solution = solve(problem, SolveOptions(timeout=60.0))
    assert started[0] == "toulbar2-no-rows" and set(started) <= {"toulbar2-no-rows", "second-search"}
    assert reference.optimal and solution.status == "optimal" and solution.cost == reference.cost
