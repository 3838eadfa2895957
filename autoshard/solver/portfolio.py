"""The search on the reduced core: which engines run, in which order, and how their plans and
bounds come together (step 2-4 of the pipeline in api.py).

- without memory and narrow enough: exact variable elimination (eliminate.py) — done, proved;
- otherwise a minimum-memory plan polished by local search (heuristics.py), then exact engines
  in child processes, one per core (workers.py), chosen by what the core is:
  - memory rows small enough for toulbar2 (toulbar.can_take; no rows at all included): the LP
    relaxation first when small (on B and G it is integral), then toulbar2's branch and bound
    (proves) beside its neighbourhood search (plans) — ``_toulbar_search``;
  - otherwise toulbar2 on the core without its memory rows for up to RELAXED_ALONE seconds
    (bounds; its optimum, if it fits, is optimal: LLaMA-3-8B on 2x8 at 80 GiB, proved in 1 s,
    where nothing else closed the last 2e-6; stopped sooner once a plan it reported costs less
    than the lower bound, ``_retire``), then in its place HiGHS's MILP (proves) for an ILP of at
    most MILP_MAX_COLUMNS, else (S: 59 million row terms) a second Lagrangian search with its own
    seed, taking turns with toulbar2 on per-node usage weights in place of the rows
    (second_search.py, usage_weights.py); this process runs the LP bound, z3 and the
    Lagrangian relaxation of memory solved by elimination or TRW-S (lagrange.py, trws.py)
    with toulbar2 on its penalised subproblem while that pays (subproblem.py) and
    large-neighbourhood search when it stalls (lns.py);
- z3 CEGIS (cegis.py, run by z3_phases.py) beside them, with the LP's or TRW-S's dual as a cut,
  and the z3 certificate of an optimum another method proved (``_z3_certificate``);
- without a time limit, HiGHS's exact ILP of a core still unproved (``_milp_proof``).

Time: every loop checks the deadline; the C code that does not (HiGHS's LP with its set-up)
runs in a child process killed at its time (forks.call_forked); steps that can neither be cut
nor killed (the Lagrangian set-up, reading a bound and plan off TRW-S) start only when the time
measured for comparable work fits.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from autoshard.solver.cegis import Z3Worker
from autoshard.solver.cut import DualCut
from autoshard.solver.eliminate import EliminationPlan
from autoshard.solver.events import EngineFailed, Phase
from autoshard.solver.heuristics import Search, min_memory_start
from autoshard.solver.lagrange import LagrangianSearch
from autoshard.solver.lns import NeighbourhoodSearch
from autoshard.solver.milp import solve_compact_milp
from autoshard.solver.penalised_start import weighted_start
from autoshard.solver.relax import MAX_COLUMNS as LP_MAX_COLUMNS
from autoshard.solver.relax import Relaxation, lp_bound, lp_columns
from autoshard.solver.subproblem import PenalisedProbe
from autoshard.solver.toulbar import can_take
from autoshard.solver.engine_events import EngineEvent
from autoshard.solver.forks import call_forked
from autoshard.solver.workers import EngineWorker
from autoshard.solver.z3_phases import Z3Phases, z3_takes

LNS_AFTER_STEPS = 30
"""Lagrangian steps without a better plan before a slice of neighbourhood search."""
LNS_STALL_SHARE = 0.1
"""... or this share of the time limit and LNS_MIN_STEPS steps without one, whichever comes first:
where Lagrangian steps are slow, thirty of them are a large part of the limit (IOPDDL R: 1.5 s a
step, its plans stalled at 18.7 s and the first slice waited until 65 s, after which every better
plan of the run came from neighbourhood search)."""
LNS_MIN_STEPS = 10
"""The fewest Lagrangian steps without a plan before the share of the limit counts."""
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
RELAXED_ALONE = 10.0
"""Seconds toulbar2 on the core without its memory rows runs before the second engine takes its
processor (LLaMA-3-8B, 2x8, 80 GiB: proved in 1 s; on IOPDDL S, where memory binds, it would only
have slowed the Lagrangian searches)."""
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


class Portfolio(Z3Phases):
    """The search phases of one ``solve`` call on its reduced core ``comp``."""

    waiting: tuple[list[str], str, float] | None = None
    """Engines that take toulbar2-without-rows' place when it ends or at the time given."""
    stopgap: int | None = None
    """The cost of the memory-weighted start's plan (penalised_start.py), when that was the start."""
    lns_paid = False
    """The last slice of neighbourhood search improved the best plan."""

    def _warm_search(self) -> None:
        """Exact elimination when the core is narrow and memory-free; else the greedy start, then
        the engines the core calls for (module docstring, step 2) with z3 alongside."""
        comp = self.comp
        plan = EliminationPlan(comp, deadline=self.soon(min(5.0, 0.05 * self.left()) if self.deadline else 5.0))
        if plan.feasible and not comp.has_memory:
            self.emit(Phase("elimination", f"variable elimination on {comp.n} core nodes "
                            f"(largest table {plan.largest})", self.elapsed()))
            x, value = plan.solve()
            self.offer(x, "elimination", None)
            self.proof = "elimination"
            self.bound(int(value), "elimination")
            return
        with self.timed("heuristic"):
            self._greedy()
        if self.options.toulbar and can_take(comp):
            self._toulbar_search()
            return
        if self.options.prove and lp_columns(comp) <= MILP_MAX_COLUMNS:
            second, what = ["highs"], "HiGHS's MILP of the core (child process)"
        else:
            second, what = ["second-search"], "a second Lagrangian search with usage weights (child process, own seed)"
        if self.finished():
            engines = []
        elif self.options.prove and self.options.toulbar and can_take(comp, rows=False):
            engines = self._start_engines(["toulbar2-no-rows"], "toulbar2 on the core without memory rows (child process)")
            self.waiting = (second, what, time.monotonic() + RELAXED_ALONE)
        else:
            engines = self._start_engines(second, what)
        try:
            # under a time limit the LP is skipped when its cut has no taker (z3 cannot take the
            # core) and HiGHS solves the same LP at its MILP's root anyway: on IOPDDL D and Q it
            # held this process for 6-8 s of a 60 s / 240 s limit
            lp_wanted = self.deadline is None or second != ["highs"] or z3_takes(comp)
            cut = self._lp_phase(engines) if lp_wanted else None
            z3_thread = self._start_z3(cut) if self.options.prove and cut is not None and not self.finished() else None
            if not self.finished():
                with self.timed("lagrange"):
                    z3_thread = self._lagrangian(z3_thread, plan, engines)
            if z3_thread is not None:
                with self.timed("z3"):
                    z3_thread.stop(self.teardown_by)
                self._drain(z3_thread)
            if engines and self.deadline is None:
                self._await(engines)
        finally:
            self._stop(engines)
        if not self.finished() and self.deadline is None and self.options.prove and not any(e.exact for e in engines):
            self._milp_proof()

    def _greedy(self) -> None:
        """The first plan: minimum-memory start, repaired to fit, else TRW-S on memory-weighted
        costs; polished by local search."""
        comp = self.comp
        self.emit(Phase("heuristic", f"local search on {comp.n} core nodes", self.elapsed()))
        began = time.monotonic()
        search = Search(comp, min_memory_start(comp), self.rng)
        if not search.feasible:
            search.repair(self.soon(max(5.0, 0.5 * self.left()) if self.deadline else 5.0))
        stopgap = False
        if not search.feasible:  # groups of nodes that must move together (penalised_start.py)
            search = weighted_start(comp, self.rng, self.soon(min(5.0, 0.2 * self.left()) if self.deadline else 5.0)) \
                or search
            stopgap = True
        if search.feasible:
            search.descend(self.soon(5.0))
            self.offer(search.x, "greedy", None)
            if stopgap:
                self.stopgap = self.best_cost
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
            ["toulbar2", "toulbar2-vns"], "toulbar2: branch and bound + neighbourhood search (child processes)")
        try:
            self._await(engines)
        finally:
            self._stop(engines)
        if self.options.prove and self.proof is None and self.best is not None and self.proved():
            self._z3_certificate(lambda: self.cut or self._z3_cut())
        if not self.finished() and self.deadline is None and self.options.prove:
            self._milp_proof()

    def _start_engines(self, methods: list[str], what: str) -> list[EngineWorker]:
        """Fork one child per exact engine (workers.py), each told the best cost so far."""
        self.emit(Phase(methods[0], f"{what} on {self.comp.n} core nodes", self.elapsed()))
        plan = None if self.best_local is None else self.best_local.tolist()
        # only the lagrange engine calls toulbar2 on its subproblems (penalised costs, no rows)
        toulbar = "second-search" in methods and self.options.toulbar and can_take(self.comp, rows=False)
        engines = [EngineWorker(self.comp, m, self.best_cost, self.options.gap, self.options.seed + 1 + k, plan, toulbar)
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
        self._retire(engines)
        self._hand_over(engines)

    def _retire(self, engines: list[EngineWorker]) -> None:
        """Stop a relaxation's engine once a plan it reported costs less than the proven lower
        bound: the relaxation's optimum is at most that plan, so below every plan that fits, and
        from then on it can neither find a fitting plan nor bound better than the bound we have
        (S: toulbar2 without memory rows plans at ~3.6e8, while the Lagrangian bound passes 9e8
        within 15 s)."""
        for engine in engines:
            if (engine.relaxation and engine.pid is not None and engine.cheapest is not None
                    and self.lower is not None and engine.cheapest < self.lower):
                engine.stop(self.teardown_by)
                self.emit(Phase("lagrange", f"{engine.method} engine stopped: its plans cost less than the "
                                "lower bound, so none of them fits", self.elapsed()))

    def _hand_over(self, engines: list[EngineWorker]) -> None:
        """Once toulbar2 without memory rows has ended (proved its optimum: a bound, or the answer
        when it fits), been retired or had RELAXED_ALONE seconds, the waiting engine takes its
        processor."""
        if self.waiting is None or self.finished():
            return
        methods, what, until = self.waiting
        if not engines[0].done and engines[0].pid is not None and time.monotonic() < until:
            return
        self.waiting = None
        engines[0].stop(self.teardown_by)
        engines.extend(self._start_engines(methods, what))

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
        with self.timed("engines"):
            for engine in engines:
                engine.stop(self.teardown_by)
            self._poll(engines, 0.0)

    def _engine_event(self, event: EngineEvent, engine: EngineWorker) -> None:
        """A plan from any engine; bounds and proofs only from the exact ones; a failure said."""
        source = {"highs": "milp", "second-search": "second-search"}.get(engine.method, "toulbar2")
        if event.kind == "error":
            self.emit(EngineFailed(engine.method, event.message or "no message", self.elapsed()))
        elif event.kind == "plan":
            self.offer(event.choice, source, None)
        elif not engine.bounds:
            return
        elif event.kind in ("bound", "optimal"):
            self.bound(event.cost, source)
        elif event.kind == "none" and engine.upper is not None:
            self.bound(engine.upper, source)  # no plan below the cost it was given
        elif event.kind == "none":
            self.proof = source  # no plan at all

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

            with self.timed("lp"):
                relax = call_forked(lambda: lp_bound(comp, budget), self.soon(budget + LP_GRACE), heard)
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
        lns, since = NeighbourhoodSearch(comp, self.rng), (time.monotonic(), 0)
        # toulbar2 on the subproblem where TRW-S only approximates it (elimination solves it exactly)
        probe = PenalisedProbe(comp, self.rng, self.options.seed, back_off=True) \
            if memory and lag.plan is None and self.options.toulbar and can_take(comp, rows=False) else None
        warmup = self.soon(min(30.0, 0.1 * self.left()) if self.deadline is not None else 10.0)
        wants_z3 = z3_thread is None and self.options.prove
        if wants_z3 and not z3_takes(comp):  # say so now, before building a cut (S: 2.7 s)
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
            # the memory-weighted start's cost is no target for Polyak's step: on LLaMA-3-8B (eager,
            # 8 devices, 80 GiB) its steps then overshot and the search ended at 784.9 ms, not 765
            target = None if self.best_cost == self.stopgap else self.best_cost
            result = lag.step(target, self.soon(30.0))
            last_step = time.monotonic() - began
            own = result.plan is not None and self.offer(result.plan, "lagrange", None)
            self.bound(result.bound, "lagrange")
            if probe is not None and probe.due(steps):
                own = self._probe(probe, lag, steps, engines) or own
            self._poll(engines, 0.0)
            if z3_thread is not None:
                z3_thread.bound = self.best_cost
                self._drain(z3_thread)
                if z3_thread.done and self.deadline is None:
                    break
            stale = stale + 1 if (self.best_cost, self.lower) == last else 0
            last = (self.best_cost, self.lower)
            since = (time.monotonic(), 0) if own else (since[0], since[1] + 1)
            if self._lns_due(since, last_step):
                self._lns(lns, engines)
                since = (time.monotonic(), 0)
            if self.deadline is None and stale >= 200 and not wants_z3 and (z3_thread is None or z3_thread.done):
                break
        if z3_thread is not None and self.deadline is None and not self.finished():
            z3_thread.join_until(None)
            self._drain(z3_thread)
        return z3_thread

    def _probe(self, probe: PenalisedProbe, lag: LagrangianSearch, steps: int, engines: list[EngineWorker]) -> bool:
        """toulbar2 on this step's penalised problem in a forked child (killed at the deadline;
        the engines are heard while it runs), its plan repaired and polished (subproblem.py);
        True when that plan is the new best. The child's plain steps and these deflected ones
        give two draws of the multipliers, which decide most of a call's result."""
        penalty = lag.penalties()
        if penalty is None:
            return False

        def heard() -> bool:
            self._poll(engines, 0.0)
            return self.finished()

        def run(call: Callable[[], np.ndarray | None], seconds: float) -> np.ndarray | None:
            return call_forked(call, self.soon(seconds), heard)

        search = probe.plan(penalty, steps, self.best_cost, self.soon(30.0), run)
        return search is not None and self.offer(search.x, "lagrange", None)

    def _lns_due(self, since: tuple[float, int], last_step: float) -> bool:
        """True when the last slice of neighbourhood search improved the best plan (it goes on
        while it pays: IOPDDL D's 172-node core went 1.16x -> 1.00x best known in 40 s of it, where
        the Lagrangian plans had stalled), or when this process's Lagrangian plans have not
        improved the best for LNS_AFTER_STEPS steps and twenty steps' time, or under a time limit
        for LNS_MIN_STEPS steps and LNS_STALL_SHARE of the limit (``since``: when and how many
        steps ago they last did), and there is a plan to improve. Plans of the other
        engines do not put the slice off: each is a new start for it (IOPDDL R: this process's
        plans stalled at 18 s while the second engine's improved until 89 s, and the first slice
        waited until 152 s, then took the best from 3.795e11 to 3.760e11)."""
        when, steps = since
        waited = time.monotonic() - when
        if self.best_local is None:
            return False
        stalled = self.options.timeout is not None and steps >= LNS_MIN_STEPS \
            and waited >= LNS_STALL_SHARE * self.options.timeout
        return self.lns_paid or stalled or (steps >= LNS_AFTER_STEPS and waited >= max(2.0, 20 * last_step))

    def _lns(self, lns: NeighbourhoodSearch, engines: list[EngineWorker]) -> None:
        """A slice of large-neighbourhood search from the best plan (lns.py). The engines are
        heard between neighbourhoods; when one's plan beats the slice's, the slice goes on from
        that plan (with compiled Lagrangian steps the second engine's plans came every few
        seconds on IOPDDL R, and slices that ended at each went back to the steps: R 1.0069 of
        the best known, 0.9940 going on)."""
        left = self.left()
        if left is not None and left < 2.0:
            return
        budget = LNS_SLICE if left is None else min(left, max(LNS_SLICE, LNS_SHARE * left))
        sizes = ", ".join(f"{solver.name} on {solver.size} nodes" for solver in lns.solvers)
        self.emit(Phase("lns", f"neighbourhood search ({sizes})", self.elapsed()))
        own = [self.best_cost]  # the best cost this slice knows of (its own plans, or the start)
        self.lns_paid = False

        def found(y: np.ndarray) -> None:
            if self.offer(y, "lns", None):
                own[0], self.lns_paid = self.best_cost, True

        def heard() -> bool:
            self._poll(engines, 0.0)
            return self.finished() or self.best_cost != own[0]

        end = self.soon(budget)
        with self.timed("lns"):
            while True:
                lns.run(self.best_local, end, found, heard)
                if self.finished() or self.best_cost == own[0]:
                    break  # out of the slice's time (or finished), not stopped by another's plan
                own[0] = self.best_cost
        self.emit(Phase("lagrange", "back to the Lagrangian search", self.elapsed()))

    def _z3_cut(self) -> DualCut | None:
        """The cut z3 gets: the LP's when the core's LP is small enough, else TRW-S's after a
        few sweeps (both valid lower bounds, see cut.py)."""
        if lp_columns(self.comp) <= LP_MAX_COLUMNS:
            return self._lp_phase()
        lag = LagrangianSearch(self.comp, self.rng)
        deadline = self.soon(2.0)
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

