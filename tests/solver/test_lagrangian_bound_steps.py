"""Bound-only Lagrangian steps (``Lagrangian.step``'s ``plan``) and the rules that pick them
(run/bound_steps.py): a bound-only step makes no plan, moves lam as a planning step does and its
bound stays certified (at most the enumerated optimum); ``PlanSchedule`` spaces the plans out once
they stop paying, and ``BoundShare`` gives the steps their share of the time (on a fake clock)."""

from __future__ import annotations

import time

import numpy as np

from autoshard.solver.bounds.lagrangian import Lagrangian
from autoshard.solver.bounds.relaxed_minimiser import relaxed_lagrangian
from autoshard.solver.core.reduced import FrozenCore
from autoshard.solver.run.bound_steps import BOUND_SHARE, BOUND_STALE, PLAN_MAX_GAP, BoundShare, PlanSchedule
from tests.solver.helpers import FakeClock, memory_cores
from tests.solver.test_lagrangian import Enumeration


class CountingEnumeration(Enumeration):
    """Enumeration that counts the plans asked of it."""

    def __init__(self, comp: FrozenCore) -> None:
        super().__init__(comp)
        self.plans_made = 0

    def plan(self, x: np.ndarray, deadline: float) -> tuple[np.ndarray, int] | None:
        self.plans_made += 1
        return super().plan(x, deadline)


def test_a_bound_only_step_makes_no_plan_and_moves_lam_as_a_planning_step_does() -> None:
    checked = 0
    for _, comp, best in memory_cores(range(200), 6):
        planning, bound_only = CountingEnumeration(comp), CountingEnumeration(comp)
        a, b = Lagrangian(comp, planning), Lagrangian(comp, bound_only)
        for _ in range(10):
            made, skipped = a.step(best, 0.0), b.step(best, 0.0, plan=False)
            assert skipped.plan is None and skipped.cost is None and skipped.answered
            assert skipped.bound == made.bound and skipped.bound is not None and skipped.bound <= best
            assert np.array_equal(a.lam, b.lam)
        assert bound_only.plans_made == 0 and planning.plans_made == 10
        checked += 1
        if checked >= 8:
            break
    assert checked >= 8


def test_bound_only_trws_steps_give_certified_bounds_at_most_the_optimum() -> None:
    """TRW-S as the minimiser (relaxed_minimiser.py), every step bound-only: each bound is at most
    the optimum by enumeration, and no plan is made (its ``plan`` would have been called)."""
    checked = 0
    for seed, comp, best in memory_cores(range(300), 6):
        lag = relaxed_lagrangian(comp, np.random.default_rng(seed))
        calls = []
        lag.minimiser.plan = lambda x, deadline: calls.append(x)  # type: ignore[method-assign]
        bounds = [lag.step(best, time.monotonic() + 60.0, plan=False).bound for _ in range(15)]
        assert all(b is not None and b <= best for b in bounds), (seed, bounds, best)
        assert not calls
        checked += 1
        if checked >= 10:
            break
    assert checked >= 10


def planning_steps(outcomes: dict[int, tuple[bool, bool]], steps: int) -> list[int]:
    """The steps a fresh PlanSchedule makes a plan on over ``steps`` steps, each planning step's
    outcome (gave a plan, beat the best) from ``outcomes`` (default: a plan that does not beat it)."""
    schedule, made = PlanSchedule(), []
    for step in range(1, steps + 1):
        if schedule.due(step):
            made.append(step)
            schedule.heard(step, *outcomes.get(step, (True, False)))
    return made


def test_plans_that_stop_beating_the_best_come_at_doubling_gaps_up_to_the_most() -> None:
    assert PLAN_MAX_GAP == 8  # the gaps below: 2, 4, 8, 8, ... (after a better plan: 1 first)
    assert planning_steps({}, 40) == [1, 3, 7, 15, 23, 31, 39]
    assert planning_steps({1: (True, True)}, 40) == [1, 2, 4, 8, 16, 24, 32, 40]


def test_a_plan_that_beats_the_best_brings_planning_back_to_every_step() -> None:
    assert planning_steps({1: (True, True), 16: (True, True), 17: (True, True)}, 40) == [1, 2, 4, 8, 16, 17, 18, 20, 24, 32, 40]


def test_a_step_that_gave_no_plan_leaves_the_next_step_due() -> None:
    assert planning_steps({1: (True, True), 2: (False, False), 3: (False, False)}, 12) == [1, 2, 3, 4, 6, 10]


def test_a_search_whose_plans_never_beat_the_best_plans_on_a_share_of_its_steps() -> None:
    """The point of the schedule: past the first few, one step in PLAN_MAX_GAP makes a plan."""
    made = planning_steps({}, 400)
    assert len(made) <= 4 + 400 // PLAN_MAX_GAP


def test_the_bound_gets_its_turns_once_other_work_has_taken_more_than_its_share() -> None:
    clock = FakeClock(now=100.0)
    share = BoundShare(clock)
    share.heard(1000, 3.0)  # a step of 3 s at the loop's start
    clock.now += 3.0
    assert not share.due()  # the steps have had all of the time so far
    clock.now += 9.0  # 9 s of neighbourhood search: the steps have had 3 of 12 s
    assert share.due()
    while share.due():  # bound turns of 0.5 s, each raising the bound
        share.heard(share.best + 1, 0.5)
        clock.now += 0.5
    assert share.spent >= BOUND_SHARE * (clock.now - 100.0) > share.spent - 0.5


def test_a_bound_that_stopped_rising_gets_no_turns() -> None:
    clock = FakeClock(now=0.0)
    share = BoundShare(clock)
    share.heard(1000, 0.1)
    for _ in range(BOUND_STALE - 1):
        share.heard(999, 0.1)
    clock.now = 100.0  # other work took the time
    assert share.due()
    share.heard(None, 0.1)  # no bound: no rise either
    assert not share.due()
    share.heard(1001, 0.1)  # it rose again
    assert share.due()
