"""The search on the reduced core: which engines run, in which order, and how their plans and
bounds come together (the ``search`` step of run/solve.py).

- without memory and narrow enough: exact variable elimination (elimination.py) — done, proved;
- otherwise a minimum-memory plan polished by local search (local_search.py), then exact engines
  in child processes, one per core (workers.py), chosen by what the core is:
  - memory rows small enough for toulbar2 (toulbar.can_take; no rows at all included): the LP
    relaxation first when small (often integral on small reduced cores), then toulbar2's branch
    and bound (proves) beside its neighbourhood search (plans), and on memory-free cores TRW-S
    pruning the core for a proof by toulbar2 on what is left (pruning.py) — ``_toulbar_search``;
  - otherwise toulbar2 on the core without its memory rows for up to RELAXED_ALONE seconds (longer
    on cores of counted layers, RELAXED_FLIPPED_SHARE: its optimum, made to fit by whole-layer
    flips, is a good plan there)
    (bounds; its optimum, if it fits, is optimal; stopped sooner once a plan it reported costs
    less than the lower bound, ``_retire``), then in its place, each once the one before has
    ended (``_second_engines``): on models' cores of counted layers (tallies) that memory binds
    the hull bound by column generation (column_generation.py, in the child: its TRW-S pricing
    needs minutes of sweeps where the run's share of them came late and short), and HiGHS's
    MILP (proves) for an ILP of at most MILP_MAX_COLUMNS; with neither, a second Lagrangian
    search with its own seed, taking turns with toulbar2 on per-node usage weights in place of the rows
    (turns.py, usage_weights.py); this process runs the LP bound, z3 and the
    Lagrangian relaxation of memory by elimination or TRW-S (lagrangian.py, trws.py; which steps
    make plans and which only bound, and the bound's least share of the time: bound_steps.py), exactly step
    by step for a while once toulbar2 has proved the core without rows within RELAXED_PROOF
    seconds (exact_lagrangian.py),
    with toulbar2 on its penalised subproblem while that pays (penalised_probe.py) and, when its
    plans stall, whole-layer flips and large-neighbourhood search (handover.py);
- z3 CEGIS (cegis.py, run by z3_phases.py) beside them, with the LP's or TRW-S's dual as a cut,
  and the z3 certificate of an optimum another method proved (``Z3Phases.certify``);
- without a time limit, HiGHS's exact ILP of a core still unproved (``_milp_proof``).

Time: every loop checks the deadline; the C code that does not (HiGHS's LP with its set-up)
runs in a child process killed at its time (forks.call_forked); steps that can neither be cut
nor killed (the Lagrangian set-up, reading a bound and plan off TRW-S) start only when the time
measured for comparable work fits.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from autoshard.solver.engines.cegis import Z3Worker
from autoshard.solver.core.dual_cut import DualCut
from autoshard.solver.engines.elimination import EliminationPlan
from autoshard.solver.model.events import Phase
from autoshard.solver.bounds.exact_lagrangian import SHARE as EXACT_SHARE, search as exact_search
from autoshard.solver.core.local_search import Search, min_memory_start
from autoshard.solver.bounds.lagrangian import Lagrangian
from autoshard.solver.bounds.relaxed_minimiser import RelaxedMinimiser, relaxed_lagrangian
from autoshard.solver.engines.milp import solve_core_milp
from autoshard.solver.search.penalised_start import weighted_start
from autoshard.solver.run.bound_steps import BoundShare, PlanSchedule
from autoshard.solver.run.pruning import PrunedProof
from autoshard.solver.bounds.lp import MAX_COLUMNS as LP_MAX_COLUMNS
from autoshard.solver.bounds.lp import Relaxation, lp_bound, lp_columns
from autoshard.solver.search.penalised_probe import PenalisedProbe
from autoshard.solver.run.handover import StalledSearch, fit_by_flips_and_polish, polish_by_flips
from autoshard.solver.engines.toulbar import can_take
from autoshard.solver.run.engine_pool import EnginePool
from autoshard.solver.procs.forks import call_forked
from autoshard.solver.run.state import RunState
from autoshard.solver.run.z3_phases import Z3Phases, z3_takes

LP_FIRST_COLUMNS = 100_000
"""Cores whose LP has at most this many variables get the LP before toulbar2: it is fast alone and
several times slower beside toulbar2's two processes (measured: see benchmarks/README.md,
"Measurements behind the design")."""
MILP_MAX_COLUMNS = 1_000_000
"""Cores whose ILP has at most this many variables get HiGHS's MILP in a child process beside the
Lagrangian search, which proves cores of this size that the Lagrangian search alone ends just
short of (measured: see benchmarks/README.md, "Measurements behind the design")."""
HIGHS_FIRST_COLUMNS = 100_000
"""Cores whose ILP has at most this many variables give HiGHS's MILP the second processor before
the hull engine: there it proves within seconds (a 4-layer LLaMA's pipeline stage cores, 67k
columns: four exact solves 22 s with HiGHS first, 95 s behind the hull's dive), where on larger
memory-bound cores of counted layers its root LP takes minutes (LLaMA-3.1-8B at 131,072 tokens,
360k columns: no bound in 115 s) and the hull's bound comes within seconds."""
RELAXED_PROOF = 3.0
"""Seconds after its start within which toulbar2 must prove the core without memory rows for the
exact Lagrangian steps to run (they start at the next Lagrangian step after its verdict): each
step solves such a core. Where it cannot (IOPDDL R: a first step of 2.2 s that proves nothing)
they would only delay the other searches."""
RELAXED_ALONE = 10.0
"""Seconds toulbar2 on the core without its memory rows runs before the second engine takes its
processor: where its optimum fits it proves it within seconds, and where memory binds it would
only slow the Lagrangian searches (measured: see benchmarks/README.md, "LLM scale" and
"Measurements behind the design")."""
RELAXED_FLIPPED_SHARE = 0.4
"""... or, on cores of counted layers under memory rows that the hull engine takes first (HiGHS,
where it goes first, proves within seconds), this share of the time left if longer: there
its optimum is worth having even where it overflows, since whole-layer flips make it fit
(handover.fit_by_flips_and_polish; LLaMA-3-8B on 2x8 at 40 GiB: toulbar2 proves the optimum
without rows in 14 s alone, 33 s beside the other searches at load 6, and recomputing a few layers
fits it within 6% of the bound, where the searches had stopped 18% above)."""
LP_MIN_TIME = 0.3
"""Seconds below which the LP is not tried (lp_bound needs 0.2 s after building the model)."""
LP_GRACE = 0.5
"""Seconds the LP child gets past its own time limit before it is killed (HiGHS's and scipy's set-up run past it)."""
LAGRANGE_SETUP = 1.0
"""The Lagrangian search starts only with this many times the greedy phase's time left: its
set-up (TRW-S's messages, the first plan's local search) is work of the same kind and size, and
the greedy phase is measured on this machine, so the estimate scales with the load (measured: see
benchmarks/README.md, "Measurements behind the design")."""


class Portfolio:
    """The search phases of one ``solve`` call on its reduced core ``comp``."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.z3 = Z3Phases(state)
        self.pool = EnginePool(state)
        self.weighted_start_cost: int | None = None  # the memory-weighted start's cost (penalised_start.py), when that was the start
        self.greedy_time = 0.0  # the greedy start's seconds: a first guess of a Lagrangian step's length
        self.cut: DualCut | None = None  # the LP's cut for z3, when the LP ran first

    def warm_search(self) -> None:
        """Exact elimination when the core is narrow and memory-free; else the greedy start, then
        the engines the core calls for (module docstring, step 2) with z3 alongside."""
        state = self.state
        comp = state.comp
        plan = EliminationPlan(comp, deadline=state.soon(min(5.0, 0.05 * state.left()) if state.deadline else 5.0))
        if plan.feasible and not comp.has_memory:
            state.emit(Phase("elimination", f"variable elimination on {comp.n} core nodes "
                            f"(largest table {plan.largest})", state.elapsed()))
            x, value = plan.solve()
            state.offer(x, "elimination", None)
            state.proved_by("elimination")
            state.bound(int(value), "elimination")
            return
        with state.timed("heuristic"):
            self._greedy()
        if state.options.toulbar and can_take(comp):
            self._toulbar_search()
            return
        queue = self._second_engines()
        if state.finished():
            pass  # the greedy plan meets the gap
        elif state.options.prove and state.options.toulbar and can_take(comp, rows=False):
            self.pool.start(["toulbar2-no-rows"], "toulbar2 on the core without memory rows (child process)")
            alone, left = RELAXED_ALONE, state.left()
            if comp.toggles and queue[0][0] == ["hull"] and left is not None:  # HiGHS first: it proves soon
                alone = max(alone, RELAXED_FLIPPED_SHARE * left)
            self.pool.waiting = [(*queue[0], self.state.clock() + alone), *((m, w, math.inf) for m, w in queue[1:])]
        else:
            self.pool.start(*queue[0])
            self.pool.waiting = [(m, w, math.inf) for m, w in queue[1:]]
        engines = {method for methods, _ in queue for method in methods}
        try:
            # under a time limit the LP is skipped when its cut has no taker (z3 cannot take the
            # core) and HiGHS, queued, solves the same LP at its MILP's root anyway: it would only
            # hold this process for seconds of the limit
            lp_wanted = state.deadline is None or "highs" not in engines or z3_takes(comp)
            cut = self._lp_phase() if lp_wanted else None
            z3_thread = self.z3.start(cut) if state.options.prove and cut is not None and not state.finished() else None
            if not state.finished():
                with state.timed("lagrange"):
                    z3_thread = self._lagrangian(z3_thread, plan)
            if z3_thread is not None:
                with state.timed("z3"):
                    z3_thread.stop(state.teardown_by)
                self.z3.drain(z3_thread)
            if state.deadline is None:
                self.pool.wait_for_exact()
        finally:
            self.pool.stop()
        if not state.finished() and state.deadline is None and state.options.prove and not self.pool.any_exact:
            self._milp_proof()

    def _second_engines(self) -> list[tuple[list[str], str]]:
        """The engines that take the second processor in turn (after toulbar2 without rows, where
        it runs), each once the one before has ended: on cores of counted layers that memory binds
        the hull engine first (its bound comes within seconds where HiGHS's root LP on the same
        core takes minutes, and its dive ends once no count is worth branching on), then HiGHS's
        MILP on an ILP of at most MILP_MAX_COLUMNS (it proves what the hull's bound stops short
        of), except on an ILP of at most HIGHS_FIRST_COLUMNS, where HiGHS goes first; with
        neither, the second Lagrangian search (plans only)."""
        state, comp = self.state, self.state.comp
        queue = []
        columns = lp_columns(comp)
        if state.options.prove and comp.has_memory and comp.tallies:
            queue.append((["hull"], "the hull bound: column generation on the memory rows (child process)"))
        if state.options.prove and columns <= MILP_MAX_COLUMNS:
            highs = (["highs"], "HiGHS's MILP of the core (child process)")
            queue.insert(0 if columns <= HIGHS_FIRST_COLUMNS else len(queue), highs)
        return queue or [(["second-search"], "a second Lagrangian search with usage weights (child process, own seed)")]

    def _greedy(self) -> None:
        """The first plan: minimum-memory start, repaired to fit, else TRW-S on memory-weighted
        costs; polished by local search."""
        state = self.state
        comp = state.comp
        state.emit(Phase("heuristic", f"local search on {comp.n} core nodes", state.elapsed()))
        began = self.state.clock()
        search = Search(comp, min_memory_start(comp), state.rng)
        if not search.feasible:
            search.repair(state.soon(max(5.0, 0.5 * state.left()) if state.deadline else 5.0))
        weighted = False
        if not search.feasible:  # groups of nodes that must move together (penalised_start.py)
            search = weighted_start(comp, state.rng, state.soon(min(5.0, 0.2 * state.left()) if state.deadline else 5.0)) \
                or search
            weighted = True
        if search.feasible:
            search.descend(state.soon(5.0))
            state.offer(search.x, "greedy", None)
            if weighted:
                self.weighted_start_cost = state.best_cost
        if state.best_local is not None and comp.toggles:  # a start recomputing every layer keeps what fits
            polish_by_flips(state, state.best_local)
        self.greedy_time = self.state.clock() - began

    def _toulbar_search(self) -> None:
        """The LP relaxation first on small cores (often integral there: plan and proof in a
        second); then toulbar2 searches the core in two child processes (one per core) from the
        best plan's cost: hybrid best-first branch and bound, which proves, and variable-
        neighbourhood search, which often finds the good plans sooner on wide cores; on a
        memory-free core, after a few seconds, TRW-S here prunes the strategies no plan as cheap
        as the best can take and toulbar2 proves the optimum among the rest (pruning.py). Then
        z3's CEGIS certifies the optimum (``Z3Phases.certify``)."""
        state = self.state
        if state.options.prove and lp_columns(state.comp) <= LP_FIRST_COLUMNS:
            self.cut = self._lp_phase()  # a bound, often the plan (B, G), and z3's cut
        if not state.finished():
            self.pool.start(["toulbar2", "toulbar2-vns"],
                            "toulbar2: branch and bound + neighbourhood search (child processes)")
        try:
            PrunedProof(state, self.pool, self._heard).wait()
        finally:
            self.pool.stop()
        if state.options.prove and state.proof is None and state.best is not None and state.proved():
            self.z3.certify(lambda: self.cut or self._z3_cut())
        if not state.finished() and state.deadline is None and state.options.prove:
            self._milp_proof()

    def _lp_phase(self) -> DualCut | None:
        """LP relaxation: a certified bound, sometimes the optimal plan, and a cut for z3. It runs
        in a child process killed at its time (building the model and HiGHS's set-up ignore the
        time limit); meanwhile the engines are heard."""
        state = self.state
        left = state.left()
        budget = 60.0 if left is None else min(60.0, 0.3 * left)
        comp = state.comp
        if lp_columns(comp) > LP_MAX_COLUMNS or budget < LP_MIN_TIME:
            relax = lp_bound(comp, 0.0)  # only the instant infeasibility check
        else:
            state.emit(Phase("lp", "LP relaxation of the core (HiGHS, child process)", state.elapsed()))
            with state.timed("lp"):
                relax = call_forked(lambda: lp_bound(comp, budget), state.soon(budget + LP_GRACE), self._heard)
            relax = relax or Relaxation(None, None, 0.0)
        if relax.infeasible:
            state.proved_by("lp")
            return None
        if relax.plan is not None:
            state.offer(relax.plan, "lp", None)
        state.bound(relax.bound, "lp")
        return relax.cut

    def _lagrangian(self, z3_thread: Z3Worker | None, plan: EliminationPlan) -> Z3Worker | None:
        """Lagrangian/TRW-S steps until proved or out of time; without an LP cut, z3 starts after
        a warm-up with the TRW-S cut instead. Returns the z3 thread (if any) for the caller to stop."""
        state = self.state
        comp = state.comp
        memory = comp.has_memory
        if state.deadline is not None and state.left() < LAGRANGE_SETUP * self.greedy_time:
            return z3_thread  # its set-up (which cannot be cut short) would overrun the time limit
        state.emit(Phase("lagrange", "TRW-S on the Lagrangian relaxation of memory" if memory else "TRW-S", state.elapsed()))
        lag = relaxed_lagrangian(comp, state.rng, plan=plan)
        schedule, share = PlanSchedule(), BoundShare(self.state.clock)  # which steps plan (bound_steps.py)
        stale, last, steps, last_step = 0, (state.best_cost, state.lower), 0, self.greedy_time
        stalled, since = StalledSearch(state, self.pool), (self.state.clock(), 0)
        # toulbar2 on the subproblem where TRW-S only approximates it (elimination solves it exactly)
        probe = PenalisedProbe(comp, state.rng, state.options.seed, back_off=True) \
            if memory and not lag.minimiser.exact and state.options.toulbar and can_take(comp, rows=False) else None
        warmup = state.soon(min(30.0, 0.1 * state.left()) if state.deadline is not None else 10.0)
        exact_due = memory and state.options.toulbar  # once toulbar2 proves the core without rows
        wants_z3 = z3_thread is None and state.options.prove
        if wants_z3 and not z3_takes(comp):  # say so now, before building a cut it cannot take
            wants_z3 = False
            state.emit(Phase("z3", "core too large for z3; heuristics only", state.elapsed()))
        while not state.out_of_time() and not state.finished():
            if state.deadline is not None and state.left() < last_step:
                break  # another step would overrun the time limit
            steps += 1
            if wants_z3 and (steps > 200 or self.state.clock() >= warmup):
                wants_z3 = False
                z3_thread = self.z3.start(lag.minimiser.cut(lag.lam))
            began = self.state.clock()
            # the memory-weighted start's cost is no target for Polyak's step: the steps overshoot
            # from it and the search ends worse (measured: see benchmarks/README.md, "Measurements
            # behind the design")
            target = None if state.best_cost == self.weighted_start_cost else state.best_cost
            # the bound's turn: a bound-only step and no plan engine after it, never cutting into
            # a neighbourhood search that still pays (IOPDDL S's plan lost 1.4% to such turns)
            turn = share.due() and not stalled.paid
            planning = not turn and schedule.due(steps)
            result = lag.step(target, state.soon(30.0), plan=planning)
            last_step = self.state.clock() - began
            share.heard(result.bound, last_step)
            own = result.plan is not None and state.offer(result.plan, "lagrange", None)
            if planning:
                schedule.heard(steps, result.plan is not None, own)
            state.bound(result.bound, "lagrange")
            probed = probe is not None and not turn and probe.due(steps)
            if probed:
                own = self._probe(probe, lag, steps) or own
            self.pool.poll()
            if (unfit := self.pool.take_unfit()) is not None:
                fit_by_flips_and_polish(state, unfit)
            proved_in = self.pool.relaxation_proved_in
            if exact_due and proved_in is not None and proved_in <= RELAXED_PROOF:
                exact_due = False
                with state.timed("exact-lagrange"):
                    self._exact_lagrangian()
            if z3_thread is not None:
                z3_thread.bound = state.best_cost
                self.z3.drain(z3_thread)
                if z3_thread.done and state.deadline is None:
                    break
            stale = stale + 1 if (state.best_cost, state.lower) == last else 0
            last = (state.best_cost, state.lower)
            # only the steps that sought a plan count as steps whose plans did not pay
            since = (self.state.clock(), 0) if own else (since[0], since[1] + int(planning or probed))
            if not turn and stalled.due(since, last_step):
                stalled.run()
                since = (self.state.clock(), 0)
            if state.deadline is None and stale >= 200 and not wants_z3 and (z3_thread is None or z3_thread.done):
                break
        if z3_thread is not None and state.deadline is None and not state.finished():
            z3_thread.join_until(None)
            self.z3.drain(z3_thread)
        return z3_thread

    def _exact_lagrangian(self) -> None:
        """Exact Lagrangian steps (exact_lagrangian.py) for up to its share of the time left."""
        state = self.state
        state.emit(Phase("exact-lagrange", "toulbar2's exact minima of the Lagrangian relaxation of memory",
                         state.elapsed()))
        until = state.share(EXACT_SHARE) or self.state.clock() + 60.0
        exact_search(state.comp, state.rng, state.options.seed, lambda: state.best_cost,
                     lambda x: state.offer(x, "exact-lagrange", None),
                     lambda value: state.bound(value, "exact-lagrange"),
                     lambda call, seconds: call_forked(call, state.soon(seconds), self._heard), until)

    def _probe(self, probe: PenalisedProbe, lag: Lagrangian[RelaxedMinimiser], steps: int) -> bool:
        """toulbar2 on this step's penalised problem in a forked child (killed at the deadline;
        the engines are heard while it runs), its plan repaired and polished (penalised_probe.py);
        True when that plan is the new best. The child's plain steps and these deflected ones
        give two draws of the multipliers, which decide most of a call's result."""
        state = self.state
        penalty = lag.penalties()
        if penalty is None:
            return False

        def run(call: Callable[[], np.ndarray | None], seconds: float) -> np.ndarray | None:
            return call_forked(call, state.soon(seconds), self._heard)

        search = probe.plan(penalty, steps, state.best_cost, state.soon(30.0), run)
        return search is not None and state.offer(search.x, "lagrange", None)

    def _heard(self) -> bool:
        """Take in the engines' reports while this process waits on a child; True once finished."""
        self.pool.poll()
        return self.state.finished()

    def _z3_cut(self) -> DualCut | None:
        """The cut z3 gets: the LP's when the core's LP is small enough, else TRW-S's after a
        few sweeps (both valid lower bounds, see dual_cut.py)."""
        state = self.state
        if lp_columns(state.comp) <= LP_MAX_COLUMNS:
            return self._lp_phase()
        minimiser = RelaxedMinimiser(state.comp, state.rng)
        deadline = state.soon(2.0)
        for _ in range(10):
            if not minimiser.mp.sweep(None, deadline):
                break
        return minimiser.cut(np.zeros(0 if state.comp.capacity is None else len(state.comp.capacity)))

    def _milp_proof(self) -> None:
        """Without a time limit the answer must be proved: when z3 could not take the core (too
        many weighted literals) or stopped without a verdict, HiGHS solves the core's ILP to a zero gap."""
        state = self.state
        state.emit(Phase("milp", f"exact ILP of the {state.comp.n}-node core (HiGHS, zero gap)", state.elapsed()))
        best = state.best_local
        result = solve_core_milp(state.comp, exact=True, start=None if best is None else best.tolist())
        if result.choice is not None:
            state.offer(result.choice, "milp", None)
        if result.optimal and result.cost is not None:
            state.bound(int(result.cost), "milp")

