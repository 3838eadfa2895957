"""Engines in forked child processes: toulbar2 (branch and bound, neighbourhood search), HiGHS's
MILP, the hull bound (column generation) and a second Lagrangian search on the reduced core, each started, polled and stopped the
same way (``EngineWorker``) and reporting typed ``EngineEvent``s (procs/engine_events.py).
``ENGINES`` is the registry: each engine's name, what its answers mean (exact, a relaxation,
bounds that hold) and the search it runs in the child; nothing else dispatches on a name.

Why processes: toulbar2 and HiGHS are C++ code that holds the GIL while it searches, counts time
limits in CPU seconds and prints to the C stdout and stderr. A child is forked after the core is
frozen (nothing is pickled), dies with its parent (PR_SET_PDEATHSIG) and is killed at the
wall-clock deadline. It sends its events pickled on a pipe of its own; toulbar2's engines also
have their fds 1 and 2 on a second pipe, whose progress lines (plans and bounds as the search
finds them) a thread of the parent turns into the same events. Two children use the two cores
while the parent keeps its own search (Lagrangian, z3) going.
"""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass
from typing import Callable

from autoshard.solver.core.reduced import FrozenCore
from autoshard.solver.procs.clock import MONOTONIC, Clock
from autoshard.solver.procs.engine_events import EngineEvent, ToulbarText, receive, send
from autoshard.solver.procs.forks import die_with_parent, fork_child, kill_and_reap

Report = Callable[[EngineEvent], None]


@dataclass(frozen=True)
class Engine:
    """One engine of the registry: what it does, what its answers mean, and the search it runs in
    the child (``run``, given the worker and where to report)."""

    name: str
    description: str
    run: Callable[[EngineWorker, Report], None]
    source: str = "toulbar2"  # what its plans and bounds are reported under
    exact: bool = False  # it ends by proving the optimum (or that there is no plan)
    relaxation: bool = False  # it searches the core without its memory rows: its plans need not fit
    bounds: bool = False  # its bounds and verdicts are lower bounds of the problem
    prints: bool = False  # its progress is the text toulbar2's search prints


class EngineWorker:
    """One engine (a name in ENGINES) on ``comp`` in a forked child; ``poll`` returns its
    EngineEvents. ``upper``: only plans cheaper than this are wanted. ``gap``: stop at this
    relative gap (0: prove). ``seed``: the engine's random seed. ``plan``: the plan costing
    ``upper``, where one is known. ``toulbar``: the second search may call toulbar2 on its
    penalised and weighted problems. ``seconds``: the time the run leaves from the fork (None: no
    limit), for an engine that plans its own time (the hull)."""

    def __init__(self, comp: FrozenCore, method: str, upper: int | None, gap: float = 0.0, seed: int = 1,
                 plan: list[int] | None = None, toulbar: bool = False, clock: Clock = MONOTONIC,
                 seconds: float | None = None) -> None:
        if method not in ENGINES:
            raise ValueError(f"unknown engine {method!r}")
        self.engine = ENGINES[method]
        self.clock = clock
        self.comp, self.method, self.upper, self.gap, self.seed = comp, method, upper, gap, seed
        self.toulbar, self.seconds = toulbar, seconds
        self.plan = plan
        self.events: queue.Queue[EngineEvent] = queue.Queue()
        self.pid: int | None = None
        self.done = False
        self.started: float | None = None  # the clock's reading at its fork
        self.error: str | None = None
        self.cheapest: int | None = None  # the cheapest plan it reported (fitting or not)
        self._readers: list[threading.Thread] = []
        self._open = 0
        self._lock = threading.Lock()

    @property
    def exact(self) -> bool:
        """True when the engine ends by proving the optimum (or that there is no plan)."""
        return self.engine.exact

    @property
    def relaxation(self) -> bool:
        """True when the engine searches a relaxation (the core without memory rows): its plans
        need not fit, and the optimum it converges to is at most the cheapest plan it reported."""
        return self.engine.relaxation

    @property
    def bounds(self) -> bool:
        """True when the engine's bounds and verdicts are lower bounds of the problem."""
        return self.engine.bounds

    @property
    def prints(self) -> bool:
        """True for toulbar2's engines, whose progress is the text their search prints."""
        return self.engine.prints

    def start(self) -> None:
        """Fork the child and start reading what it reports."""
        events_read, events_write = os.pipe()
        text_read, text_write = os.pipe() if self.prints else (None, None)
        self.started = self.clock()
        self.pid = fork_child(lambda: _child(self, events_write, text_write), [events_read, text_read],
                              [events_write, text_write])
        self._readers = [threading.Thread(target=self._read_events, args=(events_read,), daemon=True)]
        if text_read is not None:
            self._readers.append(threading.Thread(target=self._read_text, args=(text_read,), daemon=True))
        self._open = len(self._readers)
        for reader in self._readers:
            reader.start()

    def stop(self, until: float | None = None) -> None:
        """Kill the child (if still running); wait for the readers to take in what the child said
        last, but not past ``until`` (a reading of its clock; a killed child's pipe closes only
        once the kernel has freed its memory, which takes a while for gigabytes)."""
        if self.pid is None:
            return
        kill_and_reap(self.pid)
        self.pid = None
        for reader in self._readers:
            reader.join(1.0 if until is None else max(0.0, min(1.0, until - self.clock())))

    def poll(self, timeout: float) -> list[EngineEvent]:
        """Events available within ``timeout`` seconds (one wait, then whatever is queued)."""
        out = []
        try:
            out.append(self.events.get(timeout=max(0.0, timeout)))
        except queue.Empty:
            return out
        while True:
            try:
                out.append(self.events.get_nowait())
            except queue.Empty:
                return out

    def _read_events(self, fd: int) -> None:
        """Take in the child's typed events (a thread of the parent)."""
        for event in receive(fd):
            self._put(event)
        self._closed()

    def _read_text(self, fd: int) -> None:
        """Turn toulbar2's progress lines into events (a thread of the parent)."""
        text = ToulbarText(self.comp.n, self.comp.const)
        with os.fdopen(fd, "r", errors="replace") as pipe:
            for line in pipe:
                if (event := text.line(line)) is not None:
                    self._put(event)
        self._closed()

    def _put(self, event: EngineEvent) -> None:
        if event.kind == "plan" and event.cost is not None:
            self.cheapest = event.cost if self.cheapest is None else min(self.cheapest, event.cost)
        elif event.kind == "error":
            self.error = event.message
        self.events.put(event)

    def _closed(self) -> None:
        """One pipe closed; after the last, the engine is done and "end" is queued."""
        with self._lock:
            self._open -= 1
            last = self._open == 0
        if last:
            self.done = True
            self.events.put(EngineEvent("end"))


def _child(worker: EngineWorker, events: int, text: int | None) -> None:
    """Run the engine, its events on ``events`` and fds 1 and 2 on ``text`` (toulbar2's) or
    /dev/null; a failure is reported as an "error" event (fork_child then exits with status 1)."""
    try:
        die_with_parent()
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null if text is None else text, 1)
        os.dup2(null if text is None else text, 2)

        def report(event: EngineEvent) -> None:
            send(events, event)

        worker.engine.run(worker, report)
    except BaseException as err:  # noqa: BLE001 - reported as an event; the parent then sees the end
        send(events, EngineEvent("error", message=f"{type(err).__name__}: {err}"))
        raise


def _toulbar(worker: EngineWorker, report: Report) -> None:
    """toulbar2 on the core (its branch and bound, or its neighbourhood search for "toulbar2-vns",
    without the memory rows for "toulbar2-no-rows"): its plan, and its verdict when its search ended."""
    from autoshard.solver.engines.toulbar import solve_cfn

    comp = worker.comp
    found = solve_cfn(comp, worker.upper, worker.seed, vns=worker.method == "toulbar2-vns",
                      rows=worker.method != "toulbar2-no-rows")
    if found is not None:
        report(EngineEvent("plan", comp.cost(found), list(found)))
    if worker.method != "toulbar2-vns":  # its branch and bound ended: the answer is proved
        report(EngineEvent("optimal", comp.cost(found)) if found is not None else EngineEvent("none"))


def _second_search(worker: EngineWorker, report: Report) -> None:
    """The plans-only engine of search/turns.py."""
    from autoshard.solver.search.turns import run

    run(worker.comp, worker.seed, worker.upper, worker.plan, worker.toulbar, report)


def _highs(worker: EngineWorker, report: Report) -> None:
    """HiGHS on the core from the best plan so far: its plans and dual bounds as it finds them
    (the parent stops it at the deadline), then its verdict."""
    from autoshard.solver.engines.milp import highs_lower_bound, solve_core_milp

    comp = worker.comp

    def heard(kind: str, value: int, plan: list[int] | None) -> None:
        report(EngineEvent(kind, value, plan))

    result = solve_core_milp(comp, None, exact=worker.gap <= 0, gap=worker.gap, start=worker.plan, progress=heard)
    if result.choice is not None and result.cost is not None and comp.is_feasible(result.choice):
        report(EngineEvent("plan", result.cost, list(result.choice)))
        if result.optimal and worker.gap <= 0:
            report(EngineEvent("optimal", result.cost))
    elif (result.optimal or result.infeasible) and not comp.has_memory:
        report(EngineEvent("none"))
    if result.bound is not None:
        report(EngineEvent("bound", highs_lower_bound(comp, result.bound - comp.const)))
    if result.certified is not None:
        report(EngineEvent("bound", result.certified))


HULL_SECONDS = 3600.0
"""The hull engine's horizon for its dive where the run has no time limit."""
HULL_RESERVE = 1.0
"""Seconds before the run's deadline at which the hull's last pricing step stops sweeping and
reports the bound at its messages: the parent kills the engines at the deadline, and the bound
takes 0.1-0.3 s on LLaMA-3-8B's 2x8 cores (a third of a core: about three times that)."""


def _hull(worker: EngineWorker, report: Report) -> None:
    """The hull bound (column_generation.py: the Lagrangian dual of the memory rows by column
    generation, then the dive on tallies) from the best plan so far (else TRW-S's first primal,
    fitting or not, as the master's first column): each better bound outside
    every branch as it is found, each cheaper priced plan that fits, and the dive's bound when it
    ends (the known cost itself when its branches hold no cheaper plan); it works to the run's
    deadline less HULL_RESERVE."""
    import time

    import numpy as np

    from autoshard.solver.bounds.column_generation import ColumnGeneration, dive

    comp = worker.comp
    best = [worker.upper]
    horizon = time.monotonic() + (HULL_SECONDS if worker.seconds is None else max(0.0, worker.seconds - HULL_RESERVE))

    def offer(x: np.ndarray) -> None:
        cost = comp.cost(x)
        if best[0] is None or cost < best[0]:
            best[0] = cost
            report(EngineEvent("plan", cost, [int(v) for v in x]))

    generation = ColumnGeneration(comp, np.random.default_rng(worker.seed), offer,
                                  bounded=lambda bound: report(EngineEvent("bound", bound)))
    if worker.plan is not None:
        generation.add(np.asarray(worker.plan, dtype=np.int64))
    else:  # the master takes any plan as its first column, fitting or not
        generation.mp.sweep(None, horizon)
        generation.add(generation.mp.primal(None))
    ended = dive(generation, lambda: best[0], horizon)
    if ended.bound is not None:
        report(EngineEvent("bound", ended.bound))
    if ended.closed and best[0] is not None:  # no branch holds a plan cheaper than the known one
        report(EngineEvent("bound", best[0]))


ENGINES = {engine.name: engine for engine in (
    Engine("toulbar2", "toulbar2's hybrid best-first branch and bound with the memory rows as knapsack "
                       "constraints (exact: proves the optimum or that no plan fits)",
           _toulbar, exact=True, bounds=True, prints=True),
    Engine("toulbar2-vns", "toulbar2's variable-neighbourhood search from its first depth-first plan (plans only)",
           _toulbar, prints=True),
    Engine("toulbar2-no-rows", "toulbar2's branch and bound on the core without its memory rows: a relaxation, "
                               "whose bounds hold for the problem and whose optimum is the answer when it fits",
           _toulbar, relaxation=True, bounds=True, prints=True),
    Engine("highs", "HiGHS on the linearised core (exact; its infeasibility with memory rows is no proof: "
                    "its tolerances on byte-sized rows)",
           _highs, source="milp", exact=True, bounds=True),
    Engine("second-search", "a second Lagrangian search (plain subgradient steps, its own seed) taking turns with "
                            "toulbar2 on usage-weighted costs (search/turns.py): plans only, where no exact engine "
                            "takes the core",
           _second_search, source="second-search"),
    Engine("hull", "the Lagrangian dual of the memory rows by column generation priced by TRW-S, then the "
                   "dive on tallies (column_generation.py): bounds that hold, and the priced plans that fit",
           _hull, source="hull", bounds=True),
)}
"""Every engine, by the name its events and plans are reported under."""
