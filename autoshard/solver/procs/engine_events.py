"""What an engine child tells the portfolio, and how it reaches the parent.

Every engine (run/workers.py) reports typed ``EngineEvent``s, pickled one per length-prefixed frame
(forks.py) on a pipe of its own (``send`` in the child, ``receive`` in the parent). Costs are whole costs
of the core (``FrozenCore.const`` included). toulbar2 is the one engine whose progress exists only
as the text its C++ search prints; ``ToulbarText`` turns those lines into the same events on the
parent's side, and the final answer of its search (the value ``CFN.Solve`` returns) is sent as
typed events like every other engine's.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterator, Literal

from autoshard.solver.procs.forks import read_frame, send_frame

EventKind = Literal["plan", "bound", "optimal", "none", "error", "end"]

@dataclass(frozen=True)
class EngineEvent:
    """One report of an engine:

    - "plan": ``choice`` (local strategies of the core) costing ``cost``;
    - "bound": every plan costs at least ``cost``;
    - "optimal": no plan costs less than ``cost`` (the engine's search ended);
    - "none": no plan costs less than the upper bound the engine was given (none at all without one);
    - "error": the engine failed, ``message`` says how;
    - "end": the engine will report nothing more (added by the parent when its pipes close).
    """

    kind: EventKind
    cost: int | None = None
    choice: list[int] | None = None
    message: str | None = None


def send(fd: int, event: EngineEvent) -> None:
    """Write one event to the pipe ``fd`` (child side)."""
    send_frame(fd, event)


def receive(fd: int) -> Iterator[EngineEvent]:
    """The events written to the pipe ``fd`` until it closes (parent side); a frame cut short by a
    killed child ends the stream."""
    try:
        while True:
            whole, event = read_frame(fd)
            if not whole:
                return
            yield event
    finally:
        os.close(fd)


_NEW = re.compile(r"New solution: (-?[0-9.e+]+)")
_GAP = re.compile(r"Optimality gap: \[(-?[0-9.e+]+), (-?[0-9.e+]+)\]")
_BOUNDS = re.compile(r"Initial lower and upper bounds: \[(-?[0-9.e+]+), (-?[0-9.e+]+)\]")


class ToulbarText:
    """toulbar2's progress lines (``showSolutions=1``) as events: ``New solution: C`` followed by
    a line of the plan's strategies, and the lower bounds of ``Optimality gap: [L, U]`` and
    ``Initial lower and upper bounds: [L, U]``. toulbar2 prints costs without the core's
    constant ``const``, which is added back."""

    def __init__(self, n: int, const: int) -> None:
        self.n, self.const = n, const
        self.pending: int | None = None

    def line(self, text: str) -> EngineEvent | None:
        """The event one line completes, if any."""
        if self.pending is not None:
            cost, self.pending = self.pending, None
            values = text.split()
            if len(values) == self.n and all(v.isdigit() for v in values):
                return EngineEvent("plan", cost + self.const, [int(v) for v in values])
            return None
        if m := _NEW.search(text):
            self.pending = round(float(m.group(1)))
        elif m := _GAP.search(text) or _BOUNDS.search(text):
            return EngineEvent("bound", _ceil(m.group(1)) + self.const)
        return None


def _ceil(text: str) -> int:
    value = float(text)
    return int(value) if value == int(value) else int(value) + 1
