"""Options bounded by two processes at once: this one and a forked child, so that the second
processor bounds while this one costs recipes or bounds.

A bound is a pure function of its option and cutoff (``PipelineSearch.evaluate`` with
``bounded=False``), so which process computes it changes nothing but when it is known. The list is
shared through one anonymous shared mapping: per option its state (free, taken here, taken by the
child, bounded or failed there), the cutoff the child took it at and the child's bound, and the
cutoff (this process's best step, read by the child as it takes an option); options are taken
under one lock. The graph traced at a microbatch size and most device problems are built once
per process, so each process keeps to the microbatch counts it has taken: this one takes the first
free option of a count it took before, else the first free one (the list's order: the most
promising first); the child first takes each count nobody has taken (building their problems while
this process bounds the promising options; the bounds left for after a solve, at the best step,
then reuse them), then those of its own counts, then any. The child runs only while this process bounds or costs recipes:
``paused()`` stops it (SIGSTOP) around every solve, whose engines use both processors. Without an
idle processor (processes runnable now), or with fewer than two options, no child is forked and
this process takes all.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import multiprocessing
import os
import signal
import struct
import time
from typing import Callable, Iterator, Sequence

from autoshard.errors import AutoshardError
from autoshard.pipeline.options import PipelineOption
from autoshard.solver.procs.forks import fork_child, kill_and_reap, quiet_child

Bound = Callable[[PipelineOption, float], float]
"""An option's lower bound at a cutoff (its bounding may stop once it reaches the cutoff); raises
``AutoshardError`` where none is found in time."""

FREE, HERE, CHILD, BOUNDED, FAILED = range(5)
"""An option's state: free, taken by this process, taken by the child, bounded or failed there."""
_DOUBLE = struct.Struct("<d")
BOUND, TAKEN_AT = range(2)
"""An option's two doubles in the mapping: the child's bound, the cutoff it took the option at."""


SAMPLES = 5
"""Readings of the runnable count behind :func:`idle_processors`."""


def idle_processors() -> float:
    """The processors this process may run on, less those running now (this one included):
    the runnable count of ``/proc/loadavg``, the mean of :data:`SAMPLES` readings 20 ms apart
    (the load averages trail what has just ended by a minute or more)."""
    return len(os.sched_getaffinity(0)) - max(1.0, sum(_running() for _ in range(SAMPLES)) / SAMPLES)


def _running() -> float:
    """Processes runnable now (the reader too), after 20 ms; the last minute's load average where
    the kernel does not say."""
    time.sleep(0.02)
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return os.getloadavg()[0]


class BoundingPeer:
    """The options' shared list (module docstring); use it as a context manager, so that the child
    ends with the bounding that needed it. ``processors``: how many this process may run on (None:
    fork where a processor is idle, :func:`idle_processors`, as a child beside others' work would
    only slow this process)."""

    def __init__(self, options: Sequence[PipelineOption], processors: int | None = None) -> None:
        self.options = list(options)
        n = len(self.options)
        self.shared = mmap.mmap(-1, _DOUBLE.size + n + 16 * n)
        self.cutoff = math.inf
        self.lock = multiprocessing.get_context("fork").Lock()
        self.pid: int | None = None
        self.forks = n > 1 and (processors > 1 if processors is not None else idle_processors() >= 1)

    def __enter__(self) -> BoundingPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def cutoff(self) -> float:
        """The best step so far (infinite without one): the cutoff the next options are bounded at."""
        return _DOUBLE.unpack_from(self.shared, 0)[0]

    @cutoff.setter
    def cutoff(self, step: float) -> None:
        _DOUBLE.pack_into(self.shared, 0, step)

    def start(self, bound: Bound) -> None:
        """Fork the child, which bounds options with ``bound`` until none is free."""
        if self.forks and self.pid is None:
            self.pid = fork_child(lambda: self._child(bound))

    def take(self) -> int | None:
        """The index of the next option for this process (module docstring), now taken; None once none is free."""
        return self._take(HERE)

    def untaken(self) -> int:
        """Options neither process has taken."""
        return sum(self._state(k) == FREE for k in range(len(self.options)))

    def found(self) -> dict[int, float | None]:
        """The child's answers so far: per option it finished, its bound, or None where it found none."""
        return {k: self._double(k, BOUND) if self._state(k) == BOUNDED else None
                for k in range(len(self.options)) if self._state(k) in (BOUNDED, FAILED)}

    def in_flight(self) -> dict[int, float]:
        """The options the live child has taken and not yet answered, each with the cutoff it took it at."""
        if self.pid is None:
            return {}
        try:
            ended, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            ended = self.pid
        if ended:
            self.pid = None
            return {}
        return {k: self._double(k, TAKEN_AT) for k in range(len(self.options)) if self._state(k) == CHILD}

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The child stopped for the block (a solve, whose engines take both processors). This
        process takes no option meanwhile, so the child never holds the lock it waits for."""
        pid = self.pid
        if pid is not None:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        """Kill the child, if there is one."""
        if self.pid is not None:
            kill_and_reap(self.pid)
            self.pid = None

    def _state(self, k: int) -> int:
        return self.shared[_DOUBLE.size + k]

    def _set(self, k: int, state: int) -> None:
        self.shared[_DOUBLE.size + k] = state

    def _at(self, k: int, field: int) -> int:
        """Where option k's ``field`` (:data:`BOUND` or :data:`TAKEN_AT`, a double) lies in the mapping."""
        n = len(self.options)
        return _DOUBLE.size + n + 8 * (field * n + k)

    def _double(self, k: int, field: int) -> float:
        return _DOUBLE.unpack_from(self.shared, self._at(k, field))[0]

    def _take(self, who: int) -> int | None:
        """Under the lock, marked taken by ``who``: for the child, the first free option of a
        microbatch count nobody took; then the first of a count ``who`` took before; else the
        first free one."""
        n = len(self.options)
        with self.lock:
            states = [self._state(k) for k in range(n)]
            free = [k for k, s in enumerate(states) if s == FREE]
            if not free:
                return None
            counts = [self.options[k].microbatches for k in range(n)]
            mine = {counts[k] for k, s in enumerate(states) if (s == HERE) == (who == HERE) and s != FREE}
            taken = {counts[k] for k, s in enumerate(states) if s != FREE}
            fresh = [k for k in free if counts[k] not in taken] if who == CHILD else []
            k = next(iter(fresh), next((k for k in free if counts[k] in mine), free[0]))
            self._set(k, who)
            _DOUBLE.pack_into(self.shared, self._at(k, TAKEN_AT), self.cutoff)
            return k

    def _child(self, bound: Bound) -> None:
        """The child's loop: take an option, bound it at the cutoff it took it at, record it."""
        quiet_child()
        while (k := self._take(CHILD)) is not None:
            try:
                found = bound(self.options[k], self._double(k, TAKEN_AT))
            except AutoshardError:
                self._set(k, FAILED)
                continue
            _DOUBLE.pack_into(self.shared, self._at(k, BOUND), found)
            self._set(k, BOUNDED)
