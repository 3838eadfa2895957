"""``solve``: exact reductions, warm start, z3 CEGIS — anytime, with a proven lower bound.

The problem (problem.py):

    minimise   sum_i c_i[s_i] + sum_{(u,v)} m_uv[s_u, s_v]
    subject to sum_{i live at t} usage_i[s_i] <= limit   for every time t,   no cost >= FORBIDDEN

Pipeline and where each part lives:

1. ``reduce.reduce_core``: exact reductions (dominated/forbidden strategies, folding, functional
   merging with memory carried, degree-0/1/2 elimination of memory-free nodes, parallel edges);
   ``core/rows.py`` puts the memory constraint on compressed rows. (Here, in ``_Run.run``.)
2. warm start on the core (``warm_start=True``, portfolio.py): without memory, exact variable
   elimination when the core is narrow enough (elimination.py) — done, proved. Otherwise a
   minimum-memory plan polished by local search (local_search.py), then exact engines in child
   processes, one per core (workers.py: toulbar2, HiGHS's MILP, a second Lagrangian search),
   chosen by what the core is, beside the LP bound and the Lagrangian relaxation of memory here.
3. z3 CEGIS (cegis.py) on the core: "is there any plan with cost < best?"; each SAT is a better
   plan, UNSAT proves the best optimal. It gets the LP's (or TRW-S's) dual as a redundant cut
   (dual_cut.py), without which z3 rarely proves anything. When another method has proved the
   optimum, z3 is asked once more (``Z3Phases.certify``, cores of at most Z3_CERTIFY_MAX_TERMS
   literals) and its UNSAT is the proof shown; ``Solution.proof_times`` has both times.
4. without a time limit, a core still unproved is solved as an ILP by HiGHS to a zero gap
   (milp.py): the answer is always proved. ``gap`` stops every phase at that relative gap.

The run's bookkeeping — clock, best plan, bounds, the answer — is state.py: every plan is
expanded to the original nodes (Core.expand) and evaluated exactly on the original problem
before it is reported (events.py).

With a time limit T, ``solve`` returns within T even on a loaded machine: the phases work to a
deadline a finishing reserve earlier (state.py: stopping the engines and z3, evaluating and
returning the answer fit in it); the reductions take at most REDUCE_SHARE of the time; the
search phases keep the deadline (portfolio.py says how). How far each phase ran past the
deadline is kept in ``Solution.overruns``. Only the first plan (the minimum-memory start) is
made whatever the time: it comes early even on 60k-node instances.
"""

from __future__ import annotations

import time

import numpy as np

from autoshard.errors import AutoshardError
from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver.core.reduced import Core
from autoshard.solver.model.events import EventCallback, Reduced, Started
from autoshard.solver.core.rows import attach_memory, smallest_peak
from autoshard.solver.engines.cegis import objective_size
from autoshard.solver.run.portfolio import Portfolio
from autoshard.solver.run.state import RunState
from autoshard.solver.run.z3_phases import Z3Phases
from autoshard.solver.core.reduce import NoAssignment, Size, reduce_core
from autoshard.solver.model.solution import InfeasibleError, Solution, SolveOptions

__all__ = ["InfeasibleError", "Solution", "SolveOptions", "solve"]

REDUCE_SHARE = 0.4
"""At most this share of the time limit goes to the exact reductions (a partly reduced core is
still exact; the first plan must come early on large instances)."""


def solve(
    problem: ShardingProblem,
    options: SolveOptions | None = None,
    on_event: EventCallback | None = None,
) -> Solution:
    """Find the cheapest plan of ``problem`` (anytime); raise InfeasibleError when none exists."""
    return _Run(problem, options or SolveOptions(), on_event or (lambda event: None)).run()


class _Run:
    """One call of ``solve``: validate, reduce, search (portfolio.py), answer (state.py)."""

    def __init__(self, problem: ShardingProblem, options: SolveOptions, emit: EventCallback) -> None:
        self.state = RunState(problem, options, emit)

    def run(self) -> Solution:
        """Validate, reduce, search, and return (or raise) the answer."""
        state = self.state
        p = state.problem
        p.validate()
        state.emit(
            Started(p.name, p.num_nodes, len(p.edges), sum(len(c) for c in p.node_costs), p.usage_limit)
        )
        self._check_peak()
        began = time.monotonic()
        state.core = Core(p)
        attach_memory(state.core, p)
        state.set_reserve(time.monotonic() - began)
        before = Size.of(state.core)
        try:
            if state.options.reduce:
                with state.timed("reductions"):
                    state.counts = dict(reduce_core(state.core, state.share(REDUCE_SHARE)))
        except NoAssignment as err:
            return state.infeasible(self._no_assignment_message(err))
        state.comp = state.core.freeze()
        state.size = Size.of(state.core)
        rows = 0 if state.comp.capacity is None else len(state.comp.capacity)
        state.emit(
            Reduced(before.nodes, before.edges, before.strategies, state.size.nodes, state.size.edges,
                    state.size.strategies, rows, dict(state.counts), state.elapsed())
        )
        if state.comp.n == 0:
            state.offer([], "reductions", None)
            state.proof = "reductions"
            state.bound(state.best_cost, "reductions")
        elif state.options.warm_start:
            Portfolio(self.state).warm_search()
        elif state.options.prove:
            Z3Phases(self.state).alone()
        if state.best is None and state.proof is None and state.options.warm_start and state.options.prove \
                and not state.out_of_time():
            Z3Phases(self.state).alone()  # the engines found no plan and proved nothing: z3 decides whether one exists
        if state.best is None:
            if state.proof is not None:  # z3 UNSAT, an infeasible LP, or an exact minimum that is forbidden
                return state.infeasible(self._unsat_message())
            if state.options.timeout is not None and state.out_of_time():
                raise AutoshardError(f"no plan found within the time limit of {state.options.timeout:g}s: raise the timeout")
            if not state.options.warm_start:
                raise AutoshardError(
                    f"no plan found: z3 alone does not take a core of {state.comp.n} nodes "
                    f"({objective_size(state.comp)} weighted literals); keep the warm start on"
                )
            if not state.options.prove:
                raise AutoshardError("no plan found by the heuristics: let z3 run (drop --no-prove) or give more time")
            raise AutoshardError(
                f"no plan found and none proved impossible on the {state.comp.n}-node core (z3 gave no verdict): "
                "raise the memory budget, or --timeout if one is set"
            )
        return state.finish()

    def _check_peak(self) -> None:
        """Fail fast when even the smallest-memory strategies overflow the limit."""
        state = self.state
        limit = state.problem.usage_limit
        if limit is None:
            return
        peak = smallest_peak(state.problem)
        if peak.value > limit:
            what = "is" if peak.exact else "is at least"
            raise state.infeasible_error(
                f"memory limit {limit} is infeasible: the smallest achievable peak {what} {peak.value} "
                f"(at time {peak.time}); raise the usage limit / memory budget to at least {peak.value}"
            )

    def _no_assignment_message(self, err: NoAssignment) -> str:
        state = self.state
        if err.memory:
            capacity = state.core.capacity
            if err.node < 0 and capacity is not None and len(capacity):
                limit = state.problem.usage_limit
                row = int(np.argmin(capacity))
                peak = limit - int(capacity[row])
                return (
                    f"memory limit {limit} is infeasible: the smallest achievable peak is at least {peak} "
                    f"(at time {int(state.core.row_times[row])}); raise the usage limit / memory budget to at least {peak}"
                )
            return self._unsat_message()
        return (
            f"no plan exists: every strategy of node {state.problem.node_name(err.node)} is forbidden or conflicts "
            "with all strategies of a neighbour; allow more strategies (or fewer pins) for it"
        )

    def _unsat_message(self) -> str:
        limit = self.state.problem.usage_limit
        if limit is None:
            return "no plan avoids the forbidden strategy pairs; allow more strategies (or fewer pins)"
        return (
            f"memory limit {limit} is infeasible: no plan fits (proved exhaustively: the smallest achievable "
            f"peak is at least {limit + 1}); raise the usage limit / memory budget"
        )
