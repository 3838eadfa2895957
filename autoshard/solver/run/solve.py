"""One ``solve`` call, top to bottom: check, build, reduce, search, answer.

The problem (model/problem.py):

    minimise   sum_i c_i[s_i] + sum_{(u,v)} m_uv[s_u, s_v]
    subject to sum_{i live at t} usage_i[s_i] <= limit   for every time t,   no cost >= FORBIDDEN

1. ``check``: the problem is valid, and even its smallest-memory strategies fit the limit.
2. ``build``: the working ``Core`` with the memory constraint on compressed rows (core/rows.py);
   the finishing reserve is set from the time this took (state.py).
3. ``reduce``: exact reductions to a fixpoint (core/reduce.py: dominated and forbidden strategies,
   folding, functional merging with memory carried, degree-0/1/2 elimination, parallel edges),
   in at most REDUCE_SHARE of the limit; then the core is frozen.
4. ``search``: with the warm start, the portfolio on the core (portfolio.py: exact elimination,
   local search, engines in child processes, the LP and Lagrangian bounds, z3 CEGIS beside them
   and its certificate of another method's optimum, HiGHS's exact ILP without a limit); without
   it, z3 alone (z3_phases.py). When the engines found no plan and proved nothing, z3 decides
   whether one exists.
5. ``answer``: the best plan, expanded to the original nodes and evaluated exactly on the
   original problem (state.py), or the error that says why there is none and what to change.

With a time limit T, ``solve`` returns within T even on a loaded machine: the phases work to a
deadline a finishing reserve earlier (state.py: stopping the engines and z3, evaluating and
returning the answer fit in it); the reductions take at most REDUCE_SHARE of the time; the
search phases keep the deadline (portfolio.py says how). How far each phase ran past the
deadline is kept in ``Solution.overruns``. Only the first plan (the minimum-memory start) is
made whatever the time: it comes early even on 60k-node instances.
"""

from __future__ import annotations

import numpy as np

from autoshard.errors import AutoshardError
from autoshard.solver.core.reduce import NoAssignment, Size, reduce_core
from autoshard.solver.core.reduced import Core
from autoshard.solver.core.rows import attach_memory, smallest_peak
from autoshard.solver.engines.cegis import objective_size
from autoshard.solver.model.events import EventCallback, Reduced, Started
from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver.model.solution import Solution, SolveOptions
from autoshard.solver.run.portfolio import Portfolio
from autoshard.solver.run.state import RunState
from autoshard.solver.run.z3_phases import Z3Phases

REDUCE_SHARE = 0.4
"""At most this share of the time limit goes to the exact reductions (a partly reduced core is
still exact; the first plan must come early on large instances)."""


def solve(problem: ShardingProblem, options: SolveOptions, emit: EventCallback) -> Solution:
    """Find the cheapest plan of ``problem`` (anytime); raise InfeasibleError when none exists."""
    state = RunState(problem, options, emit)
    check(state)
    if options.start is not None:
        state.start_from(options.start, "baseline")
    if start_suffices(state):
        return answer(state)
    build(state)
    try:
        reduce(state)
    except NoAssignment as err:
        return state.infeasible(no_assignment_message(state, err))
    if not start_suffices(state):
        search(state)
    return answer(state)


def start_suffices(state: RunState) -> bool:
    """A plan that fits is in hand and the limit has passed: it is the answer, with no further
    work past the limit (freezing a reduced core of 31k nodes and placing the plan on it take
    seconds of their own)."""
    return state.best is not None and state.out_of_time()


def check(state: RunState) -> None:
    """Validate the problem and fail fast when even the smallest-memory strategies overflow the limit."""
    p = state.problem
    p.validate()
    state.emit(Started(p.name, p.num_nodes, len(p.edges), sum(len(c) for c in p.node_costs), p.usage_limit))
    if p.usage_limit is None:
        return
    peak = smallest_peak(p)
    if peak.value > p.usage_limit:
        what = "is" if peak.exact else "is at least"
        raise state.infeasible_error(
            f"memory limit {p.usage_limit} is infeasible: the smallest achievable peak {what} {peak.value} "
            f"(at time {peak.time}); raise the usage limit / memory budget to at least {peak.value}"
        )


def build(state: RunState) -> None:
    """The working Core with its memory rows; the finishing reserve follows the time it took."""
    began = state.clock()
    core = Core(state.problem)
    attach_memory(core, state.problem)
    state.built(core)
    state.set_reserve(state.clock() - began)


def reduce(state: RunState) -> None:
    """Exact reductions (when asked for) within REDUCE_SHARE of the limit, then the frozen core
    (not where :func:`start_suffices`); raises NoAssignment when a node has no strategy left."""
    before = Size.of(state.core)
    counts: dict[str, int] = {}
    if state.options.reduce:
        with state.timed("reductions"):
            counts = dict(reduce_core(state.core, state.share(REDUCE_SHARE)))
    if start_suffices(state):
        return
    state.reduced(counts)
    rows = 0 if state.comp.capacity is None else len(state.comp.capacity)
    state.emit(Reduced(before.nodes, before.edges, before.strategies, state.size.nodes, state.size.edges,
                       state.size.strategies, rows, dict(state.counts), state.elapsed()))


def search(state: RunState) -> None:
    """The search on the reduced core: nothing left, the portfolio, or z3 alone; z3 decides when
    the engines found no plan and proved nothing."""
    options = state.options
    if state.comp.n == 0:
        state.offer([], "reductions", None)
        state.proved_by("reductions")
        state.bound(state.best_cost, "reductions")
    elif options.warm_start:
        Portfolio(state).warm_search()
    elif options.prove:
        Z3Phases(state).alone()
    if state.best is None and state.proof is None and options.warm_start and options.prove \
            and not state.out_of_time():
        Z3Phases(state).alone()


def answer(state: RunState) -> Solution:
    """The run's Solution, or the error that says why no plan came and what to change."""
    if state.best is not None:
        return state.finish()
    if state.proof is not None:  # z3 UNSAT, an infeasible LP, or an exact minimum that is forbidden
        return state.infeasible(unsat_message(state))
    options = state.options
    if options.timeout is not None and state.out_of_time():
        raise AutoshardError(f"no plan found within the time limit of {options.timeout:g}s: raise the timeout")
    if not options.warm_start:
        raise AutoshardError(
            f"no plan found: z3 alone does not take a core of {state.comp.n} nodes "
            f"({objective_size(state.comp)} weighted literals); keep the warm start on"
        )
    if not options.prove:
        raise AutoshardError("no plan found by the heuristics: let z3 run (drop --no-prove) or give more time")
    raise AutoshardError(
        f"no plan found and none proved impossible on the {state.comp.n}-node core (z3 gave no verdict): "
        "raise the memory budget, or --timeout if one is set"
    )


def no_assignment_message(state: RunState, err: NoAssignment) -> str:
    """Why the reductions left a node without a strategy, and what to change."""
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
        return unsat_message(state)
    return (
        f"no plan exists: every strategy of node {state.problem.node_name(err.node)} is forbidden or conflicts "
        "with all strategies of a neighbour; allow more strategies (or fewer pins) for it"
    )


def unsat_message(state: RunState) -> str:
    """Why no plan exists, as proved, and what to change."""
    limit = state.problem.usage_limit
    if limit is None:
        return "no plan avoids the forbidden strategy pairs; allow more strategies (or fewer pins)"
    return (
        f"memory limit {limit} is infeasible: no plan fits (proved exhaustively: the smallest achievable "
        f"peak is at least {limit + 1}); raise the usage limit / memory budget"
    )
