"""The call server: one child answers call after call, and a call that raises, overruns its
deadline or ends the process costs that call only; restricted cores pickle without their
derived parts and come back whole."""

from __future__ import annotations

import os
import pickle
import time

import numpy as np

from autoshard.solver.procs.call_server import CallServer
from autoshard.solver.core.reduced import Core

from tests.solver.helpers import FakeClock, exited, random_problem


def _pid_times(k: int) -> tuple[int, int]:
    return os.getpid(), 3 * k


def _raise() -> None:
    raise ValueError("in the child")


def _late(seconds: float) -> str:
    time.sleep(seconds)
    return "late"


def _exit_quietly() -> None:
    os._exit(0)  # as toulbar2 once did: the process gone, no answer written


def test_one_child_answers_every_call_until_one_overruns_its_deadline():
    clock = FakeClock(step=1.0)  # a second per reading: a call that hangs fails after ten readings
    with CallServer(clock) as server:
        answers = [server.call(_pid_times, (k,), clock.now + 10) for k in range(4)]
        assert [value for _, value in answers] == [0, 3, 6, 9]
        pids = {pid for pid, _ in answers}
        assert len(pids) == 1 and os.getpid() not in pids and server.forks == 1
        assert server.call(_raise, (), clock.now + 10) is None  # raised: no value ...
        assert server.call(_pid_times, (5,), clock.now + 10) == (pids.pop(), 15)  # ... same child
        assert server.call(_late, (30,), clock.now + 0.5) is None  # past it at the second reading: killed
        pid, value = server.call(_pid_times, (2,), clock.now + 10)
        assert value == 6 and server.forks == 2  # a new child
        assert server.call(_exit_quietly, (), clock.now + 10) is None
        assert server.call(_pid_times, (1,), clock.now + 10)[1] == 3 and server.forks == 3
        last = server.pid
    assert server.pid is None and last is not None and exited(last)  # the child ends with the block


def test_a_core_pickles_without_its_derived_parts_and_comes_back_whole():
    problem = random_problem(np.random.default_rng(3), 8, forbid_prob=0.1)
    comp = Core(problem).freeze()
    x = np.zeros(comp.n, dtype=np.int64)
    cost = comp.cost(x)  # builds ``arrays``
    state = comp.__getstate__()
    assert "nbrs" not in state and "_arrays" not in state
    back = pickle.loads(pickle.dumps(comp))
    assert back.cost(x) == cost
    assert [[(j, m.tolist()) for j, m in nb] for nb in back.nbrs] == [[(j, m.tolist()) for j, m in nb] for nb in comp.nbrs]
