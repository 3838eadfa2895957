"""The reductions and the memory-weighted start keep their deadline, on a fake clock: each loop reads the
clock before every unit of work and stops at the first reading past the deadline."""

from __future__ import annotations

import itertools

import numpy as np

import autoshard.solver.core.reduce as reduce_module
import autoshard.solver.search.penalised_start as penalised_start
from autoshard.solver.core.reduced import Core
from autoshard.solver.core.reduce import reduce_core
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.search.penalised_start import weighted_start
from tests.solver.helpers import brute_force, random_problem
from tests.solver.test_penalised_start import flag_chain


class Ticks:
    """A fake clock: each reading is one tick later than the one before."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> float:
        self.now += 1
        return float(self.now)


def test_reductions_stop_at_the_deadline_and_stay_exact(monkeypatch):
    steps = []
    real_step = reduce_module.step
    monkeypatch.setattr(reduce_module, "step", lambda *a: (steps.append(a[1]), real_step(*a))[1])
    rng = np.random.default_rng(7)
    problem = random_problem(rng, 7, memory=True)
    while brute_force(problem) is None:
        problem = random_problem(rng, 7, memory=True)
    core = Core(problem)
    attach_memory(core, problem)
    clock = Ticks()
    reduce_core(core, deadline=3.0, clock=clock)
    assert len(steps) <= 3 and clock.now <= 4  # stopped at the first reading past 3
    comp = core.freeze()
    best = min(comp.cost(list(x)) for x in itertools.product(*[range(len(c)) for c in comp.costs])
               if comp.is_feasible(list(x)))
    assert best == brute_force(problem)[0]  # cut short, still exact


def test_reductions_without_a_deadline_run_to_the_fixpoint():
    rng = np.random.default_rng(7)
    problem = random_problem(rng, 7, memory=False)
    core = Core(problem)
    reduce_core(core, clock=Ticks())
    assert not core.alive or all(len(core.adj[v]) > 2 for v in core.alive)


def test_the_weighted_start_sets_up_trws_only_when_its_measured_time_fits(monkeypatch):
    problem = flag_chain(8)
    core = Core(problem)
    attach_memory(core, problem)
    comp = core.freeze()
    built = []
    real = penalised_start.MessagePassing
    monkeypatch.setattr(penalised_start, "MessagePassing", lambda c: (built.append(c), real(c))[1])
    # the pass over the segments reads 1 then 2 on the fake clock: one tick, so the set-up needs 15
    assert weighted_start(comp, np.random.default_rng(0), 2.0 + 14.0, clock=Ticks()) is None and not built
    weighted_start(comp, np.random.default_rng(0), 2.0 + 16.0, clock=Ticks())
    assert built  # (its sweeps then keep the deadline on the real clock: test_penalised_start.py)
