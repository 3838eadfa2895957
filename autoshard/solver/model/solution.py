"""What ``solve`` takes and returns: its options, the answer, and the infeasibility error."""

from __future__ import annotations

from dataclasses import dataclass, field

from autoshard.errors import AutoshardError


@dataclass(frozen=True)
class SolveOptions:
    """How to solve.

    ``timeout``: seconds (None: until proved). ``reduce``: exact reductions first. ``warm_start``:
    heuristics, LP bound and Lagrangian search before and alongside z3 (without it z3 works alone,
    showing every plan it finds). ``prove``: run the methods whose point is a proof: z3, the LP
    before toulbar2, HiGHS's MILP and toulbar2 without memory rows; off, only the plan searches run
    and the answer is the best plan found (proved only if a plan search meets its bound). ``seed``:
    for the randomised parts.
    ``gap``: stop once (best - lower bound) / best is at most this (0: until proved). ``toulbar``:
    let toulbar2 search the cores it can take (toulbar.py); off, the rest of the portfolio works alone.
    ``start``: a plan of the original problem (one strategy per node, e.g. a hand-written baseline)
    that, when it fits and avoids forbidden costs, is the first best: the answer is it or a cheaper plan.
    """

    timeout: float | None = None
    reduce: bool = True
    warm_start: bool = True
    prove: bool = True
    seed: int = 0
    gap: float = 0.0
    toulbar: bool = True
    start: tuple[int, ...] | None = None


@dataclass
class Solution:
    """The answer: a strategy per original node, its exact cost, and what is proved about it.

    ``status`` is "optimal" (proved: ``proof`` says by what), "feasible" (best found, with
    ``lower_bound`` and relative ``gap`` when a bound is known) or "infeasible" (no plan;
    ``choice`` empty, ``cost`` None, ``message`` says why). ``proof_times``: seconds into the
    solve at which each exact method (z3, toulbar2, milp, ...) proved the final cost optimal.
    ``overruns``: with a time limit, the seconds by which a phase (reductions, heuristic, lp,
    lagrange, lns, z3, engines) ended past the deadline the phases work to (the limit less the
    finishing reserve); phases that kept it are absent.
    """

    choice: list[int]
    cost: int | None
    lower_bound: int | None
    status: str
    gap: float | None
    elapsed: float
    iterations: int
    peak: int | None = None
    proof: str | None = None
    message: str = ""
    core_nodes: int = 0
    core_edges: int = 0
    core_rows: int = 0
    reductions: dict[str, int] = field(default_factory=dict)
    proof_times: dict[str, float] = field(default_factory=dict)
    overruns: dict[str, float] = field(default_factory=dict)


class InfeasibleError(AutoshardError):
    """No assignment avoids forbidden costs and fits the memory limit; ``solution`` has details."""

    def __init__(self, message: str, solution: Solution) -> None:
        super().__init__(message)
        self.solution = solution
