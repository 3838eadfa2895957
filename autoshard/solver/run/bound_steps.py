"""Which of the run's Lagrangian steps (portfolio.py ``Portfolio._lagrangian``) work for plans
and which only for the bound.

A step's bound costs its minimise (TRW-S sweeps); making a plan from its minimiser (repair and
polish, ``RelaxedMinimiser.plan``) costs as much again or more, and the loop's plan engines
(toulbar2 on the penalised problem, neighbourhood search) take whole seconds between steps. Two
rules give the bound its time where plans no longer pay for theirs:

- ``PlanSchedule``: the steps make plans while those beat the best, then at doubling gaps;
- ``BoundShare``: while the bound still rises, Lagrangian steps get at least BOUND_SHARE of the
  loop's time, as bound-only steps that put the plan engines off (the loop gives them no turn
  while a slice of neighbourhood search is paying).
"""

from __future__ import annotations

from autoshard.solver.procs.clock import Clock

PLAN_MAX_GAP = 8
"""Most steps between the plans a ``PlanSchedule`` has its search make once they stop beating
the best: on IOPDDL T, repairing and polishing a step's minimiser took 0.25-0.6 s against the
step's 0.1-0.4 s, and no plan after the 30th of 69 steps beat the best (measured: see
benchmarks/README.md, "Lower bounds beside the published ones")."""
BOUND_SHARE = 1 / 3
"""Least share of the Lagrangian loop's time its steps get while their bound still rises: on
IOPDDL K and S neighbourhood search took 107 and 158 s of 180 and 240 s while the steps' bound
was still rising (K: 0.923 of the published bound at its 77th and last step; steps alone reach
0.988 in 44 s; measured: see benchmarks/README.md, "Lower bounds beside the published ones")."""
BOUND_STALE = 30
"""Steps without a better bound after which the bound no longer counts as rising (Polyak's steps
oscillate: on K the best bound rose only every 5-20 steps while it was still climbing)."""


class PlanSchedule:
    """Which steps of a Lagrangian search make a plan from their minimiser (``Lagrangian.step``'s
    ``plan``), the others being bound-only: every step while those plans beat the best; after a
    plan that does not, the gap to the next planning step doubles, up to PLAN_MAX_GAP, and it is
    back to one once a plan beats the best. A planning step that gave no plan (its minimiser
    overflowed past what ``plan`` repairs, which costs next to nothing) leaves the next step due."""

    def __init__(self) -> None:
        self.gap = 1
        self.next = 1  # the first step that makes a plan

    def due(self, step: int) -> bool:
        """Whether ``step`` (counted from 1) makes a plan."""
        return step >= self.next

    def heard(self, step: int, planned: bool, better: bool) -> None:
        """The outcome of planning step ``step``: whether it gave a plan, and that plan beat the best."""
        if not planned:
            self.next = step + 1
            return
        self.gap = 1 if better else min(2 * self.gap, PLAN_MAX_GAP)
        self.next = step + self.gap


class BoundShare:
    """Whether the loop's next step is the bound's turn: its Lagrangian steps have had less than
    BOUND_SHARE of the time since the loop began (read on ``clock``) and their best bound rose
    within the last BOUND_STALE steps. A bound turn is a bound-only step with no plan engine after it."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.began = clock()
        self.spent = 0.0  # seconds in Lagrangian steps
        self.best: int | None = None
        self.stale = 0

    def due(self) -> bool:
        """Whether the next step is a bound turn."""
        return self.stale < BOUND_STALE and self.spent < BOUND_SHARE * (self.clock() - self.began)

    def heard(self, bound: int | None, seconds: float) -> None:
        """A Lagrangian step that took ``seconds`` and certified ``bound`` (None: none)."""
        self.spent += seconds
        if bound is not None and (self.best is None or bound > self.best):
            self.best, self.stale = bound, 0
        else:
            self.stale += 1
