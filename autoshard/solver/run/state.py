"""The bookkeeping of one ``solve`` call: the clock, the best plan and bound, the answer.

With a time limit T the phases work to ``deadline``, a finishing reserve before ``limit``
(``set_reserve``): stopping the engines and z3 (which waits at most until ``teardown_by``),
evaluating and returning the answer fit in it. ``timed`` records in ``overruns`` how far a phase
ended past the deadline. Every plan is expanded to the original nodes and evaluated exactly on
the original problem before it is reported (``offer``, compiled: evaluation.py); lower bounds are
kept only when they improve (``bound``). Only this module writes a RunState's attributes: the
phases report through its methods (``reduced``, ``offer``, ``bound``, ``proved_by``, ``checked``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np

from autoshard.solver.procs.clock import MONOTONIC, Clock
from autoshard.solver.model.problem import FORBIDDEN, ShardingProblem
from autoshard.solver.core.reduced import FrozenCore, Core
from autoshard.solver.core.evaluation import Expansion, FlatProblem
from autoshard.solver.model.events import Checked, EventCallback, Finished, Improved, LowerBound
from autoshard.solver.core.reduce import Size
from autoshard.solver.search.layer_copies import LayerCopies
from autoshard.solver.model.solution import InfeasibleError, Solution, SolveOptions

COPIES = "layer copies"
"""The source of a plan made by moving a layer's change onto the other layers (``search/layer_copies.py``)."""

FINISH_RESERVE = 0.15
"""Seconds of a time limit kept for the end (stopping the engines and z3, the exact evaluation of
the answer, returning and freeing the search's objects), plus FINISH_PER_BUILD times the time
building the problem's Core took (the same kind of work and size; measured: see
benchmarks/README.md, "Measurements behind the design"), and at most FINISH_SHARE of the limit."""
FINISH_PER_BUILD = 0.5
FINISH_SHARE = 0.1
LOCALISE_PASSES = 2
"""Passes over the nodes whose start strategy the reductions removed (``RunState._localised``): a
second pass lets neighbours that were both removed agree."""
TEARDOWN_SHARE = 0.5
"""Stopping the engines and z3 waits for them at most this share of the reserve."""


class RunState:
    """One call of ``solve``: the clock, the best plan and bound, and the events. ``core`` is set
    once built, ``comp`` once the problem is reduced (``reduced``)."""

    core: Core
    comp: FrozenCore

    def __init__(self, problem: ShardingProblem, options: SolveOptions, emit: EventCallback,
                 clock: Clock = MONOTONIC) -> None:
        self.clock = clock  # every deadline of the run is a reading of it
        self.problem, self.options, self.emit = problem, options, emit
        self.start = clock()
        self.limit = None if options.timeout is None else self.start + options.timeout
        self.deadline = self.limit  # the phases' deadline: the limit less the finishing reserve (run)
        self.teardown_by = self.limit  # stopping engines and z3 waits no longer than this
        self.overruns: dict[str, float] = {}
        self.rng = np.random.default_rng(options.seed)
        self.best: list[int] | None = None
        self.best_local: np.ndarray | None = None
        self.best_cost: int | None = None
        self.lower: int | None = None
        self.lower_source: str | None = None
        self._last_lower: tuple[int, float] | None = None
        self.proof: str | None = None
        self.iterations = 0  # z3's checks
        self.improvements = 0
        self.size = Size(0, 0, 0)
        self.counts: dict[str, int] = {}
        self.proof_times: dict[str, float] = {}
        self._exact: tuple[Expansion, FlatProblem] | None = None  # built on the first offer
        self._copies: LayerCopies | None = None  # built on the first new best after another

    def set_reserve(self, build: float) -> None:
        """Move the phases' deadline a finishing reserve before the limit: FINISH_RESERVE plus
        FINISH_PER_BUILD times ``build`` (seconds building the problem's Core took), at most
        FINISH_SHARE of the limit."""
        if self.limit is not None and self.options.timeout is not None:
            reserve = FINISH_RESERVE + FINISH_PER_BUILD * build
            self.deadline = self.limit - min(reserve, FINISH_SHARE * self.options.timeout)
            self.teardown_by = self.deadline + TEARDOWN_SHARE * (self.limit - self.deadline)

    def built(self, core: Core) -> None:
        """The working Core, its memory rows attached."""
        self.core = core

    def reduced(self, counts: dict[str, int]) -> None:
        """The core's reductions are over (``counts``: how many of each applied): freeze it."""
        self.counts = dict(counts)
        self.size = Size.of(self.core)
        self.comp = self.core.hand_over()
        if self.best is not None:
            self.best_local = self._localised(self.best)

    def _localised(self, choice: list[int]) -> np.ndarray | None:
        """The core plan with ``choice``'s strategy at every node of the core that the reductions
        left it (a node whose strategy was removed as dominated takes its cheapest strategy given
        its neighbours, in LOCALISE_PASSES passes), when that plan fits, so the searches can start
        from a given plan (``start_from``); else None. Its removed nodes expand as the reductions
        decide."""
        comp = self.comp
        local = np.zeros(comp.n, dtype=np.int64)
        missing = []
        for i, v in enumerate(comp.nodes):
            where = np.flatnonzero(self.core.strategies[v] == choice[v])
            if len(where):
                local[i] = where[0]
            else:
                missing.append(i)
        for _ in range(LOCALISE_PASSES if missing else 0):
            for i in missing:
                local[i] = int(np.argmin(comp.costs_given(i, local)))
        return local if comp.is_feasible(local) else None

    def proved_by(self, source: str) -> None:
        """``source`` proved the best plan optimal, or the problem infeasible, without a bound."""
        self.proof = source

    def checked(self, bound: int | None, result: str) -> None:
        """z3 answered ``result`` when asked for a plan cheaper than ``bound``: count and report it;
        UNSAT at or above the best cost proves it optimal."""
        self.iterations += 1
        self.emit(Checked(self.iterations, bound, result, self.elapsed()))
        if result == "unsat" and (bound is None or (self.best_cost is not None and bound >= self.best_cost)):
            self.proof = "z3"
            self.proof_times.setdefault("z3", self.elapsed())

    def elapsed(self) -> float:
        """Seconds since solve() started."""
        return self.clock() - self.start

    def left(self) -> float | None:
        """Seconds left (None without a time limit)."""
        return None if self.deadline is None else self.deadline - self.clock()

    def out_of_time(self) -> bool:
        """True once the time limit has passed."""
        return self.deadline is not None and self.clock() >= self.deadline

    def proved(self) -> bool:
        """True when the best plan is proved optimal or the problem infeasible."""
        return self.proof is not None or (
            self.lower is not None and self.best_cost is not None and self.lower >= self.best_cost
        )

    def finished(self) -> bool:
        """True when proved, or when the relative gap is within ``options.gap``."""
        if self.proved():
            return True
        if self.options.gap <= 0 or self.lower is None or self.best_cost is None:
            return False
        return self.best_cost - self.lower <= self.options.gap * max(abs(self.best_cost), 1)

    def start_from(self, choice: tuple[int, ...], source: str) -> bool:
        """Take a plan of the original problem (``SolveOptions.start``) as the first best when it
        fits and avoids forbidden costs; every plan offered after must cost less than it."""
        limit = self.problem.usage_limit
        cost = self.problem.cost(choice)
        peak = None if limit is None else self.problem.peak_usage(choice)
        if cost >= FORBIDDEN or (peak is not None and peak > limit):
            return False
        self.best, self.best_cost = list(choice), cost
        self.improvements += 1
        self.emit(Improved(self.improvements, cost, tuple(choice), None, self.elapsed(), source, peak))
        return True

    def offer(self, local: np.ndarray | list[int], source: str, bound: int | None) -> bool:
        """Report a core plan if it beats the best (evaluated exactly on the original problem)."""
        local = np.asarray(local, dtype=np.int64)
        if self.comp.cost(local) >= (self.best_cost if self.best_cost is not None else 2**200):
            return False
        if self._exact is None:  # the reductions are over: their records no longer change
            self._exact = Expansion.of(self.core, self.comp.nodes), FlatProblem.of(self.problem)
        expansion, flat = self._exact
        choice = expansion.expand(local)
        ev = flat.evaluate(choice)
        if not ev.feasible or (self.best_cost is not None and ev.cost >= self.best_cost):
            return False
        before = self.best
        self.best, self.best_cost, self.best_local = choice.tolist(), ev.cost, local
        self.improvements += 1
        peak = ev.peak if self.problem.usage_limit is not None else None
        self.emit(Improved(self.improvements, ev.cost, tuple(self.best), bound, self.elapsed(), source, peak))
        if before is not None and self.problem.layers and source != COPIES:
            self._copy_layers(np.asarray(before, dtype=np.int64), choice, ev.cost, bound)
        return True

    def _copy_layers(self, before: np.ndarray, after: np.ndarray, cost: int, bound: int | None) -> None:
        """Offer the plan that the layer moves make from ``after`` (its changes to the layers since
        ``before``, and those remembered), where they pay and the core can hold it
        (``search/layer_copies.py``)."""
        if self._copies is None:
            self._copies = LayerCopies(self.problem, self._exact[1])
        found = self._copies.improve(before, after, cost)
        local = None if found is None else self._localised(found[0].tolist())
        if local is not None:
            self.offer(local, COPIES, bound)

    def bound(self, value: int | None, source: str) -> None:
        """Record a proven lower bound if it is better than the one we have."""
        if value is None or (self.lower is not None and value <= self.lower):
            return
        if self.best_cost is not None:
            value = min(value, self.best_cost)
        if self.lower is not None and value <= self.lower:
            return
        self.lower, self.lower_source = value, source
        now = self.elapsed()
        closes = self.best_cost is not None and value >= self.best_cost
        if closes:
            self.proof_times.setdefault(source, now)
        if self._last_lower is None or closes or now - self._last_lower[1] >= 1.0 or (
            value - self._last_lower[0] >= 0.001 * abs(value)
        ):
            self._last_lower = (value, now)
            self.emit(LowerBound(value, now, source))

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Record in ``overruns`` how far past the deadline ``phase`` ended (if it did)."""
        try:
            yield
        finally:
            if self.deadline is not None:
                late = self.clock() - self.deadline
                if late > self.overruns.get(phase, 0.0):
                    self.overruns[phase] = late

    def share(self, fraction: float) -> float | None:
        """The deadline after ``fraction`` of the time left (None without a limit)."""
        return None if self.deadline is None else self.clock() + fraction * self.left()

    def soon(self, seconds: float) -> float:
        t = self.clock() + seconds
        return t if self.deadline is None else min(t, self.deadline)

    def solution(self, status: str, message: str) -> Solution:
        cost = self.best_cost
        lower = self.lower
        if status == "optimal":
            lower = cost
        gap = None
        if cost is not None and lower is not None:
            gap = 0.0 if cost == lower else (cost - lower) / max(abs(cost), 1)
        peak = None
        if self.best is not None and self.problem.usage_limit is not None:
            peak = self.problem.peak_usage(self.best)
        rows = 0 if getattr(self, "comp", None) is None or self.comp.capacity is None else len(self.comp.capacity)
        return Solution(
            choice=list(self.best or []),
            cost=cost,
            lower_bound=lower,
            status=status,
            gap=gap,
            elapsed=self.elapsed(),
            iterations=self.iterations,
            peak=peak,
            proof=self.proof_name() if status == "optimal" else None,
            message=message,
            core_nodes=self.size.nodes,
            core_edges=self.size.edges,
            core_rows=rows,
            reductions=dict(self.counts),
            proof_times=dict(self.proof_times) if status == "optimal" else {},
            overruns=dict(self.overruns),
        )

    def proof_name(self) -> str:
        """Who proved optimality: z3's UNSAT, the reductions, or the source of a matching bound."""
        if "z3" in self.proof_times:
            return "z3"
        return self.proof or self.lower_source or "lower bound"

    def finish(self) -> Solution:
        solution = self.solution("optimal" if self.proved() else "feasible", "")
        self.emit(Finished(solution))
        return solution

    def infeasible(self, message: str) -> Solution:
        raise self.infeasible_error(message)

    def infeasible_error(self, message: str) -> InfeasibleError:
        solution = self.solution("infeasible", message)
        self.emit(Finished(solution))
        return InfeasibleError(message, solution)
