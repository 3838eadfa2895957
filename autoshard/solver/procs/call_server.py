"""A forked child that runs calls one after another: ``call_forked``'s guarantees (C code that
runs past its limit or ends the process is killed at a wall-clock deadline, its prints on
/dev/null) without a fork per call.

Neighbourhood search (lns.py) makes several toulbar2 or HiGHS calls a second. A fork per call
pays the fork, the copy-on-write faults of both processes and the child's exit each time; here
the child is forked once (again only after a call had to be killed), and a call pays only the
pickling of its arguments and answer. Measured: see benchmarks/README.md, "Solver throughput".

The protocol is one frame each way per call (forks.py: a pickle behind its length).
"""

from __future__ import annotations

import os
import pickle
import select
from types import TracebackType
from typing import Any, Callable, TypeVar

from autoshard.solver.procs.clock import MONOTONIC, Clock
from autoshard.solver.procs.forks import LENGTH, fork_child, kill_and_reap, quiet_child, read_frame, send_frame

T = TypeVar("T")


class CallServer:
    """Runs ``fn(*args)`` in a child forked on the first call and kept for the next ones; a call
    whose answer is not back by its deadline kills the child (the next call forks a new one).
    ``fn`` and the args must pickle (a module's function, arrays, a FrozenCore). Use it as a
    context manager, so that the child ends with the work that needed it. Deadlines are readings
    of ``clock``."""

    def __init__(self, clock: Clock = MONOTONIC) -> None:
        self.clock = clock
        self.pid: int | None = None
        self.forks = 0  # children forked so far
        self._request = self._answer = -1

    def __enter__(self) -> CallServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.stop()

    def call(self, fn: Callable[..., T], args: tuple[Any, ...], until: float) -> T | None:
        """``fn(*args)`` in the child, or None when it raised, the child died or ``until``
        (a reading of the server's clock) came first (the child is then killed)."""
        if self.pid is None:
            self._start()
        try:
            send_frame(self._request, (fn, args))
            answer = self._receive(until)
        except OSError:  # the child died: a broken pipe
            answer = None
        if answer is None:
            self.stop()
            return None
        ok, value = pickle.loads(answer)
        return value if ok else None

    def stop(self) -> None:
        """Kill the child, if there is one."""
        if self.pid is None:
            return
        os.close(self._request)
        os.close(self._answer)
        kill_and_reap(self.pid)
        self.pid = None

    def _start(self) -> None:
        request_read, self._request = os.pipe()
        self._answer, answer_write = os.pipe()
        self.pid = fork_child(lambda: _serve(request_read, answer_write), [self._request, self._answer],
                              [request_read, answer_write])
        self.forks += 1

    def _receive(self, until: float) -> bytes | None:
        """The next answer's bytes, or None at ``until`` or when the child's end closed."""
        chunks: list[bytes] = []
        have, need = 0, None
        while need is None or have < need:
            left = until - self.clock()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._answer], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._answer, 1 << 20)
            if not chunk:
                return None
            chunks.append(chunk)
            have += len(chunk)
            if need is None and have >= LENGTH.size:
                need = LENGTH.size + LENGTH.unpack(b"".join(chunks)[: LENGTH.size])[0]
        return b"".join(chunks)[LENGTH.size:]


def _serve(requests: int, answers: int) -> None:
    """The child: answer requests until the parent closes its end. An answer is (True, value),
    or (False, None) when the call raised."""
    quiet_child()
    while True:
        whole, request = read_frame(requests)
        if not whole:
            return
        try:
            fn, args = request
            answer = (True, fn(*args))
        except Exception:  # noqa: BLE001 - the call failed: the caller gets no value
            answer = (False, None)
        send_frame(answers, answer)
