"""Solver events as the user sees them: one view of a run's state, rendered three ways.

``EventView`` keeps what every rendering needs (best cost, lower bound, phase, z3 checks, the
solver's clock) and hands each event to the handler for its type (``on_improved`` ...), matched
on the event classes of solver/model/events.py. Its renderings: ``LogLines`` (``--log``: plain lines on
stderr), problem_file.ProblemDisplay (IOPDDL files) and model_progress.ModelProgress (model files,
with cost tables). Each prints a status line after ``HEARTBEAT`` seconds without one where no live
line moves (``Heartbeat``). Every reading of time is of a ``Clock`` (solver/procs/clock.py) that
tests replace with a fake one.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable, TextIO

from autoshard.solver.model.events import (Checked, EngineFailed, Event, EventCallback, Finished, Improved, LowerBound,
                                           Phase, Reduced, Started)
from autoshard.solver.procs.clock import MONOTONIC, Clock

HEARTBEAT = 10.0
"""Seconds of silence after which ``--log`` and a display that is not a terminal print a status
line: between better plans a long search can go a minute without one."""


class Heartbeat:
    """Calls ``beat`` from a daemon thread whenever ``every`` seconds pass without ``touch``, so
    long stretches without news still show that the search is alive and where it stands. With
    ``on`` False (a terminal, where the live line moves anyway) there is no thread; with a
    ``clock`` given (a test's fake one) there is none either, and its owner calls ``tick``."""

    def __init__(self, beat: Callable[[], None], every: float = HEARTBEAT, on: bool = True,
                 clock: Clock | None = None) -> None:
        self.beat, self.every = beat, every
        self.clock = clock or MONOTONIC
        self.last = self.clock()
        self.stopped = threading.Event()
        threaded = on and clock is None
        self.thread = threading.Thread(target=self._run, name="heartbeat", daemon=True) if threaded else None
        if self.thread is not None:
            self.thread.start()

    def touch(self) -> None:
        """Something was just printed: the next beat is ``every`` seconds from now."""
        self.last = self.clock()

    def stop(self) -> None:
        """No more beats (the run is over)."""
        self.stopped.set()

    def tick(self) -> bool:
        """Beat if ``every`` seconds passed since the last line and not stopped; whether it beat."""
        if self.stopped.is_set() or self.clock() - self.last < self.every:
            return False
        self.beat()
        self.touch()
        return True

    def _run(self) -> None:
        while not self.stopped.wait(max(0.05, self.last + self.every - self.clock())):
            self.tick()


class EventView:
    """A run's state as its events tell it, and the dispatch of each event to its handler. A
    subclass overrides the ``on_*`` handlers it renders and ``status_text``; ``forward`` gets
    every event after this view has taken it. ``clock``: a fake clock for tests (its heartbeat then
    runs no thread: the test calls ``heartbeat.tick``)."""

    def __init__(self, every: float = HEARTBEAT, heartbeat: bool = True, forward: EventCallback | None = None,
                 clock: Clock | None = None) -> None:
        self.clock = clock or MONOTONIC
        self.best: int | None = None
        self.lower: int | None = None
        self.phase = "starting"
        self.checks = 0
        self.start = self.clock()
        self.forward = forward
        self.heartbeat = Heartbeat(self.beat, every, on=heartbeat, clock=clock)

    def __call__(self, event: Event) -> None:
        match event:
            case Started():
                self.on_started(event)
            case Reduced():
                self.on_reduced(event)
            case Phase():
                self.phase = event.name
                self.on_phase(event)
            case Improved():
                self.best = event.cost
                self.on_improved(event)
            case LowerBound():
                self.lower = event.value
                self.on_lower_bound(event)
            case Checked():
                self.checks += 1
                self.on_checked(event)
            case EngineFailed():
                self.on_engine_failed(event)
            case Finished():
                self.on_finished(event)
        self.after(event)
        if self.forward is not None:
            self.forward(event)

    def on_started(self, event: Started) -> None:
        """Solving began."""

    def on_reduced(self, event: Reduced) -> None:
        """The reductions are done."""

    def on_phase(self, event: Phase) -> None:
        """A new phase began (``self.phase`` is already its name)."""

    def on_improved(self, event: Improved) -> None:
        """A better plan (``self.best`` is already its cost)."""

    def on_lower_bound(self, event: LowerBound) -> None:
        """A better lower bound (``self.lower`` is already its value)."""

    def on_checked(self, event: Checked) -> None:
        """A z3 check answered."""

    def on_engine_failed(self, event: EngineFailed) -> None:
        """An engine died; the search goes on without it."""

    def on_finished(self, event: Finished) -> None:
        """The run's answer."""

    def after(self, event: Event) -> None:
        """Called after every event's handler (a live line's refresh)."""

    def status_text(self) -> str:
        """The status line printed after HEARTBEAT seconds of silence."""
        return f"{self.phase}: best {'-' if self.best is None else self.best} gap {gap(self.best, self.lower)}"

    def beat(self) -> None:
        """Print the status line (the heartbeat's call)."""
        self.line(self.status_text())

    def line(self, text: str) -> None:
        """Print one line of this rendering and put off the next heartbeat."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop the status lines (the run ended, or failed)."""
        self.heartbeat.stop()


class LogLines(EventView):
    """``--log``: one plain line per better plan, better lower bound (at most one a second) and
    the final proof, on stderr, whatever else is shown, and a status line after HEARTBEAT seconds
    without one; forwards every event to ``forward``."""

    def __init__(self, forward: EventCallback | None = None, stream: TextIO | None = None,
                 every: float = HEARTBEAT, clock: Clock | None = None) -> None:
        self.stream = stream or sys.stderr
        self.last_bound = -1.0
        self.lock = threading.Lock()
        super().__init__(every, heartbeat=True, forward=forward, clock=clock)

    def __call__(self, event: Event) -> None:
        elapsed = getattr(event, "elapsed", None)
        if isinstance(elapsed, float):  # the status line's clock is the solver's
            self.start = self.clock() - elapsed
        super().__call__(event)

    def on_improved(self, event: Improved) -> None:
        self.line(f"{event.elapsed:.2f}s plan {event.cost} by {event.source} gap {gap(self.best, self.lower)}")

    def on_lower_bound(self, event: LowerBound) -> None:
        if event.elapsed - self.last_bound >= 1.0 or event.value == self.best:
            self.last_bound = event.elapsed
            self.line(f"{event.elapsed:.2f}s bound {event.value} by {event.source} gap {gap(self.best, self.lower)}")

    def on_engine_failed(self, event: EngineFailed) -> None:
        self.line(failure_line(event))

    def on_finished(self, event: Finished) -> None:
        self.close()
        sol = event.solution
        what = f"proved by {sol.proof}" if sol.status == "optimal" else f"gap {gap(sol.cost, sol.lower_bound)}"
        self.line(f"{sol.elapsed:.2f}s {sol.status} {sol.cost} {what}")

    def status_text(self) -> str:
        best = "-" if self.best is None else str(self.best)
        return f"{self.clock() - self.start:.2f}s searching ({self.phase}): best {best} gap {gap(self.best, self.lower)}"

    def line(self, text: str) -> None:
        with self.lock:
            self.stream.write(text + "\n")
            self.stream.flush()
        self.heartbeat.touch()


def failure_line(event: EngineFailed) -> str:
    """An EngineFailed event as one line: which engine, why, and that the search goes on."""
    return f"{event.elapsed:.2f}s {event.method} engine failed ({event.error}); the search goes on without it"


def gap(best: int | None, lower: int | None) -> str:
    """The relative gap as a percentage, or "-" while either side is unknown."""
    if best is None or lower is None:
        return "-"
    return f"{100 * (best - lower) / max(abs(best), 1):.2f}%"
