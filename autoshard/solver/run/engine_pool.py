"""The child-process engines of one run (workers.py), as one object the search phases hear from.

``EnginePool`` starts engines, polls them (each plan evaluated through ``RunState.offer``, bounds
and verdicts of the engines whose bounds hold recorded), retires a relaxation that can no longer
help, hands the second processor on along a queue of engines (each takes it when the one before
has ended, been retired or had its time), and stops them all. A relaxation's plan that overflows
memory is kept (``unfit``) for the search to make fit (portfolio.py). Every engine is started, polled
and stopped the same way.
"""

from __future__ import annotations

import numpy as np

from autoshard.solver.procs.engine_events import EngineEvent
from autoshard.solver.model.events import EngineFailed, Phase
from autoshard.solver.run.state import RunState
from autoshard.solver.engines.toulbar import can_take
from autoshard.solver.run.workers import EngineWorker

class EnginePool:
    """The engines running beside this process's own search; ``waiting`` queues the engines
    (methods, description, latest start) that take the processor of the engine started last, in
    turn: the first of them when that engine ends, is retired or its successor's latest start
    has come (``math.inf``: only once it ends)."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.engines: list[EngineWorker] = []
        self.waiting: list[tuple[list[str], str, float]] = []
        self.relaxation_proved_in: float | None = None  # seconds toulbar2 took to prove the core without rows
        self.unfit: np.ndarray | None = None  # the relaxation's last plan that overflows memory, until taken

    @property
    def any_exact(self) -> bool:
        """True when an engine that proves (toulbar2's branch and bound, HiGHS) was started."""
        return any(e.exact for e in self.engines)

    def start(self, methods: list[str], what: str) -> None:
        """Fork one child per engine, each told the best cost (and plan) so far."""
        state = self.state
        state.emit(Phase(methods[0], f"{what} on {state.comp.n} core nodes", state.elapsed()))
        plan = None if state.best_local is None else state.best_local.tolist()
        # only the second search calls toulbar2 on its subproblems (penalised costs, no rows)
        toulbar = "second-search" in methods and state.options.toulbar and can_take(state.comp, rows=False)
        started = [EngineWorker(state.comp, m, state.best_cost, state.options.gap, state.options.seed + 1 + k, plan,
                                toulbar, clock=state.clock, seconds=state.left()) for k, m in enumerate(methods)]
        for engine in started:
            engine.start()
        self.engines.extend(started)

    def poll(self, wait: float = 0.0) -> None:
        """Take in what the engines reported (waiting up to ``wait`` s on the first). Of the plans
        an engine reported since the last look only the cheapest is offered: each offer is
        evaluated on the original problem, and toulbar2's search can report dozens a second."""
        for k, engine in enumerate(self.engines):
            events = engine.poll(wait if k == 0 else 0.0)
            plans = [e for e in events if e.kind == "plan"]
            cheapest = min(plans, key=lambda e: e.cost) if plans else None
            for event in events:
                if event.kind != "plan" or event is cheapest:
                    self._take(event, engine)
        self._retire()
        self._hand_over()

    def take_unfit(self) -> np.ndarray | None:
        """The relaxation's last plan that overflows memory, once (None when there is none new)."""
        unfit, self.unfit = self.unfit, None
        return unfit

    def exact_running(self) -> bool:
        """True while some exact engine is searching."""
        return any(not e.done for e in self.engines if e.exact)

    def wait_for_exact(self) -> None:
        """Poll until the run is finished or out of time, or every exact engine has ended."""
        state = self.state
        while self.exact_running() and not state.out_of_time() and not state.finished():
            left = state.left()
            self.poll(0.05 if left is None else max(0.0, min(0.05, left)))
        self.poll()

    def stop(self) -> None:
        """Kill the engines, taking in what they said after the last look (within the limit);
        the engines ``waiting`` are dropped, so no engine starts once the pool is stopped."""
        self.waiting = []  # else the last look hands the stopped engine's processor on: a child nobody stops
        with self.state.timed("engines"):
            for engine in self.engines:
                engine.stop(self.state.teardown_by)
            self.poll()

    def _take(self, event: EngineEvent, engine: EngineWorker) -> None:
        """A plan from any engine; bounds and verdicts only from those whose bounds hold; a failure said."""
        state = self.state
        source = engine.engine.source
        if event.kind == "error":
            state.emit(EngineFailed(engine.method, event.message or "no message", state.elapsed()))
        elif event.kind == "plan":
            if not state.offer(event.choice, source, None) and engine.relaxation and \
                    not state.comp.is_feasible(event.choice):
                self.unfit = np.asarray(event.choice, dtype=np.int64)
        elif not engine.bounds:
            return
        elif event.kind in ("bound", "optimal"):
            state.bound(event.cost, source)
            if engine.relaxation and event.kind == "optimal" and engine.started is not None:
                self.relaxation_proved_in = self.state.clock() - engine.started
        elif event.kind == "none" and engine.upper is not None:
            state.bound(engine.upper, source)  # no plan below the cost it was given
        elif event.kind == "none":
            state.proved_by(source)  # no plan at all

    def _retire(self) -> None:
        """Stop a relaxation's engine once a plan it reported costs less than the proven lower
        bound: the relaxation's optimum is at most that plan, so below every plan that fits, and
        from then on it can neither find a fitting plan nor bound better than the bound we have."""
        state = self.state
        for engine in self.engines:
            if (engine.relaxation and engine.pid is not None and engine.cheapest is not None
                    and state.lower is not None and engine.cheapest < state.lower):
                engine.stop(state.teardown_by)
                state.emit(Phase("lagrange", f"{engine.method} engine stopped: its plans cost less than the "
                                 "lower bound, so none of them fits", state.elapsed()))

    def _hand_over(self) -> None:
        """Once the engine started last has ended (toulbar2 without rows: proved its optimum, a
        bound or the answer when it fits; the hull engine: its dive is over), been retired or had
        its time, the first waiting engines take its processor."""
        if not self.waiting or not self.engines or self.state.finished():
            return
        methods, what, until = self.waiting[0]
        last = self.engines[-1]
        if not last.done and last.pid is not None and self.state.clock() < until:
            return
        self.waiting.pop(0)
        last.stop(self.state.teardown_by)
        self.start(methods, what)
