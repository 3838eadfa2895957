"""``solve``: exact reductions, warm start, z3 CEGIS — anytime, with a proven lower bound.

The problem (problem.py):

    minimise   sum_i c_i[s_i] + sum_{(u,v)} m_uv[s_u, s_v]
    subject to sum_{i live at t} usage_i[s_i] <= limit   for every time t,   no cost >= FORBIDDEN

Pipeline and where each part lives:

1. ``reduce.reduce_core``: exact reductions (dominated/forbidden strategies, folding, functional
   merging with memory carried, degree-0/1/2 elimination of memory-free nodes, parallel edges);
   ``memory.py`` puts the memory constraint on compressed rows.
2. warm start on the core (``warm_start=True``): without memory, exact variable elimination when
   the core is narrow enough (eliminate.py) — done, proved. Otherwise a minimum-memory plan
   polished by local search (heuristics.py), then exact engines in child processes, one per
   core (workers.py), chosen by what the core is:
   - memory rows small enough for toulbar2 (toulbar.can_take; no rows at all included): the LP
     relaxation first when small (on B and G it is integral), then toulbar2's branch and bound
     (proves) beside its neighbourhood search (plans) — ``_toulbar_search``;
   - otherwise, an ILP of at most MILP_MAX_COLUMNS: HiGHS's MILP (proves) and toulbar2 without
     the memory rows (bounds; its optimum, if it fits, is optimal), while this process runs the
     LP bound, z3 and the Lagrangian relaxation of memory solved by elimination or TRW-S
     (lagrange.py, trws.py) with large-neighbourhood search when it stalls (lns.py);
   - otherwise (S: 59 million row terms) the same Lagrangian search here and a second one with
     its own seed in a child.
3. z3 CEGIS (cegis.py) on the core: "is there any plan with cost < best?"; each SAT is a better
   plan, UNSAT proves the best optimal. It gets the LP's (or TRW-S's) dual as a redundant cut
   (cut.py), without which z3 rarely proves anything. When another method has proved the
   optimum, z3 is asked once more (``_z3_certificate``, cores of at most Z3_CERTIFY_MAX_TERMS
   literals) and its UNSAT is the proof shown; ``Solution.proof_times`` has both times.
4. without a time limit, a core still unproved is solved as an ILP by HiGHS to a zero gap
   (milp.py): the answer is always proved. ``gap`` stops every phase at that relative gap.

Every plan is expanded to the original nodes (Core.expand) and evaluated exactly on the
original problem before it is reported (events.py).

With a time limit T, ``solve`` returns within T even on a loaded machine: the phases work to a
deadline a finishing reserve earlier (FINISH_RESERVE: stopping the engines and z3, evaluating
and returning the answer fit in it); the reductions take at most REDUCE_SHARE of the time; every
loop checks the deadline; the C code that does not (HiGHS's LP with its set-up) runs in a child
process killed at the deadline (workers.call_forked); steps that can neither be cut nor killed
(the Lagrangian set-up, reading a bound and plan off TRW-S) start only when the time measured
for comparable work fits. How far each phase ran past the deadline is kept in
``Solution.overruns``. Only the first plan (the minimum-memory start) is made whatever the time:
it comes early even on 60k-node instances.
"""

from __future__ import annotations

import contextlib
import queue
import time
from typing import Callable, Iterator

import numpy as np

from autoshard.errors import AutoshardError
from autoshard.problem import ShardingProblem
from autoshard.solver.cegis import CheckResult, Z3Search, Z3Worker
from autoshard.solver.core import Compact, Core
from autoshard.solver.cut import DualCut
from autoshard.solver.events import Checked, Finished, Improved, LowerBound, Phase, Reduced, Started
from autoshard.solver.eliminate import EliminationPlan
from autoshard.solver.heuristics import Search, min_memory_start
from autoshard.solver.lagrange import LagrangianSearch
from autoshard.solver.lns import NeighbourhoodSearch
from autoshard.solver.memory import attach_memory, smallest_peak
from autoshard.solver.milp import solve_compact_milp
from autoshard.solver.reduce import NoAssignment, Size, reduce_core
from autoshard.solver.relax import MAX_COLUMNS as LP_MAX_COLUMNS
from autoshard.solver.relax import Relaxation, lp_bound, lp_columns
from autoshard.solver.solution import InfeasibleError, Solution, SolveOptions
from autoshard.solver.toulbar import can_take
from autoshard.solver.workers import EngineEvent, EngineWorker, call_forked

Z3_MAX_TERMS = 200_000
"""Cores whose z3 encoding would have more weighted literals are left to the heuristics."""
LNS_AFTER_STEPS = 30
"""Lagrangian steps without a better plan before a slice of neighbourhood search."""
LNS_SLICE = 5.0
"""Seconds of neighbourhood search per slice (or LNS_SHARE of the time left, if more)."""
LNS_SHARE = 0.5
"""Share of the time left a slice of neighbourhood search takes (V: LNS finds what the
Lagrangian search, stalled within seconds, cannot)."""
LP_FIRST_COLUMNS = 100_000
"""Cores whose LP has at most this many variables get the LP before toulbar2 (B: 48k columns,
0.7 s; run beside toulbar2's two processes it took 3-4 s)."""
MILP_MAX_COLUMNS = 1_000_000
"""Cores whose ILP has at most this many variables get HiGHS's MILP in a child process beside the
Lagrangian search (LLaMA-3-8B with 80 GiB: 27k columns proved in 5 s on 8 devices, 510k in 65 s
on 2x8, where the Lagrangian search alone ended 1e-7 short of a proof)."""
Z3_CONFIRM = 0.5
"""After another method proved the optimum, z3 gets this share of the time so far to certify it."""
Z3_CONFIRM_MIN = 2.0
"""... and at least this many seconds."""
Z3_CERTIFY_MAX_TERMS = 100_000
"""Cores with more weighted literals are not given to z3 for the certificate: on IOPDDL B (36k)
it answers UNSAT in under a second; on LLaMA-3-8B 8x8 (160k) it had no verdict after 120 s even
with a TRW-S cut 4e-7 below the optimum."""
FINISH_RESERVE = 0.15
"""Seconds of a time limit kept for the end (stopping the engines and z3, the exact evaluation of
the answer, returning and freeing the search's objects), plus FINISH_PER_BUILD times the time
building the problem's Core took (the same kind of work and size: on S, 0.6 s to build it; stopping,
evaluating and freeing took 0.25 s), and at most FINISH_SHARE of the limit."""
FINISH_PER_BUILD = 0.5
FINISH_SHARE = 0.1
TEARDOWN_SHARE = 0.5
"""Stopping the engines and z3 waits for them at most this share of the reserve."""
LP_MIN_TIME = 0.3
"""Seconds below which the LP is not tried (lp_bound needs 0.2 s after building the model)."""
LP_GRACE = 0.5
"""Seconds the LP child gets past its own time limit (HiGHS's set-up, and scipy's, run past it)
before it is killed."""
LAGRANGE_SETUP = 1.0
"""The Lagrangian search starts only with this many times the greedy phase's time left: its
set-up (TRW-S's messages, the first plan's local search) is work of the same kind and size, and
measured on this machine, so it scales with the load (4000 nodes: 0.1 s quiet, 0.4 s under load,
greedy 0.2 and 0.5 s)."""
REDUCE_SHARE = 0.4
"""At most this share of the time limit goes to the exact reductions (a partly reduced core is
still exact; the first plan must come early on large instances)."""


def solve(
    problem: ShardingProblem,
    options: SolveOptions | None = None,
    on_event: Callable[[object], None] | None = None,
) -> Solution:
    """Find the cheapest plan of ``problem`` (anytime); raise InfeasibleError when none exists."""
    return _Run(problem, options or SolveOptions(), on_event or (lambda event: None)).run()


class _Run:
    """One call of ``solve``: the clock, the best plan and bound, and the events."""

    def __init__(self, problem: ShardingProblem, options: SolveOptions, emit: Callable[[object], None]) -> None:
        self.problem, self.options, self.emit = problem, options, emit
        self.start = time.monotonic()
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
        self.iterations = 0
        self.improvements = 0
        self.greedy_time = 0.0
        self.size = Size(0, 0, 0)
        self.counts: dict[str, int] = {}
        self.proof_times: dict[str, float] = {}
        self.cut: DualCut | None = None

    # -- bookkeeping -------------------------------------------------------------------------
    def elapsed(self) -> float:
        """Seconds since solve() started."""
        return time.monotonic() - self.start

    def left(self) -> float | None:
        """Seconds left (None without a time limit)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def out_of_time(self) -> bool:
        """True once the time limit has passed."""
        return self.deadline is not None and time.monotonic() >= self.deadline

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

    def offer(self, local: np.ndarray | list[int], source: str, bound: int | None) -> bool:
        """Report a core plan if it beats the best (evaluated exactly on the original problem)."""
        local = np.asarray(local, dtype=np.int64)
        if self.comp.cost(local) >= (self.best_cost if self.best_cost is not None else 2**200):
            return False
        choice = self.core.expand({v: int(s) for v, s in zip(self.comp.nodes, local)})
        ev = self.problem.evaluate(choice)
        if not ev.feasible or (self.best_cost is not None and ev.cost >= self.best_cost):
            return False
        self.best, self.best_cost, self.best_local = choice, ev.cost, local
        self.improvements += 1
        peak = ev.peak if self.problem.usage_limit is not None else None
        self.emit(Improved(self.improvements, ev.cost, tuple(choice), bound, self.elapsed(), source, peak))
        return True

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
    def _timed(self, phase: str) -> Iterator[None]:
        """Record in ``overruns`` how far past the deadline ``phase`` ended (if it did)."""
        try:
            yield
        finally:
            if self.deadline is not None:
                late = time.monotonic() - self.deadline
                if late > self.overruns.get(phase, 0.0):
                    self.overruns[phase] = late

    # -- phases ------------------------------------------------------------------------------
    def run(self) -> Solution:
        """Validate, reduce, search, and return (or raise) the answer."""
        p = self.problem
        p.validate()
        self.emit(
            Started(p.name, p.num_nodes, len(p.edges), sum(len(c) for c in p.node_costs), p.usage_limit)
        )
        self._check_peak()
        began = time.monotonic()
        self.core = Core(p)
        attach_memory(self.core, p)
        if self.limit is not None:
            reserve = FINISH_RESERVE + FINISH_PER_BUILD * (time.monotonic() - began)
            self.deadline = self.limit - min(reserve, FINISH_SHARE * self.options.timeout)
            self.teardown_by = self.deadline + TEARDOWN_SHARE * (self.limit - self.deadline)
        before = Size.of(self.core)
        try:
            if self.options.reduce:
                with self._timed("reductions"):
                    self.counts = dict(reduce_core(self.core, self._share(REDUCE_SHARE)))
        except NoAssignment as err:
            return self._infeasible(self._no_assignment_message(err))
        self.comp = self.core.freeze()
        self.size = Size.of(self.core)
        rows = 0 if self.comp.capacity is None else len(self.comp.capacity)
        self.emit(
            Reduced(before.nodes, before.edges, before.strategies, self.size.nodes, self.size.edges,
                    self.size.strategies, rows, dict(self.counts), self.elapsed())
        )
        if self.comp.n == 0:
            self.offer([], "reductions", None)
            self.proof = "reductions"
            self.bound(self.best_cost, "reductions")
        elif self.options.warm_start:
            self._warm_search()
        elif self.options.prove:
            self._cegis_alone()
        if self.best is None:
            if self.proof is not None:  # z3 UNSAT, an infeasible LP, or an exact minimum that is forbidden
                return self._infeasible(self._unsat_message())
            if self.options.timeout is not None and self.out_of_time():
                raise AutoshardError(f"no plan found within the time limit of {self.options.timeout:g}s: raise the timeout")
            if not self.options.warm_start:
                raise AutoshardError(
                    f"no plan found: z3 alone does not take a core of {self.comp.n} nodes "
                    f"({_objective_size(self.comp)} weighted literals); keep the warm start on"
                )
            raise AutoshardError("no plan found by the heuristics: let z3 run (drop --no-prove) or give more time")
        return self._finish()

    def _check_peak(self) -> None:
        """Fail fast when even the smallest-memory strategies overflow the limit."""
        limit = self.problem.usage_limit
        if limit is None:
            return
        peak = smallest_peak(self.problem)
        if peak.value > limit:
            what = "is" if peak.exact else "is at least"
            raise self._infeasible_error(
                f"memory limit {limit} is infeasible: the smallest achievable peak {what} {peak.value} "
                f"(at time {peak.time}); raise the usage limit / memory budget to at least {peak.value}"
            )

    def _warm_search(self) -> None:
        """Exact elimination when the core is narrow and memory-free; else the greedy start, then
        the engines the core calls for (module docstring, step 2) with z3 alongside."""
        comp = self.comp
        plan = EliminationPlan(comp, deadline=self._soon(min(5.0, 0.05 * self.left()) if self.deadline else 5.0))
        if plan.feasible and not comp.has_memory:
            self.emit(Phase("elimination", f"variable elimination on {comp.n} core nodes "
                            f"(largest table {plan.largest})", self.elapsed()))
            x, value = plan.solve()
            self.offer(x, "elimination", None)
            self.proof = "elimination"
            self.bound(int(value), "elimination")
            return
        with self._timed("heuristic"):
            self._greedy()
        if self.options.toulbar and can_take(comp):
            self._toulbar_search()
            return
        engines = []
        if self.options.prove and lp_columns(comp) <= MILP_MAX_COLUMNS and not self.finished():
            relaxed = ["relaxed"] if self.options.toulbar and can_take(comp, rows=False) else []
            engines = self._start_engines(["milp"] + relaxed, "HiGHS's MILP of the core, toulbar2 on it without "
                                          "memory rows (child processes)")
        elif not self.finished():
            engines = self._start_engines(["lagrange"], "a second Lagrangian search (child process, own seed)")
        try:
            cut = self._lp_phase(engines)
            z3_thread = self._start_z3(cut) if self.options.prove and cut is not None and not self.finished() else None
            if not self.finished():
                with self._timed("lagrange"):
                    z3_thread = self._lagrangian(z3_thread, plan, engines)
            if z3_thread is not None:
                with self._timed("z3"):
                    z3_thread.stop(self.teardown_by)
                self._drain(z3_thread)
            if engines and self.deadline is None:
                self._await(engines)
        finally:
            self._stop(engines)
        if not self.finished() and self.deadline is None and self.options.prove and not any(e.exact for e in engines):
            self._milp_proof()

    def _greedy(self) -> None:
        """The first plan: minimum-memory start, repaired to fit, polished by local search."""
        comp = self.comp
        self.emit(Phase("heuristic", f"local search on {comp.n} core nodes", self.elapsed()))
        began = time.monotonic()
        search = Search(comp, min_memory_start(comp), self.rng)
        if not search.feasible:
            search.repair(self._soon(max(5.0, 0.5 * self.left()) if self.deadline else 5.0))
        if search.feasible:
            search.descend(self._soon(5.0))
            self.offer(search.x, "greedy", None)
        self.greedy_time = time.monotonic() - began  # a first guess of a Lagrangian step's length

    def _toulbar_search(self) -> None:
        """The LP relaxation first on small cores (on B and G it is integral: plan and proof in a
        second); then toulbar2 searches the core in two child processes (one per core) from the
        best plan's cost: hybrid best-first branch and bound, which proves, and variable-
        neighbourhood search, which often finds the good plans sooner on wide cores. Then z3's
        CEGIS certifies the optimum (``_z3_certificate``)."""
        if self.options.prove and lp_columns(self.comp) <= LP_FIRST_COLUMNS:
            self.cut = self._lp_phase()  # a bound, often the plan (B, G), and z3's cut
        engines = [] if self.finished() else self._start_engines(
            ["hbfs", "vns"], "toulbar2: branch and bound + neighbourhood search (child processes)")
        try:
            self._await(engines)
        finally:
            self._stop(engines)
        if self.options.prove and self.proof is None and self.best is not None and self.proved():
            self._z3_certificate()
        if not self.finished() and self.deadline is None and self.options.prove:
            self._milp_proof()

    def _start_engines(self, methods: list[str], what: str) -> list[EngineWorker]:
        """Fork one child per exact engine (workers.py), each told the best cost so far."""
        self.emit(Phase(methods[0], f"{what} on {self.comp.n} core nodes", self.elapsed()))
        plan = None if self.best_local is None else self.best_local.tolist()
        engines = [EngineWorker(self.comp, m, self.best_cost, self.options.gap, self.options.seed + 1 + k, plan)
                   for k, m in enumerate(methods)]
        for engine in engines:
            engine.start()
        return engines

    def _poll(self, engines: list[EngineWorker], wait: float) -> None:
        """Take in what the engines reported (waiting up to ``wait`` s on the first). Of the plans
        an engine reported since the last look only the cheapest is offered: each offer is
        evaluated on the original problem (20 ms on G), and toulbar2's search can print dozens a
        second."""
        for k, engine in enumerate(engines):
            events = engine.poll(wait if k == 0 else 0.0)
            plans = [e for e in events if e.kind == "plan"]
            cheapest = min(plans, key=lambda e: e.cost) if plans else None
            for event in events:
                if event.kind != "plan" or event is cheapest:
                    self._engine_event(event, engine)

    def _await(self, engines: list[EngineWorker]) -> None:
        """Wait for the exact engines until finished, out of time or all of them ended."""
        while engines and not self.out_of_time() and not self.finished():
            if all(e.done for e in engines if e.exact):
                break
            left = self.left()
            self._poll(engines, 0.05 if left is None else max(0.0, min(0.05, left)))
        self._poll(engines, 0.0)

    def _stop(self, engines: list[EngineWorker]) -> None:
        """Kill the engines, taking in what they said after the last look (within the limit)."""
        with self._timed("engines"):
            for engine in engines:
                engine.stop(self.teardown_by)
            self._poll(engines, 0.0)

    def _engine_event(self, event: EngineEvent, engine: EngineWorker) -> None:
        """A plan from any engine; bounds and proofs only from the exact ones."""
        source = {"milp": "milp", "lagrange": "lagrange2"}.get(engine.method, "toulbar2")
        if event.kind == "plan":
            self.offer(event.choice, source, None)
        elif not engine.bounds:
            return
        elif event.kind in ("bound", "optimal"):
            self.bound(event.cost, source)
        elif event.kind == "none" and engine.upper is not None:
            self.bound(engine.upper, source)  # no plan below the cost it was given
        elif event.kind == "none":
            self.proof = source  # no plan at all

    def _z3_certificate(self) -> None:
        """z3 asked for a plan cheaper than the proved optimum, with the best cut we have, for
        Z3_CONFIRM of the time so far (at least Z3_CONFIRM_MIN s, within the limit): its UNSAT is
        the certificate the user sees; otherwise the proof stays the other method's."""
        if _objective_size(self.comp) > Z3_CERTIFY_MAX_TERMS:
            self.emit(Phase("z3", "core too large for a z3 certificate", self.elapsed()))
            return
        cut = self.cut or self._z3_cut()
        until = self._soon(max(Z3_CONFIRM_MIN, Z3_CONFIRM * self.elapsed()))
        thread = self._start_z3(cut)
        if thread is None:
            return
        thread.deadline = until
        with self._timed("z3"):
            thread.join_until(until)
            thread.stop(self.teardown_by)
        self._drain(thread)

    def _z3_cut(self) -> DualCut | None:
        """The cut z3 gets: the LP's when the core's LP is small enough, else TRW-S's after a
        few sweeps (both valid lower bounds, see cut.py)."""
        if lp_columns(self.comp) <= LP_MAX_COLUMNS:
            return self._lp_phase()
        lag = LagrangianSearch(self.comp, self.rng)
        deadline = self._soon(2.0)
        for _ in range(10):
            if not lag.mp.sweep(lag.penalties(), deadline):
                break
        return lag.cut()

    def _milp_proof(self) -> None:
        """Without a time limit the answer must be proved: when z3 could not take the core (too
        many weighted literals) or stopped without a verdict, HiGHS solves the core's ILP to a zero gap."""
        self.emit(Phase("milp", f"exact ILP of the {self.comp.n}-node core (HiGHS, zero gap)", self.elapsed()))
        result = solve_compact_milp(self.comp, exact=True)
        if result.choice is not None:
            self.offer(result.choice, "milp", None)
        if result.optimal and result.cost is not None:
            self.bound(int(result.cost), "milp")

    def _lp_phase(self, engines: list[EngineWorker] | None = None) -> DualCut | None:
        """LP relaxation: a certified bound, sometimes the optimal plan, and a cut for z3. It runs
        in a child process killed at its time (building the model and HiGHS's set-up ignore the
        time limit: 1.4 s on a 200k-column core under load); meanwhile the engines are heard."""
        left = self.left()
        budget = 60.0 if left is None else min(60.0, 0.3 * left)
        comp = self.comp
        if lp_columns(comp) > LP_MAX_COLUMNS or budget < LP_MIN_TIME:
            relax = lp_bound(comp, 0.0)  # only the instant infeasibility check
        else:
            self.emit(Phase("lp", "LP relaxation of the core (HiGHS, child process)", self.elapsed()))

            def heard() -> bool:
                self._poll(engines or [], 0.0)
                return self.finished()

            with self._timed("lp"):
                relax = call_forked(lambda: lp_bound(comp, budget), self._soon(budget + LP_GRACE), heard)
            relax = relax or Relaxation(None, None, 0.0)
        if relax.infeasible:
            self.proof = "lp"
            return None
        if relax.plan is not None:
            self.offer(relax.plan, "lp", None)
        self.bound(relax.bound, "lp")
        return relax.cut

    def _lagrangian(
        self, z3_thread: Z3Worker | None, plan: EliminationPlan, engines: list[EngineWorker]
    ) -> Z3Worker | None:
        """Lagrangian/TRW-S steps until proved or out of time; without an LP cut, z3 starts after
        a warm-up with the TRW-S cut instead. Returns the z3 thread (if any) for the caller to stop."""
        comp = self.comp
        memory = comp.has_memory
        if self.deadline is not None and self.left() < LAGRANGE_SETUP * self.greedy_time:
            return z3_thread  # its set-up (which cannot be cut short) would overrun the time limit
        self.emit(Phase("lagrange", "TRW-S on the Lagrangian relaxation of memory" if memory else "TRW-S", self.elapsed()))
        lag = LagrangianSearch(comp, self.rng, plan=plan)
        stale, last, steps, last_step = 0, (self.best_cost, self.lower), 0, self.greedy_time
        lns, since = NeighbourhoodSearch(comp, self.rng), (self.best_cost, time.monotonic(), 0)
        warmup = self._soon(min(30.0, 0.1 * self.left()) if self.deadline is not None else 10.0)
        wants_z3 = z3_thread is None and self.options.prove
        if wants_z3 and _objective_size(comp) > Z3_MAX_TERMS:  # say so now, before building a cut (S: 2.7 s)
            wants_z3 = False
            self.emit(Phase("z3", "core too large for z3; heuristics only", self.elapsed()))
        while not self.out_of_time() and not self.finished():
            if self.deadline is not None and self.left() < last_step:
                break  # another step would overrun the time limit
            steps += 1
            if wants_z3 and (steps > 200 or time.monotonic() >= warmup):
                wants_z3 = False
                z3_thread = self._start_z3(lag.cut())
            began = time.monotonic()
            result = lag.step(self.best_cost, self._soon(30.0))
            last_step = time.monotonic() - began
            if result.plan is not None:
                self.offer(result.plan, "lagrange", None)
            self.bound(result.bound, "lagrange")
            self._poll(engines, 0.0)
            if z3_thread is not None:
                z3_thread.bound = self.best_cost
                self._drain(z3_thread)
                if z3_thread.done and self.deadline is None:
                    break
            stale = stale + 1 if (self.best_cost, self.lower) == last else 0
            last = (self.best_cost, self.lower)
            since = (self.best_cost, time.monotonic(), 0) if self.best_cost != since[0] else (*since[:2], since[2] + 1)
            if self._lns_due(since, last_step):
                self._lns(lns)
                since = (self.best_cost, time.monotonic(), 0)
            if self.deadline is None and stale >= 200 and not wants_z3 and (z3_thread is None or z3_thread.done):
                break
        if z3_thread is not None and self.deadline is None and not self.finished():
            z3_thread.join_until(None)
            self._drain(z3_thread)
        return z3_thread

    def _lns_due(self, since: tuple[int | None, float, int], last_step: float) -> bool:
        """True when the Lagrangian plans have not improved the best for LNS_AFTER_STEPS steps
        and twenty steps' time (and there is a plan to improve)."""
        _, when, steps = since
        waited = time.monotonic() - when
        return self.best_local is not None and steps >= LNS_AFTER_STEPS and waited >= max(2.0, 20 * last_step)

    def _lns(self, lns: NeighbourhoodSearch) -> None:
        """A slice of large-neighbourhood search from the best plan (lns.py)."""
        left = self.left()
        if left is not None and left < 2.0:
            return
        budget = LNS_SLICE if left is None else min(left, max(LNS_SLICE, LNS_SHARE * left))
        self.emit(Phase("lns", f"HiGHS on neighbourhoods of {lns.size} core nodes", self.elapsed()))
        with self._timed("lns"):
            x = lns.run(self.best_local, self._soon(budget))
        self.offer(x, "lns", None)
        self.emit(Phase("lagrange", "back to the Lagrangian search", self.elapsed()))

    def _start_z3(self, cut: DualCut | None) -> Z3Worker | None:
        if _objective_size(self.comp) > Z3_MAX_TERMS:
            self.emit(Phase("z3", "core too large for z3; heuristics only", self.elapsed()))
            return None
        with_cut = f" with a dual cut (bound {cut.const})" if cut is not None else ""
        self.emit(Phase("z3", f"z3 CEGIS on {self.comp.n} core nodes{with_cut} (background)", self.elapsed()))
        thread = Z3Worker(self.comp, self.deadline, cut)
        thread.bound = self.best_cost
        thread.start()
        return thread

    def _drain(self, thread: Z3Worker) -> None:
        """Turn the z3 thread's answers into events (the callback runs on this thread only)."""
        while True:
            try:
                bound, result = thread.results.get_nowait()
            except queue.Empty:
                return
            self._z3_answer(bound, result)

    def _z3_answer(self, bound: int | None, result: CheckResult) -> None:
        self.iterations += 1
        self.emit(Checked(self.iterations, bound, result.result, self.elapsed()))
        if result.result == "sat":
            self.offer(result.choice, "z3", bound)
        elif result.result == "unsat":
            if bound is None or (self.best_cost is not None and bound >= self.best_cost):
                self.proof = "z3"
                self.proof_times.setdefault("z3", self.elapsed())
            if bound is not None:
                self.bound(bound, "z3")

    def _cegis_alone(self) -> None:
        """z3 on its own: ask for any plan, then any plan cheaper than the last, until UNSAT."""
        if _objective_size(self.comp) > Z3_MAX_TERMS:
            self.emit(Phase("z3", "core too large for z3", self.elapsed()))
            return
        self.emit(Phase("z3", f"z3 CEGIS on {self.comp.n} nodes", self.elapsed()))
        z3s = Z3Search(self.comp)
        while not self.out_of_time() and not self.proved():
            bound = self.best_cost
            result = z3s.check(bound, self.left())
            self._z3_answer(bound, result)
            if result.result != "sat":
                break

    # -- endings -------------------------------------------------------------------------------
    def _share(self, fraction: float) -> float | None:
        """The deadline after ``fraction`` of the time left (None without a limit)."""
        return None if self.deadline is None else time.monotonic() + fraction * self.left()

    def _soon(self, seconds: float) -> float:
        t = time.monotonic() + seconds
        return t if self.deadline is None else min(t, self.deadline)

    def _solution(self, status: str, message: str) -> Solution:
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
            proof=self._proof_name() if status == "optimal" else None,
            message=message,
            core_nodes=self.size.nodes,
            core_edges=self.size.edges,
            core_rows=rows,
            reductions=dict(self.counts),
            proof_times=dict(self.proof_times) if status == "optimal" else {},
            overruns=dict(self.overruns),
        )

    def _proof_name(self) -> str:
        """Who proved optimality: z3's UNSAT, the reductions, or the source of a matching bound."""
        if "z3" in self.proof_times:
            return "z3"
        return self.proof or self.lower_source or "lower bound"

    def _finish(self) -> Solution:
        solution = self._solution("optimal" if self.proved() else "feasible", "")
        self.emit(Finished(solution))
        return solution

    def _infeasible(self, message: str) -> Solution:
        raise self._infeasible_error(message)

    def _infeasible_error(self, message: str) -> InfeasibleError:
        solution = self._solution("infeasible", message)
        self.emit(Finished(solution))
        return InfeasibleError(message, solution)

    def _no_assignment_message(self, err: NoAssignment) -> str:
        if err.memory:
            capacity = self.core.capacity
            if err.node < 0 and capacity is not None and len(capacity):
                limit = self.problem.usage_limit
                row = int(np.argmin(capacity))
                peak = limit - int(capacity[row])
                return (
                    f"memory limit {limit} is infeasible: the smallest achievable peak is at least {peak} "
                    f"(at time {int(self.core.row_times[row])}); raise the usage limit / memory budget to at least {peak}"
                )
            return self._unsat_message()
        return (
            f"no plan exists: every strategy of node {self.problem.node_name(err.node)} is forbidden or conflicts "
            "with all strategies of a neighbour; allow more strategies (or fewer pins) for it"
        )

    def _unsat_message(self) -> str:
        limit = self.problem.usage_limit
        if limit is None:
            return "no plan avoids the forbidden strategy pairs; allow more strategies (or fewer pins)"
        return (
            f"memory limit {limit} is infeasible: no plan fits (proved exhaustively: the smallest achievable "
            f"peak is at least {limit + 1}); raise the usage limit / memory budget"
        )


def _objective_size(comp: Compact) -> int:
    """Weighted literals z3 would need: nonzero edge entries plus strategies."""
    return sum(int(np.count_nonzero(m)) for _, _, m in comp.edges) + sum(len(c) for c in comp.costs)
