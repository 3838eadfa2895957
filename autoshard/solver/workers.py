"""Exact engines in forked child processes: toulbar2 (branch and bound, neighbourhood search) and
HiGHS's MILP on the reduced core, reporting plans and bounds through a pipe.

Why processes: both are C++ code that holds the GIL while it searches, counts time limits in CPU
seconds (toulbar2) and prints to the C stdout and stderr. A child is forked after the core is
frozen (nothing is pickled), points its fds 1 and 2 at a pipe, dies with its parent
(PR_SET_PDEATHSIG) and is killed at the wall-clock deadline; a thread of the parent parses the
pipe into ``EngineEvent``s. Two children use the two cores while the parent keeps its own search
(Lagrangian, z3) going. Every engine speaks toulbar2's line format (costs without the core's
constant, which ``_read`` adds back):

    New solution: C ...          followed by a line of the plan's local strategies
    Optimality gap: [L, U] ...   every plan costs at least L
    Optimum: C ...               the last plan is optimal
    No solution ...              no plan is cheaper than the upper bound the engine was given
"""

from __future__ import annotations

import ctypes
import os
import pickle
import queue
import re
import select
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, TypeVar

from autoshard.solver.core import Compact

METHODS = ("hbfs", "vns", "relaxed", "milp", "lagrange")
"""hbfs: toulbar2's hybrid best-first branch and bound (exact); vns: toulbar2's variable-
neighbourhood search (plans only); relaxed: toulbar2's branch and bound without the memory rows
(its bounds hold for the problem, and when its optimum fits, that is the optimum); milp: HiGHS on
the linearised core (exact); lagrange: our Lagrangian/TRW-S search (plain subgradient steps)
taking turns with toulbar2 on usage-weighted costs where toulbar2 takes the core without its
rows (second_search.py), with its own seed (plans only: a second, independent search where no
exact engine takes the core)."""

_NEW = re.compile(r"New solution: (-?[0-9.e+]+)")
_GAP = re.compile(r"Optimality gap: \[(-?[0-9.e+]+), (-?[0-9.e+]+)\]")
_BOUNDS = re.compile(r"Initial lower and upper bounds: \[(-?[0-9.e+]+), (-?[0-9.e+]+)\]")
_OPTIMUM = re.compile(r"^Optimum: (-?[0-9.e+]+)")
T = TypeVar("T")


@dataclass(frozen=True)
class EngineEvent:
    """What a child reported: ``kind`` is "plan" (``choice``, local strategies, costing ``cost``
    on the core), "bound" (every plan costs at least ``cost``), "optimal" (the last plan is
    optimal), "none" (no plan cheaper than the upper bound it was given), "error" (the child
    failed: ``EngineWorker.error`` says why) or "end"."""

    kind: str
    cost: int | None = None
    choice: list[int] | None = None


class EngineWorker:
    """One engine (``method`` in METHODS) on ``comp`` in a forked child; ``events`` yields
    EngineEvents (costs include ``comp.const``). ``upper``: only plans cheaper than this are
    wanted. ``gap``: stop at this relative gap (0: prove). ``seed``: the engine's random seed.
    ``toulbar``: the lagrange engine may call toulbar2 on its penalised and weighted problems."""

    def __init__(self, comp: Compact, method: str, upper: int | None, gap: float = 0.0, seed: int = 1,
                 plan: list[int] | None = None, toulbar: bool = False) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown engine {method!r}")
        self.comp, self.method, self.upper, self.gap, self.seed = comp, method, upper, gap, seed
        self.toulbar = toulbar
        self.plan = plan  # the plan costing ``upper`` (local strategies), where one is known
        self.events: queue.Queue[EngineEvent] = queue.Queue()
        self.pid: int | None = None
        self.done = False
        self.error: str | None = None
        self.cheapest: int | None = None  # the cheapest plan it reported (fitting or not)
        self._reader: threading.Thread | None = None

    @property
    def exact(self) -> bool:
        """True when the engine ends by proving the optimum (or that there is no plan)."""
        return self.method in ("hbfs", "milp")

    @property
    def relaxation(self) -> bool:
        """True when the engine searches a relaxation (the core without memory rows): its plans
        need not fit, and the optimum it converges to is at most the cheapest plan it reported."""
        return self.method == "relaxed"

    @property
    def bounds(self) -> bool:
        """True when the engine's bounds and verdicts are lower bounds of the problem."""
        return self.method in ("hbfs", "milp", "relaxed")

    def start(self) -> None:
        """Fork the child and start reading what it prints."""
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(read)
            _child(self, write)
        os.close(write)
        self.pid = pid
        self._reader = threading.Thread(target=self._read, args=(read,), daemon=True)
        self._reader.start()

    def stop(self, until: float | None = None) -> None:
        """Kill the child (if still running); wait for the reader to take in what the child said
        last, but not past ``until`` (time.monotonic; a killed child's pipe closes only once the
        kernel has freed its memory, which takes a while for gigabytes)."""
        if self.pid is None:
            return
        kill_and_reap(self.pid)
        self.pid = None
        if self._reader is not None:
            self._reader.join(1.0 if until is None else max(0.0, min(1.0, until - time.monotonic())))

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

    def _read(self, fd: int) -> None:
        """Parse the child's output into events (runs in a thread of the parent)."""
        const = self.comp.const
        pending: int | None = None
        with os.fdopen(fd, "r", errors="replace") as pipe:
            for line in pipe:
                if pending is not None:
                    values = line.split()
                    if len(values) == self.comp.n and all(v.isdigit() for v in values):
                        cost = pending + const
                        self.cheapest = cost if self.cheapest is None else min(self.cheapest, cost)
                        self.events.put(EngineEvent("plan", cost, [int(v) for v in values]))
                    pending = None
                    continue
                if m := _NEW.search(line):
                    pending = round(float(m.group(1)))
                elif m := _GAP.search(line) or _BOUNDS.search(line):
                    self.events.put(EngineEvent("bound", _ceil(m.group(1)) + const))
                elif m := _OPTIMUM.search(line):
                    self.events.put(EngineEvent("optimal", round(float(m.group(1))) + const))
                elif line.startswith("No solution"):
                    self.events.put(EngineEvent("none"))
                elif line.startswith("error: "):
                    self.error = line[7:].strip()
                    self.events.put(EngineEvent("error"))
        self.done = True
        self.events.put(EngineEvent("end"))


def call_forked(fn: Callable[[], T], until: float | None, idle: Callable[[], bool] | None = None) -> T | None:
    """``fn()`` in a forked child (fds 0-2 on /dev/null), its result pickled back through a pipe:
    a call the caller can abandon at ``until`` (time.monotonic), for C code (HiGHS) that runs
    past its own time limit and cannot be interrupted. None when the child failed, ``until``
    came first or ``idle()`` (called every 50 ms of waiting) returned True; the child is then
    killed."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read)
        _call_child(fn, write)
    os.close(write)
    chunks: list[bytes] = []
    try:
        while True:
            left = None if until is None else until - time.monotonic()
            if left is not None and left <= 0:
                return None
            ready, _, _ = select.select([read], [], [], 0.05 if left is None else min(0.05, left))
            if ready:
                chunk = os.read(read, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
            elif idle is not None and idle():
                return None
    finally:
        os.close(read)
        kill_and_reap(pid)
    try:
        return pickle.loads(b"".join(chunks)) if chunks else None
    except (pickle.UnpicklingError, EOFError):
        return None  # the child died while writing


def _call_child(fn: Callable[[], object], write: int) -> None:
    """The child of ``call_forked``: run ``fn``, write its pickle, exit without returning."""
    status = 1
    try:
        quiet_child()
        write_all(write, pickle.dumps(fn(), protocol=pickle.HIGHEST_PROTOCOL))
        status = 0
    finally:
        os._exit(status)


def quiet_child() -> None:
    """A forked child's set-up for calls whose prints must go nowhere: it dies with its parent
    and its fds 0-2 are on /dev/null (``call_forked``, call_server.py)."""
    _die_with_parent()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to fd (a pipe takes it in pieces)."""
    view = memoryview(data)
    while len(view):
        view = view[os.write(fd, view):]


def kill_and_reap(pid: int) -> None:
    """SIGKILL a child and reap it in a daemon thread: waiting here would take as long as the
    kernel needs to free the child's memory."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    threading.Thread(target=_reap, args=(pid,), daemon=True).start()


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _ceil(text: str) -> int:
    value = float(text)
    return int(value) if value == int(value) else int(value) + 1


def _child(worker: EngineWorker, write: int) -> None:
    """Run the engine with fds 1 and 2 on ``write``; exit without returning."""
    status = 1
    try:
        _die_with_parent()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        if worker.method == "milp":
            _milp(worker)
        elif worker.method == "lagrange":
            from autoshard.solver.second_search import run

            run(worker.comp, worker.seed, worker.upper, worker.plan, worker.toulbar)
        else:
            from autoshard.solver.toulbar import solve_cfn

            solve_cfn(worker.comp, worker.upper, worker.gap, worker.seed, vns=worker.method == "vns",
                      rows=worker.method != "relaxed")
        status = 0
    except BaseException as err:  # report and leave: the parent reads "error" and then the end
        os.write(1, f"\nerror: {type(err).__name__}: {err}\n".encode())
    finally:
        os._exit(status)


def solution_lines(cost: int, plan: Iterable[int]) -> list[str]:
    """A plan in toulbar2's line format, as the parent reads it (``_NEW``): its cost without the
    core's constant, then its strategies."""
    return [f"New solution: {cost}", " ".join(map(str, plan))]


def _milp(worker: EngineWorker) -> None:
    """HiGHS on the core, its answer written in toulbar2's line format."""
    from autoshard.solver.milp import solve_compact_milp

    comp = worker.comp
    result = solve_compact_milp(comp, None, exact=worker.gap <= 0, gap=worker.gap)
    lines = []
    if result.choice is not None and comp.is_feasible(result.choice):
        cost = result.cost - comp.const
        lines += solution_lines(cost, result.choice)
        if result.optimal and worker.gap <= 0:
            lines.append(f"Optimum: {cost}")
    elif (result.optimal or result.infeasible) and not comp.has_memory:
        lines.append("No solution")  # with memory rows HiGHS's tolerances on byte-sized rows are no proof:
        # on LLaMA-3-8B (eager, 8 devices, 80 GiB) it called a core infeasible that has plans
    if result.bound is not None:
        lower = result.bound - comp.const
        lines.append(f"Optimality gap: [{lower - 1e-6 * abs(lower) - 1:.0f}, 0]")
    os.write(1, ("\n".join(lines) + "\n").encode())


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent ends (an os._exit at the deadline)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        os._exit(1)
