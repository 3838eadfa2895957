"""A stopped engine pool leaves no child running: every child it forked has exited when ``stop``
returns, the engines waiting for a processor included (they are dropped, not started)."""

from __future__ import annotations

import numpy as np

import autoshard.solver.run.workers as workers
from autoshard.solver.model.solution import SolveOptions
from autoshard.solver.run.engine_pool import EnginePool
from autoshard.solver.run.state import RunState
from autoshard.solver.core.reduced import Core
from autoshard.solver.core.rows import attach_memory
from tests.solver.helpers import exited, random_problem


def test_stopping_a_pool_with_engines_waiting_starts_none_and_leaves_no_child(monkeypatch) -> None:
    forked: list[int] = []
    fork = workers.fork_child
    monkeypatch.setattr(workers, "fork_child", lambda *args: forked.append(fork(*args)) or forked[-1])
    problem = random_problem(np.random.default_rng(0), 7, max_k=4, memory=True, forbid_prob=0.1)
    state = RunState(problem, SolveOptions(), lambda event: None)
    core = Core(problem)
    attach_memory(core, problem)
    state.built(core)
    state.reduced({})
    pool = EnginePool(state)
    pool.start(["toulbar2-no-rows"], "toulbar2 on the core without memory rows")
    pool.waiting = [(["second-search"], "a second search", state.clock() + 1000.0)]
    pool.stop()
    assert len(forked) == 1 and all(engine.pid is None for engine in pool.engines)
    assert all(exited(pid) for pid in forked)
