"""The problem-file path of ``python -m autoshard.solve``: IOPDDL ``.json`` / ``.json.gz`` files.

``run`` loads the file, solves it with a live progress line and one printed line per better
plan, and ends with the contest's solution format ``[i, j, ...]`` as the last line of output.
``add_solver_arguments`` / ``solve_options`` give every entry point the same solver flags.

The time limit counts the whole process, as the contest does: interpreter start, imports and
reading the file come out of it (``Clock``), the solver stops ``reserve`` seconds early, and a
watchdog prints the best plan found so far and exits if the solver overruns anyway. The
process leaves through ``autoshard.cli.process.exit_now`` (flush, then os._exit; autoshard/solve.py):
tearing down the Python objects of a 65k-node problem would take seconds after the answer is out.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import replace
from typing import Any, Sequence

from rich.console import Console
from rich.live import Live
from rich.text import Text

from autoshard.errors import AutoshardError
from autoshard.solver.model.iopddl import format_solution, load_problem, write_problem
from autoshard.cli.process import is_cli_process
from autoshard.cli.progress import HEARTBEAT, EventView, LogLines, failure_line, gap
from autoshard.solver import Solution, SolveOptions, solve
from autoshard.solver.model.events import Checked, EngineFailed, Event, Improved, Reduced, Started
from autoshard.solver.procs import clock as clocks


def add_solver_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the solver's flags (shared by model and problem files)."""
    group = parser.add_argument_group("solver")
    group.add_argument("--no-reduce", action="store_true",
                       help="skip the exact reductions (z3 sees the whole problem)")
    group.add_argument("--no-warm-start", action="store_true",
                       help="no heuristics, LP or Lagrangian search: z3 alone, showing every plan it finds")
    group.add_argument("--no-prove", action="store_true",
                       help="do not run z3 (heuristics and bounds only)")
    group.add_argument("--seed", type=int, default=None, help="seed of the randomised heuristics (default 0)")
    group.add_argument("--gap", type=float, default=None, metavar="REL",
                       help="stop once the best plan is within this relative gap of the lower bound, "
                            "e.g. 0.001; default 0: until proved optimal")
    group.add_argument("--log", action="store_true",
                       help="one plain line per better plan, bound and proof on stderr (also with --quiet)")
    group.add_argument("--write-problem", metavar="FILE", default=None,
                       help="also write the problem in the IOPDDL format (.json or .json.gz) for other solvers")


def solve_options(args: argparse.Namespace, base: SolveOptions | None = None) -> SolveOptions:
    """SolveOptions from parsed flags; flags the user set override ``base``."""
    if base is None:
        base = SolveOptions(timeout=getattr(args, "timeout", None))
    changes: dict[str, Any] = {}
    if getattr(args, "no_reduce", False):
        changes["reduce"] = False
    if getattr(args, "no_warm_start", False):
        changes["warm_start"] = False
    if getattr(args, "no_prove", False):
        changes["prove"] = False
    if getattr(args, "seed", None) is not None:
        changes["seed"] = args.seed
    gap = getattr(args, "gap", None)
    if gap is not None:
        if not 0 <= gap < 1:
            raise AutoshardError(f"--gap {gap:g} is not a relative gap: give a number in [0, 1), e.g. 0.001")
        changes["gap"] = gap
    return replace(base, **changes)


class ProblemDisplay(EventView):
    """Prints one line per improvement and keeps a live status line; on a console that is not a
    terminal (no live line) the status is printed after HEARTBEAT s of silence."""

    def __init__(self, console: Console, live: Live | None, every: float = HEARTBEAT,
                 clock: clocks.Clock | None = None) -> None:
        self.console, self.live = console, live
        super().__init__(every, heartbeat=not console.is_terminal, clock=clock)

    def status(self) -> Text:
        """The live line: phase, best, bound, gap, z3 checks, time."""
        best = "-" if self.best is None else str(self.best)
        lower = "-" if self.lower is None else str(self.lower)
        return Text(
            f"{self.phase}: best {best}  lower bound {lower}  gap {gap(self.best, self.lower)}  "
            f"z3 checks {self.checks}  {self.clock() - self.start:.1f}s",
            style="cyan",
        )

    def status_text(self) -> str:
        return self.status().plain

    def on_started(self, event: Started) -> None:
        self.phase = "exact reductions"
        limit = "none" if event.usage_limit is None else str(event.usage_limit)
        self.line(f"{event.name or 'problem'}: {event.nodes} nodes, {event.edges} edges, "
                  f"{event.strategies} strategies, usage limit {limit}")

    def on_reduced(self, event: Reduced) -> None:
        if not event.counts:
            self.line(f"no reductions: z3 sees {event.nodes_after} nodes / {event.edges_after} edges "
                      f"({event.memory_rows} memory rows)")
        else:
            self.line(f"reduced in {event.elapsed:.2f}s: {event.nodes_before} nodes / {event.edges_before} edges "
                      f"-> {event.nodes_after} / {event.edges_after} ({event.strategies_after} strategies, "
                      f"{event.memory_rows} memory rows)")

    def on_improved(self, event: Improved) -> None:
        bound = "" if event.bound is None else f"  (asked < {event.bound})"
        self.line(f"{event.elapsed:8.2f}s  cost {event.cost}  by {event.source}{bound}  "
                  f"gap {gap(self.best, self.lower)}")

    def on_engine_failed(self, event: EngineFailed) -> None:
        self.line(failure_line(event))

    def on_checked(self, event: Checked) -> None:
        if event.result == "unsat":
            self.line(f"{event.elapsed:8.2f}s  z3: no plan cheaper than {event.bound} (UNSAT)")

    def after(self, event: Event) -> None:
        if self.live is not None:
            self.live.update(self.status(), refresh=True)

    def line(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        self.heartbeat.touch()


class Clock:
    """A wall-time limit counted from ``started`` (a reading of ``clock``): the solver's share of
    what is left, and the moment the watchdog must print whatever plan there is."""

    def __init__(self, timeout: float | None, started: float, clock: clocks.Clock = clocks.MONOTONIC) -> None:
        self.timeout, self.started, self.clock = timeout, started, clock

    @property
    def reserve(self) -> float:
        """Seconds kept back for printing the plan and leaving the process (the solver keeps its
        own deadline, finishing reserve included: on 57k nodes it returned 0.5-1 s before it)."""
        return 0.0 if self.timeout is None else min(0.5 + 0.02 * self.timeout, 3.0)

    def solver_budget(self) -> float | None:
        """Seconds the solver may use from now (None without a limit; at least 0.1)."""
        if self.timeout is None:
            return None
        return max(0.1, self.started + self.timeout - self.reserve - self.clock())

    def hard_deadline(self) -> float | None:
        """When the watchdog prints the best plan so far and ends the process."""
        return None if self.timeout is None else self.started + self.timeout - min(0.75, 0.3 * self.reserve)


ORIGINAL_STDOUT = os.dup(1)
"""The process's stdout as it was at import: the watchdog writes the answer here even while a
HiGHS call has fd 1 pointed at /dev/null (silence.silenced)."""
ORIGINAL_STDERR = os.dup(2)


def launch_time(clock: clocks.Clock = clocks.MONOTONIC) -> float:
    """When this process started (a reading of ``clock``) if it is the CLI, else now: in-process
    callers (tests, notebooks) count their limit from the call."""
    now = clock()
    if not is_cli_process():
        return now
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return now
    age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    return now - min(max(age, 0.0), 60.0)


class _Watchdog:
    """Keeps the best plan from the solver's events; at the hard deadline (when armed) prints it
    and ends the process."""

    def __init__(self, deadline: float | None, forward: Any) -> None:
        self.forward = forward
        self.choice: tuple[int, ...] | None = None
        self.lock = threading.Lock()
        self.printed = False
        self.timer = None
        if deadline is not None:
            self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
            self.timer.daemon = True
            self.timer.start()

    def __call__(self, event: Event) -> None:
        if isinstance(event, Improved):
            self.choice = event.choice
        if self.forward is not None:
            self.forward(event)

    def cancel(self) -> None:
        """Disarm (the run is over, printed or failed)."""
        if self.timer is not None:
            self.timer.cancel()

    def print_once(self, console: Console, choice: Sequence[int]) -> None:
        """Print the final plan unless the watchdog already has."""
        with self.lock:
            self.cancel()
            if not self.printed:
                self.printed = True
                console.print(format_solution(choice), markup=False, highlight=False, soft_wrap=True)

    def _fire(self) -> None:
        with self.lock:
            if self.printed:
                return
            self.printed = True
            if self.choice is None:
                os.write(ORIGINAL_STDERR, b"error: no plan found within the time limit: raise the timeout\n")
                os._exit(2)
            sys.stdout.flush()
            os.write(ORIGINAL_STDOUT, ("\n" + format_solution(self.choice) + "\n").encode())
            os._exit(0)


def run(
    path: str,
    timeout: float | None,
    console: Console,
    quiet: bool = False,
    options: SolveOptions | None = None,
    started: float | None = None,
    log: bool = False,
    write_to: str | None = None,
) -> int:
    """Solve an IOPDDL problem file; print progress and, last, the solution list. Returns 0.

    ``timeout`` is wall time counted from ``started`` (default: ``launch_time()``), reading the
    file included; the watchdog that ends an overrunning solve is armed in the CLI process only.
    ``log``: LogLines on stderr. ``write_to``: also write the problem there (IOPDDL)."""
    clock = Clock(timeout, launch_time() if started is None else started)
    watchdog = _Watchdog(clock.hard_deadline() if is_cli_process() else None, None)
    log_lines = LogLines(watchdog) if log else None
    listener = log_lines or watchdog
    display: ProblemDisplay | None = None
    try:
        if quiet:
            solution = _load_and_solve(path, clock, options, listener, write_to)
        else:
            # refreshed twice a second, so the phase and the time move even between events
            with Live(console=console, transient=True, refresh_per_second=2) as live:
                watchdog.forward = display = ProblemDisplay(console, live)
                display.phase = "reading the file"
                live.update(display.status())
                solution = _load_and_solve(path, clock, options, listener, write_to)
            display.close()
            _summary(console, solution)
        watchdog.print_once(console, solution.choice)
    finally:
        watchdog.cancel()
        for beating in (log_lines, display):
            if beating is not None:
                beating.close()
    return 0


def _load_and_solve(path: str, clock: Clock, options: SolveOptions | None, listener: Any,
                    write_to: str | None) -> Solution:
    problem = load_problem(path)
    if write_to:
        write_problem(problem, write_to)
    return solve(problem, replace(options or SolveOptions(), timeout=clock.solver_budget()), listener)


def _summary(console: Console, solution: Solution) -> None:
    if solution.status == "optimal":
        text = (f"optimal: cost {solution.cost} proved by {solution.proof} in {solution.elapsed:.2f}s "
                f"({solution.iterations} z3 checks)")
    else:
        lower = "none" if solution.lower_bound is None else str(solution.lower_bound)
        text = (f"time limit: best cost {solution.cost}, lower bound {lower}, gap {gap(solution.cost, solution.lower_bound)}, "
                f"{solution.elapsed:.2f}s")
    if solution.peak is not None:
        text += f"; peak memory {solution.peak}"
    console.print(text, markup=False, highlight=False, soft_wrap=True)
