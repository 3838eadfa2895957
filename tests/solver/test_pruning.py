"""Pruning by TRW-S's split bound (trws.MessagePassing.floors, pruning.py) and toulbar2's proof on
the strategies left (toulbar.prove_among), checked against enumeration on small cores."""

from __future__ import annotations

import itertools

import numpy as np

from autoshard.solver.core.reduced import INF, Core, FrozenCore
from autoshard.solver.run.engine_pool import EnginePool
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver.run.pruning import PrunedProof, allowed_strategies
from autoshard.solver.model.solution import SolveOptions
from autoshard.solver.run.state import RunState
from autoshard.solver.engines.toulbar import prove_among
from autoshard.solver.bounds.trws import MessagePassing
from tests.solver.helpers import random_problem


def unreduced(seed: int, memory: bool) -> tuple[ShardingProblem, Core, FrozenCore]:
    """A small random problem with cycles and its core, nothing reduced."""
    problem = random_problem(np.random.default_rng(seed), 7, max_k=4, edge_prob=0.5, memory=memory)
    core = Core(problem)
    attach_memory(core, problem)
    return problem, core, core.freeze()


def plans(comp: FrozenCore) -> list[tuple[int, ...]]:
    """Every plan without a forbidden strategy or pair."""
    return [x for x in itertools.product(*[range(len(c)) for c in comp.costs]) if comp.cost(list(x)) < INF]


def test_every_plan_pays_the_bound_plus_the_floor_of_each_of_its_strategies() -> None:
    checked = 0
    for seed in range(30):
        _, _, comp = unreduced(seed, memory=False)
        mp = MessagePassing(comp)
        for sweeps in (0, 1, 4):
            for _ in range(sweeps):
                mp.sweep()
            value, scale, floors = mp.floors()
            margin = 1e-9 * (scale + abs(value)) + 1.0
            for x in plans(comp):
                cost = comp.cost(list(x))
                assert all(cost >= value + floors[i][s] - margin for i, s in enumerate(x))
                checked += 1
    assert checked > 1000


def test_the_strategies_left_hold_every_plan_as_cheap_as_the_bound_and_toulbar2_proves_the_optimum() -> None:
    proved = 0
    for seed in range(40):
        _, _, comp = unreduced(seed, memory=True)
        fitting = [x for x in plans(comp) if comp.is_feasible(list(x))]
        if len(fitting) < 2:
            continue
        best = min(comp.cost(list(x)) for x in fitting)
        worst = max(comp.cost(list(x)) for x in fitting)
        mp = MessagePassing(comp)
        for _ in range(3):
            mp.sweep()
        value, scale, floors = mp.floors()
        for upper in (best, worst):
            allowed = allowed_strategies(value, scale, floors, upper)
            cheap = [x for x in plans(comp) if comp.cost(list(x)) <= upper]
            assert all(s in allowed[i] for x in cheap for i, s in enumerate(x))
            answer = prove_among(comp, allowed, upper, 5, seed)
            assert answer is not None
            x, done = answer
            assert done and comp.is_feasible(x) and comp.cost(x) == best
        assert prove_among(comp, allowed_strategies(value, scale, floors, best - 1), best - 1, 5, seed) is None
        proved += 1
    assert proved >= 15


def test_an_attempt_takes_the_run_from_a_dearer_plan_to_the_proved_optimum() -> None:
    attempted = 0
    for seed in range(40):
        problem, core, comp = unreduced(seed, memory=True)
        fitting = [x for x in plans(comp) if comp.is_feasible(list(x))]
        costs = [comp.cost(list(x)) for x in fitting]
        if len(set(costs)) < 2:
            continue
        state = RunState(problem, SolveOptions(), lambda event: None)
        state.built(core)
        state.reduced({})
        assert state.offer(np.array(fitting[int(np.argmax(costs))]), "test", None)
        proof = PrunedProof(state, EnginePool(state), lambda: False)
        proof.mp = MessagePassing(comp)
        proof._attempt()
        assert state.best_cost == min(costs) and state.lower == min(costs)
        attempted += 1
    assert attempted >= 15


class RunningEngines:
    """An engine pool whose exact engines run for ``looks`` polls, then end; it hears nothing."""

    def __init__(self, looks: int) -> None:
        self.looks = looks
        self.engines: list = []

    def exact_running(self) -> bool:
        return self.looks > 0

    def poll(self, wait: float = 0.0) -> None:
        self.looks -= 1


def test_beside_toulbar2_on_memory_rows_the_lagrangian_takes_its_share_and_bounds_the_optimum() -> None:
    """On a core with memory rows nothing runs for ALONE seconds, then Lagrangian steps take at
    most their share of the time (plus one step): TRW-S's BESIDE_SHARE without toulbar2, the exact
    dual's EXACT_SHARE with it (the branching after it has none), and each bound they and the
    branching give is at most the optimum (enumeration); the clock is fake, a reading every half
    second."""
    from autoshard.solver.run import pruning
    from tests.solver.helpers import FakeClock

    # the exact dual's steps each call toulbar2 in a child: half the cores keep the test in seconds
    for toulbar, share, seeds in ((False, pruning.BESIDE_SHARE, 40), (True, pruning.EXACT_SHARE, 20)):
        bounded = 0
        for seed in range(seeds):
            problem, core, comp = unreduced(seed, memory=True)
            fitting = [x for x in plans(comp) if comp.is_feasible(list(x))]
            if not fitting or not comp.has_memory:
                continue
            best = min(comp.cost(list(x)) for x in fitting)
            clock = FakeClock(now=1e9, step=0.5)  # far ahead of time.monotonic: the steps' deadlines stay ahead
            state = RunState(problem, SolveOptions(toulbar=toulbar), lambda event: None, clock=clock)
            state.built(core)
            state.reduced({})
            sources = []
            state.bound = lambda value, source: sources.append((value, source))  # type: ignore[method-assign]
            began = clock.now
            PrunedProof(state, RunningEngines(100), lambda: False)._lagrangian_beside()
            steps = [value for value, source in sources if source != "branching"]
            assert all(value is None or value <= best for value, _ in sources)
            assert len(steps) <= share * (clock.now - began) + 1
            bounded += any(value is not None for value in steps)
        assert bounded >= seeds // 4


def test_lower_priority_raises_a_child_s_nice_value_and_leaves_an_ended_one_alone() -> None:
    """The engines' priority goes down by the amount asked (capped at 19); a pid that has ended
    raises nothing."""
    import os
    import subprocess

    from autoshard.solver.run.pruning import lower_priority

    child = subprocess.Popen(["sleep", "30"])
    try:
        before = os.getpriority(os.PRIO_PROCESS, child.pid)
        lower_priority(child.pid, 3)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == min(19, before + 3)
        lower_priority(child.pid, 40)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 19
    finally:
        child.kill()
        child.wait()
    lower_priority(child.pid, 3)
