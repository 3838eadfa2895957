"""The pipeline search's time limit, shared by every build and solve it runs.

The limit is read on a :data:`~autoshard.solver.procs.clock.Clock` (``time.monotonic`` unless a
test gives a fake one). A build runs under :func:`~autoshard.problem.build.build_deadline` set to
the seconds left on that clock (counted from now on ``time.monotonic``, which builds read); a
solve gets a share of the seconds left; once none are left, :meth:`TimeLimit.check` raises
:class:`SearchTimeout` before anything starts.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

from autoshard.errors import AutoshardError
from autoshard.problem.build import build_deadline
from autoshard.solver.procs.clock import MONOTONIC, Clock


def exit_reserve(timeout: float) -> float:
    """Seconds of a process's ``timeout`` kept from the pipeline search for what runs past it or
    after it: the steps of the last build that do not check the limit (405B: up to 2 s), the
    tables, and the process's exit (freeing a 405B model's problems: ~2 s); a tenth of a short
    limit, where the models are small."""
    return min(5.0, 0.1 * timeout)


class SearchTimeout(AutoshardError):
    """The search's time limit passed before a build or solve could start."""


class TimeLimit:
    """``timeout`` seconds (None: no limit) from the moment it is made, read on ``clock``."""

    def __init__(self, timeout: float | None, clock: Clock = MONOTONIC) -> None:
        self.timeout, self.clock = timeout, clock
        self.start = clock()

    def elapsed(self) -> float:
        """Seconds since the search began."""
        return self.clock() - self.start

    def remaining(self) -> float | None:
        """Seconds left (0 once the limit has passed), or None without a limit."""
        return None if self.timeout is None else max(0.0, self.timeout - self.elapsed())

    def passed(self) -> bool:
        """True once no time is left."""
        left = self.remaining()
        return left is not None and left <= 0

    def check(self, what: str) -> None:
        """Raise :class:`SearchTimeout` (one line naming ``what`` was left) once the limit has passed."""
        if self.passed():
            raise SearchTimeout(f"the time limit passed before {what}, {self.elapsed():.0f} s into the pipeline "
                                f"search: raise --timeout")

    @contextlib.contextmanager
    def builds(self, what: str) -> Iterator[None]:
        """A block whose problem builds stop at the limit (``build_problem``'s BuildTimeout); it
        raises :class:`SearchTimeout` at once when the limit has already passed."""
        self.check(what)
        left = self.remaining()
        with build_deadline(None if left is None else time.monotonic() + left):
            yield
