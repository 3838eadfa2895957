"""HiGHS's MILP of a reduced core (milp.py) against enumeration on random small cores: its
optimum, the plans and bounds it reports while it runs, and a start plan it is given."""

from __future__ import annotations

import itertools
import os
import signal
from dataclasses import replace

import numpy as np

from autoshard.solver.core.reduced import FrozenCore
from autoshard.solver.engines.milp import solve_core_milp
from tests.solver.helpers import exited, memory_cores


def cores(count: int) -> list[tuple[FrozenCore, int]]:
    """Random cores with memory rows and at least one plan that fits, with their optima."""
    return [(comp, best) for _, comp, best in itertools.islice(memory_cores(range(400), 8), count)]


def fitting_plans(comp: FrozenCore) -> list[list[int]]:
    """Every plan of the core that fits, most expensive first."""
    plans = [list(x) for x in itertools.product(*[range(len(c)) for c in comp.costs]) if comp.is_feasible(list(x))]
    return sorted(plans, key=comp.cost, reverse=True)


def test_the_proved_optimum_is_the_enumerated_one_and_every_report_holds() -> None:
    checked = 0
    for comp, best in cores(25):
        heard: list[tuple[str, int, list[int] | None]] = []
        result = solve_core_milp(comp, exact=True, progress=lambda *event: heard.append(event))
        assert result.optimal and result.cost == best
        for kind, value, plan in heard:
            if kind == "plan":
                assert plan is not None and comp.is_feasible(plan) and comp.cost(plan) == value
            else:
                assert kind == "bound" and value <= best
        assert any(kind == "plan" for kind, _, _ in heard)
        checked += 1
    assert checked == 25


def test_a_start_plan_is_kept_or_bettered() -> None:
    started = 0
    for comp, best in cores(15):
        plans = fitting_plans(comp)
        for start in (plans[0], plans[-1]):  # the most and the least expensive
            heard: list[tuple[str, int, list[int] | None]] = []
            result = solve_core_milp(comp, exact=True, start=start, progress=lambda *event: heard.append(event))
            assert result.optimal and result.cost == best
            assert all(value <= comp.cost(start) for kind, value, _ in heard if kind == "plan")
            started += 1
    assert started == 30


def test_a_core_whose_limit_nothing_meets_gives_no_plan() -> None:
    checked = 0
    for comp, _ in cores(25):
        tight = replace(comp, capacity=np.zeros_like(comp.capacity))
        if fitting_plans(tight):
            continue
        result = solve_core_milp(tight, exact=True)
        assert result.choice is None and not result.optimal
        checked += 1
    assert checked >= 5


def test_a_child_forked_after_highs_ran_here_still_solves() -> None:
    comp, best = cores(1)[0]
    assert solve_core_milp(comp, exact=True).cost == best
    pid = os.fork()
    if pid == 0:  # the child: HiGHS's thread pool came with the fork, its threads did not
        result = solve_core_milp(comp, exact=True)
        os._exit(0 if result.cost == best else 1)
    if exited(pid):
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        return
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("HiGHS hung in the forked child")
