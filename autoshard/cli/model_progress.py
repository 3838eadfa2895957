"""The model CLI's rendering of solver events: cost tables or one line per better plan, and a
live status line (progress.py's ``EventView`` keeps the state it reads)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from autoshard.cli.baseline import cost_text
from autoshard.cli.progress import HEARTBEAT, EventView, failure_line
from autoshard.solver.procs.clock import Clock
from autoshard.solver.model.events import EngineFailed, Improved, Reduced, Event

SMALL_PLAN_ROWS = 40
"""``--tables auto`` prints every improving plan's table up to this many rows; above, one line each and the
final plan's communication."""


class ModelProgress(EventView):
    """Turns solver events into cost tables and a live status line; on a console that is not a
    terminal (piped: no live line) the status is printed after HEARTBEAT s without a line. With one
    line per plan, the plans after one whose total prints the same (a neighbourhood search shaving
    picoseconds) are held and printed as one line when the total shown changes or the run ends."""

    def __init__(self, mp: Any, console: Console, tables: str, live: Live | None, every: float = HEARTBEAT,
                 clock: Clock | None = None) -> None:
        self.mp, self.console, self.tables, self.live = mp, console, tables, live
        if tables == "auto":
            from autoshard.cli.report import cost_rows
            small = len(cost_rows(mp, [0] * mp.problem.num_nodes)) <= SMALL_PLAN_ROWS
            self.tables = "all" if small else "lines"
        self.iterations = 0
        self.shown = ""  # the short total of the last plan line printed
        self.held: list[tuple[int, Improved]] = []  # plans since then whose short total reads the same
        super().__init__(every, heartbeat=live is not None and not console.is_terminal, clock=clock)

    def status(self) -> Text:
        """The live line: iterations, the bound z3 is asked for, best plan, lower bound, time."""
        fmt = self.mp.cost_model.format
        best = "-" if self.best is None else fmt(self.best)
        lower = "-" if self.lower is None else fmt(self.lower)
        return Text(f"iterations {self.iterations}  bound < {best}  best {best}  lower bound {lower}  "
                    f"time {self.clock() - self.start:.1f}s", style="cyan")

    def status_text(self) -> str:
        return self.status().plain

    def on_improved(self, event: Improved) -> None:
        self.iterations += 1
        if self.tables == "lines":
            short = self.mp.cost_model.format(event.cost)
            if short == self.shown:
                self.held.append((self.iterations, event))
                return
            self.flush()
            self.shown = short
            self.print(f"[bold]Iteration {self.iterations}[/] ({event.source}): total "
                       f"{cost_text(self.mp, event.cost)}", highlight=False)
        elif self.tables == "all":
            from autoshard.cli.report import iteration_table
            bound = "" if event.bound is None else f", asked for < {self.mp.cost_model.format(event.bound)}"
            self.print(f"[bold]Iteration {self.iterations}[/] ({event.source}{bound}): "
                       f"total {cost_text(self.mp, event.cost)}", highlight=False)
            self.print(iteration_table(self.mp, list(event.choice), None))

    def flush(self) -> None:
        """Print the held plans as one line: their iterations, sources and the last one's total."""
        if not self.held:
            return
        (first, _), (last, event) = self.held[0], self.held[-1]
        if first == last:
            head = f"Iteration {last}[/] ({event.source})"
        else:
            sources = Counter(e.source for _, e in self.held)
            what = ", ".join(f"{source} {count}" for source, count in sources.most_common())
            head = f"Iterations {first}-{last}[/] ({len(self.held)} plans: {what})"
        self.print(f"[bold]{head}: total {cost_text(self.mp, event.cost)}", highlight=False)
        self.held = []

    def close(self) -> None:
        """Print what is held, then stop the status lines."""
        self.flush()
        super().close()

    def on_engine_failed(self, event: EngineFailed) -> None:
        self.line(failure_line(event))

    def on_reduced(self, event: Reduced) -> None:
        self.print(f"reduced: {event.nodes_before} nodes / {event.edges_before} edges -> "
                   f"{event.nodes_after} / {event.edges_after} left for z3")

    def after(self, event: Event) -> None:
        if self.live is not None:
            self.live.update(self.status())

    def line(self, text: str) -> None:
        self.print(text, markup=False, highlight=False)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print to the console and put off the next heartbeat."""
        self.console.print(*args, **kwargs)
        self.heartbeat.touch()
