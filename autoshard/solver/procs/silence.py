"""Silencing the C++ solvers' own prints (HiGHS, toulbar2) around the calls that make them."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """File descriptors 1 and 2 on /dev/null for the duration: HiGHS's C++ code prints debug
    lines of its own (e.g. ``HighsMipSolverData::transformNewIntegerFeasibleSolution``) that
    ``disp=False`` does not stop, and they must not land in the user's output; toulbar2
    (toulbar.py) likewise, and in a worker child fds 1 and 2 are the pipe the parent reads."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)
