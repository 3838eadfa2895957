"""Plans that overflow memory from the relaxation (toulbar2 without the memory rows) are kept by
the engine pool, once, and made to fit by whole-layer flips (run/handover.py)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np

from autoshard.solver.core.reduced import Core
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.engines.milp import solve_core_milp
from autoshard.solver.model.events import Improved
from autoshard.solver.model.problem import Tally
from autoshard.solver.model.solution import SolveOptions
from autoshard.solver.procs.engine_events import EngineEvent
from autoshard.solver.run.engine_pool import EnginePool
from autoshard.solver.run.handover import fit_by_flips_and_polish
from autoshard.solver.run.state import RunState
from autoshard.solver.run.workers import EngineWorker
from tests.solver.test_branching import layers_that_must_partly_recompute


def _state(events: list) -> RunState:
    """A run on eight layers under 35 bytes whose layers recompute in one of two ways, as a group
    each (keep <-> recompute at 7 ticks; 8 ticks flips back to keep), reduced to its core."""
    groups = tuple(((layer, (1, 2), (1, 0, 0)),) for layer in range(8))
    problem = replace(layers_that_must_partly_recompute(), tallies=[Tally("recomputing layers", groups)])
    state = RunState(problem, SolveOptions(), events.append)
    core = Core(problem)
    attach_memory(core, problem)
    state.built(core)
    state.reduced({})
    return state


def test_the_pool_keeps_the_relaxations_overflowing_plan_once_and_no_other() -> None:
    state = _state([])
    pool = EnginePool(state)
    relaxation, exact = (EngineWorker(state.comp, method, None) for method in ("toulbar2-no-rows", "toulbar2"))
    every_kept = [0] * 8
    pool._take(EngineEvent("plan", state.comp.cost(every_kept), every_kept), exact)
    assert pool.take_unfit() is None  # an exact engine's plans fit (or are refused)
    fitting = [1] * 5 + [0] * 3
    pool._take(EngineEvent("plan", state.comp.cost(fitting), fitting), relaxation)
    assert pool.take_unfit() is None and state.best == fitting
    pool._take(EngineEvent("plan", state.comp.cost(every_kept), every_kept), relaxation)
    assert pool.take_unfit().tolist() == every_kept and pool.take_unfit() is None


def test_an_overflowing_plan_is_made_to_fit_and_offered_at_the_optimum() -> None:
    events: list = []
    state = _state(events)
    fit_by_flips_and_polish(state, np.zeros(8, dtype=np.int64))
    optimum = min(state.problem.cost(list(c)) for c in itertools.product(range(3), repeat=8)
                  if state.problem.evaluate(list(c)).feasible)
    assert state.best_cost == optimum == solve_core_milp(state.comp, exact=True).cost
    assert [e.source for e in events if isinstance(e, Improved)] == ["flips"]
