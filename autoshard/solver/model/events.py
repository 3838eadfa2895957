"""What the solver reports while it runs: plain dataclasses passed to ``on_event`` in order.

A run emits ``Started``, ``Reduced``, then any number of ``Improved`` / ``Checked`` /
``LowerBound`` / ``Phase`` / ``EngineFailed`` events, and ends with ``Finished``. The core never
prints; the CLI renders these and tests read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from autoshard.solver.model.solution import Solution


@dataclass(frozen=True)
class Started:
    """Solving began on a problem of this size."""

    name: str
    nodes: int
    edges: int
    strategies: int
    usage_limit: int | None


@dataclass(frozen=True)
class Reduced:
    """Exact reductions shrank the problem to the core the search works on."""

    nodes_before: int
    edges_before: int
    strategies_before: int
    nodes_after: int
    edges_after: int
    strategies_after: int
    memory_rows: int
    counts: dict[str, int]
    elapsed: float


@dataclass(frozen=True)
class Phase:
    """A search phase starts (``name``: elimination, heuristic, z3 ...), with a human-readable detail."""

    name: str
    detail: str
    elapsed: float


@dataclass(frozen=True)
class Improved:
    """A better plan: ``choice`` covers every original node, ``cost`` is exact.

    ``bound`` is the strict upper bound the finder was asked to beat (z3: "any plan with cost <
    bound"; None for the first, unbounded question), ``source`` who found it.
    """

    iteration: int
    cost: int
    choice: tuple[int, ...]
    bound: int | None
    elapsed: float
    source: str
    peak: int | None


@dataclass(frozen=True)
class Checked:
    """One z3 check: is there a plan with cost < ``bound``? ``result`` is sat, unsat or unknown."""

    iteration: int
    bound: int | None
    result: str
    elapsed: float


@dataclass(frozen=True)
class LowerBound:
    """Every plan costs at least ``value`` (proved by ``source``)."""

    value: int
    elapsed: float
    source: str


@dataclass(frozen=True)
class EngineFailed:
    """A child-process engine (run/workers.py) died with ``error``; the search goes on without it."""

    method: str
    error: str
    elapsed: float


@dataclass(frozen=True)
class Finished:
    """The final answer."""

    solution: Solution


Event = Started | Reduced | Phase | Improved | Checked | LowerBound | EngineFailed | Finished
"""Any event a run emits."""
EventCallback = Callable[[Event], None]
"""What ``solve(..., on_event=...)`` calls with each event, in order."""
