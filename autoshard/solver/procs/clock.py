"""The clock every deadline of the solver is read on.

A deadline is a reading of a monotonic clock in seconds. Code that waits for one takes the
clock as a ``Clock`` argument (``time.monotonic`` unless given), so a test can hand it a fake
one and check what happens at a deadline without sleeping or timing anything.
"""

from __future__ import annotations

import time
from typing import Callable

Clock = Callable[[], float]
"""Monotonic seconds: ``time.monotonic`` in a run, a fake in tests."""

MONOTONIC: Clock = time.monotonic
