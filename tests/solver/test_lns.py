"""Large-neighbourhood search: the restricted problem is exact, and LNS only ever improves."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from autoshard.solver.core.reduced import Core
from autoshard.solver.core.local_search import Search, min_memory_start
import autoshard.solver.search.lns as lns_module
from autoshard.solver.search.lns import NeighbourhoodSearch, restrict
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.engines.milp import solve_core_milp
from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver.model.solution import SolveOptions
from autoshard.solver.engines.toulbar import improve

from tests.solver.helpers import FakeClock, random_problem


def compact(seed: int, nodes: int, forbid: float = 0.05):
    problem = random_problem(np.random.default_rng(seed), nodes, forbid_prob=forbid, functional_prob=forbid)
    core = Core(problem)
    attach_memory(core, problem)
    return core.freeze()


@pytest.mark.parametrize("seed", range(8))
def test_restricted_problem_prices_and_fits_exactly_like_the_whole(seed):
    comp = compact(seed, 7)
    rng = np.random.default_rng(seed)
    x = np.array([int(rng.integers(len(c))) for c in comp.costs])
    nodes = np.sort(rng.choice(comp.n, size=3, replace=False))
    sub = restrict(comp, x, nodes)
    for y in itertools.product(*[range(len(comp.costs[v])) for v in nodes]):
        z = x.copy()
        z[nodes] = y
        if comp.cost(z) < 2**59 and comp.cost(x) < 2**59:
            assert comp.cost(z) - comp.cost(x) == sub.cost(list(y)) - sub.cost(list(x[nodes]))
        if comp.overflow(x) == 0:
            assert (comp.overflow(z) == 0) == (sub.overflow(list(y)) == 0)


@pytest.mark.parametrize("solver", ["toulbar2", "highs"])
@pytest.mark.parametrize("seed", range(6))
def test_lns_never_worsens_and_reaches_the_optimum_when_it_covers_everything(seed, solver, monkeypatch):
    if solver == "highs":  # as for neighbourhoods whose rows are too large for toulbar2
        monkeypatch.setattr(lns_module, "can_take", lambda sub: False)
    comp = compact(100 + seed, 9, forbid=0.0)  # the minimum-memory start then fits
    best = solve_core_milp(comp, 10.0)
    start = repaired_start(comp, seed)
    if best.choice is None or not best.optimal or not start.feasible:
        pytest.skip("no fitting plan")
    small = NeighbourhoodSearch(comp, np.random.default_rng(seed), size=3, clock=FakeClock())
    x = small.run(start.x, small.clock.now + 100.0, stop=lambda: small.rounds >= 3)
    assert comp.is_feasible(x) and comp.cost(x) <= start.total
    whole = NeighbourhoodSearch(comp, np.random.default_rng(seed), size=comp.n, clock=FakeClock())
    x = whole.run(start.x, whole.clock.now + 100.0, stop=lambda: whole.rounds >= 1)  # one covers the core
    assert comp.is_feasible(x) and comp.cost(x) == best.cost


@pytest.mark.parametrize("seed", range(4))
def test_lns_hands_over_each_better_plan_and_stops_when_told(seed):
    comp = compact(200 + seed, 9, forbid=0.0)
    start = repaired_start(comp, seed)
    if not start.feasible:
        pytest.skip("no fitting plan")
    seen: list[int] = []
    whole = NeighbourhoodSearch(comp, np.random.default_rng(seed), size=comp.n, clock=FakeClock())
    result = whole.run(start.x, whole.clock.now + 100.0, lambda y: seen.append(comp.cost(y)),
                       stop=lambda: whole.rounds >= 2)
    assert seen == sorted(seen, reverse=True) and len(set(seen)) == len(seen)
    assert all(cost < start.total for cost in seen)
    assert comp.cost(result) == (seen[-1] if seen else start.total)
    asked: list[bool] = []
    told = NeighbourhoodSearch(comp, np.random.default_rng(seed), size=comp.n, clock=FakeClock())
    same = told.run(start.x, told.clock.now + 30.0, stop=lambda: asked.append(True) or True)
    assert asked == [True] and told.rounds == 0 and (same == start.x).all()


HANG = 60.0
"""Seconds after which a repair counts as stuck: a guard, not a measure (it takes milliseconds here)."""


def repaired_start(comp, seed: int) -> Search:
    """The minimum-memory start moved off its overflowing rows."""
    start = Search(comp, min_memory_start(comp), np.random.default_rng(seed))
    start.repair(time.monotonic() + HANG)
    return start


def stalled_of(problem, options, clock=None):
    """What a run on ``problem`` hands over to when its Lagrangian plans stall (nothing reduced or
    started), on a fake clock (the run's searches read it): ``clock``, else one that stands still."""
    from autoshard.solver.core.reduced import Core
    from autoshard.solver.run.engine_pool import EnginePool
    from autoshard.solver.core.rows import attach_memory
    from autoshard.solver.run.handover import StalledSearch
    from autoshard.solver.run.state import RunState

    state = RunState(problem, options, lambda event: None, clock=clock or FakeClock())
    core = Core(problem)
    attach_memory(core, problem)
    state.built(core)
    state.reduced({})
    return StalledSearch(state, EnginePool(state))


def test_a_slice_is_due_after_stale_steps_of_this_process_whoever_found_the_best_plan():
    """The rule for handing over: a slice of neighbourhood search after LNS_AFTER_STEPS Lagrangian
    steps and twenty steps' time without a plan of its own, at once while the last slice paid,
    never without a plan; a better plan from another engine does not put it off."""
    from autoshard.solver.search.lns import LNS_AFTER_STEPS

    stalled = stalled_of(random_problem(np.random.default_rng(0), 6), SolveOptions(), FakeClock())
    now = stalled.state.clock.now
    stale = (now - 100.0, LNS_AFTER_STEPS)
    assert not stalled.due(stale, 0.1)  # no plan to improve yet
    stalled.state.best_local = np.zeros(6, dtype=np.int64)
    stalled.state.best_cost = 10
    assert stalled.due(stale, 0.1)
    stalled.state.best_cost = 9  # another engine's better plan: still due
    assert stalled.due(stale, 0.1)
    assert not stalled.due((now - 100.0, LNS_AFTER_STEPS - 1), 0.1)
    assert not stalled.due((now - 1.0, LNS_AFTER_STEPS), 0.01)  # at least 2 s
    assert not stalled.due((now - 10.0, LNS_AFTER_STEPS), 1.0)  # twenty steps' time
    stalled.paid = True
    assert stalled.due((now, 0), 1.0)


def test_under_a_time_limit_a_slice_is_also_due_after_a_share_of_it_without_a_plan():
    """Slow steps (IOPDDL R: 1.5 s each) must not hold neighbourhood search off for thirty of
    them: LNS_MIN_STEPS steps and LNS_STALL_SHARE of the limit without a plan suffice."""
    from autoshard.solver.run.handover import LNS_MIN_STEPS, LNS_STALL_SHARE
    from autoshard.solver.search.lns import LNS_AFTER_STEPS

    problem = random_problem(np.random.default_rng(0), 6)
    limit = 100.0
    stalled = stalled_of(problem, SolveOptions(timeout=limit), FakeClock())
    stalled.state.best_local, stalled.state.best_cost = np.zeros(6, dtype=np.int64), 10
    now = stalled.state.clock.now
    waited = LNS_STALL_SHARE * limit + 1.0
    step = waited / LNS_MIN_STEPS  # twenty steps' time has not passed
    assert LNS_MIN_STEPS < LNS_AFTER_STEPS
    assert stalled.due((now - waited, LNS_MIN_STEPS), step)
    assert not stalled.due((now - waited, LNS_MIN_STEPS - 1), step)
    assert not stalled.due((now - waited + 2.0, LNS_MIN_STEPS), step)
    untimed = stalled_of(problem, SolveOptions(), FakeClock())
    untimed.state.best_local, untimed.state.best_cost = stalled.state.best_local, 10
    assert not untimed.due((now - waited, LNS_MIN_STEPS), step)


def test_on_a_problem_with_repeated_layers_the_first_slice_does_not_wait_for_a_stall():
    """Layer copies take a neighbourhood's gain to every layer, so on a problem with repeated
    layers the first slice is due as soon as there is a plan; after it, the stall rules again."""
    def chain(layers):
        return ShardingProblem(node_costs=[np.array([3, 1 + i], dtype=np.int64) for i in range(6)],
                               node_usages=[np.array([1, 2], dtype=np.int64)] * 6,
                               intervals=[(i, i + 2) for i in range(6)], edges=[(i, i + 1) for i in range(5)],
                               edge_costs=[np.array([[0, 2], [2, 0]], dtype=np.int64)] * 5, usage_limit=9,
                               layers=layers)

    problem, layered = chain([]), chain([(0, 1, 2), (3, 4, 5)])
    layered.validate()
    fresh = (FakeClock().now, 0)
    for chosen, due in ((problem, False), (layered, True)):
        stalled = stalled_of(chosen, SolveOptions(timeout=100.0), FakeClock())
        assert not stalled.due(fresh, 0.1)  # no plan yet
        stalled.state.best_local, stalled.state.best_cost = np.zeros(6, dtype=np.int64), 10
        assert stalled.due((stalled.state.clock.now, 0), 0.1) is due
        stalled.sliced = True
        assert not stalled.due((stalled.state.clock.now, 0), 0.1)


def test_toulbar2_improves_a_plan_to_the_optimum_or_says_there_is_none(capfd):
    """toulbar.improve with a fitting plan: a cheaper fitting plan, the brute-force optimum on
    these small cores, and None from the optimum itself; nothing printed (in the main process
    fds 1 and 2 are the user's terminal)."""
    checked = 0
    for seed in range(40):
        comp = compact(300 + seed, 7, forbid=0.0)
        fits = [x for x in itertools.product(*[range(len(c)) for c in comp.costs]) if comp.is_feasible(x)]
        if len(fits) < 2:
            continue
        costs = [comp.cost(x) for x in fits]
        worst, best = fits[int(np.argmax(costs))], min(costs)
        if comp.cost(worst) == best:
            continue
        better = improve(comp, np.array(worst), 5, seed)
        assert better is not None and comp.is_feasible(better) and comp.cost(better) == best
        assert improve(comp, better, 5, seed) is None
        checked += 1
    assert checked >= 10
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_a_slice_goes_on_from_another_engines_better_plan_and_ends_when_none_comes():
    """A better plan heard from another engine during a slice does not end it: neighbourhood
    search starts again from that plan, until it returns with no newer plan than its own."""
    stalled = stalled_of(random_problem(np.random.default_rng(0), 6), SolveOptions())
    stalled.state.best_local, stalled.state.best_cost = np.zeros(6, dtype=np.int64), 10

    class Heard:
        """Neighbourhood search where another engine's plan arrives during the first run."""
        solvers: list = []

        def __init__(self) -> None:
            self.starts: list[list[int]] = []

        def run(self, x, deadline, found, stop):
            self.starts.append(list(x))
            if len(self.starts) == 1:
                stalled.state.best_local, stalled.state.best_cost = np.ones(6, dtype=np.int64), 7
                assert stop()  # told to stop: the best plan is not the slice's
            else:
                assert not stop()
            return x

    lns = Heard()
    stalled.lns = lns
    stalled._slice()
    assert lns.starts == [[0] * 6, [1] * 6]


def test_the_solvers_share_the_time_not_the_picks(monkeypatch):
    """While neither gains, each solver gets half of the time, however long its neighbourhoods
    take (picking each half of the time gave the slow one five sixths of it here). The clock is
    simulated: each neighbourhood advances it by its solver's time, so the test measures the
    rule, not the machine's load."""
    took = {"toulbar2": 0.01, "highs": 0.05}
    clock = FakeClock()

    def solve(self, solver, sub, start, left):
        clock.now += took[solver.name]
        return None, True

    monkeypatch.setattr(NeighbourhoodSearch, "solve", solve)
    comp = compact(5, 9, forbid=0.0)
    search = NeighbourhoodSearch(comp, np.random.default_rng(0), size=3, clock=clock)
    search.run(np.zeros(comp.n, dtype=np.int64), clock.now + 3.0)
    toulbar2, highs = search.shares.spent  # ~1 s each; picks by halves: ~0.33 s and ~1.67 s
    assert toulbar2 > 0.5 and abs(toulbar2 - highs) <= 0.06  # within one HiGHS turn of each other
    assert search.solvers[0].rounds >= 3 * search.solvers[1].rounds


@pytest.mark.parametrize("seed", range(3))
def test_each_neighbourhoods_relative_gain_is_recorded_for_its_solver(seed, monkeypatch):
    """The gains the shares are computed from chain from the start plan's cost to the result's."""
    comp = compact(300 + seed, 9, forbid=0.0)
    start = repaired_start(comp, seed)
    if not start.feasible:
        pytest.skip("no fitting plan")
    search = NeighbourhoodSearch(comp, np.random.default_rng(seed), size=4, clock=FakeClock())
    result = search.run(start.x, search.clock.now + 100.0, stop=lambda: search.rounds >= 4)
    cost = float(start.total)
    for _, kind, _, gain in search.shares.turns:
        assert kind in (0, 1) and 0.0 <= gain < 1.0
        cost *= 1.0 - gain
    assert abs(cost - comp.cost(result)) <= 1e-9 * abs(start.total)
    assert len(search.shares.turns) == search.rounds == sum(s.rounds for s in search.solvers)


def grown_by_the_rule(comp, first, size, max_columns, order):
    """``lns._grow``'s rule in plain Python over the FrozenCore's own neighbour lists."""
    taken: list[int] = []
    queue, columns = list(first), 0
    while queue and len(taken) < size:
        i = queue.pop(0)
        if i in taken:
            continue
        more = len(comp.costs[i]) + sum(m.size for j, m in comp.nbrs[i] if j in taken)
        if taken and columns + more > max_columns:
            continue
        columns += more
        taken.append(i)
        start = int(comp.arrays.nb_ptr[i])
        ranked = sorted(range(len(comp.nbrs[i])), key=lambda q: order[start + q])
        queue += [comp.nbrs[i][q][0] for q in ranked if comp.nbrs[i][q][0] not in taken]
    return taken


@pytest.mark.parametrize("seed", range(6))
def test_neighbourhoods_grow_breadth_first_within_their_size_and_columns(seed):
    comp = compact(400 + seed, 12, forbid=0.0)
    rng = np.random.default_rng(seed)
    for size, max_columns in ((3, 10**6), (12, 10**6), (12, 40), (5, 1)):
        first = rng.choice(comp.n, size=2, replace=False)
        order = rng.random(len(comp.arrays.nb_other))
        grown = lns_module._grow(first, size, max_columns, order, comp.arrays.c_off, comp.arrays.nb_ptr,
                                 comp.arrays.nb_other)
        assert grown.tolist() == grown_by_the_rule(comp, first.tolist(), size, max_columns, order)
