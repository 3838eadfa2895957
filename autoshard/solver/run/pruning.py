"""Proofs by pruning: TRW-S's split bound rules strategies out, toulbar2 searches what is left.

For every plan x and node i (trws.MessagePassing.floors, LB the split bound):

    cost(x) >= LB + floor_i[x_i]

so a strategy s of node i with LB + floor_i[s] > U is in no plan costing at most U. With U the
best plan's cost, toulbar2's branch and bound on the core restricted to the other strategies
(memory rows kept, toulbar.prove_among) finds the cheapest plan costing at most U; when its
search completes, that plan is optimal for the whole core. The bound leaves the memory rows out
(a relaxation, so still a bound on the plans that fit).

On cores with memory rows TRW-S does not prune (toulbar2 proves little there even on what is
left: IOPDDL V keeps 81% of its strategies and toulbar2 finds no plan among them in 120 s), so
this process runs the Lagrangian relaxation of the rows instead, for its bound alone: toulbar2's
own bound treats the rows as separate knapsacks and on V stays at 0.54 of the optimum where the
Lagrangian's reaches 0.77 in two seconds of steps. Where toulbar2 can minimise the core without
its rows, it minimises each penalised core exactly (exact_lagrangian.dual_search, in a forked
child) for at most EXACT_SHARE of the time until the dual's maximum is reached (V: 0.844 of the
optimum in 8 minima), then, with the engines' priority lowered and no share (nothing else of
this run needs the processor more), branches on usage levels below the best plan's
cost with that dual bounding each branch (bounds/level_branching.py), which can prove the plan
optimal; else (or when toulbar2 does not prove the first, unpenalised, core) TRW-S does, for at
most BESIDE_SHARE.

Why pruning: on wide memory-free cores toulbar2's own bounds (soft arc consistency) stall far below
TRW-S's. On the 70B-shaped LLaMA on 4x4x4, toulbar2 alone ends 0.09% short after 120 s, even
when given the optimum as its upper bound. After 5 s of TRW-S, 68% of the strategies survive
and toulbar2 proves the optimum among them in a second (benchmarks/README.md, "Pruning by
TRW-S's bound").
"""

from __future__ import annotations

import os
from typing import Callable, TypeVar

import numpy as np

from autoshard.solver.run.engine_pool import EnginePool
from autoshard.solver.model.events import Phase
from autoshard.solver.procs.forks import call_forked
from autoshard.solver.run.state import RunState
from autoshard.solver.engines.toulbar import can_take, prove_among
from autoshard.solver.bounds.exact_lagrangian import dual_search
from autoshard.solver.bounds.lagrangian import Lagrangian
from autoshard.solver.bounds.level_branching import LevelBranching
from autoshard.solver.bounds.relaxed_minimiser import relaxed_lagrangian
from autoshard.solver.bounds.trws import MessagePassing
from autoshard.solver.core.certify import safe_bound

T = TypeVar("T")

ALONE = 5.0
"""Seconds toulbar2's engines run alone before TRW-S starts beside them (most cores they prove
in less, and a third process on two cores would slow them)."""
EVERY = 10.0
"""Seconds of TRW-S between two attempts (its bound, and so the pruning, tightens as it goes)."""
ATTEMPT_SECONDS = 10
"""toulbar2's CPU limit per attempt on the pruned core."""
SWEEP_SLICE = 0.25
"""Longest stretch of TRW-S between two looks at the engines."""
BESIDE_SHARE = 0.1
"""Most of the time since toulbar2's engines started that the Lagrangian steps beside them may
take, on cores with memory rows: a third process on two cores, it slows their search by about
half this share."""
EXACT_SHARE = 0.9
"""Most of the time since toulbar2's engines started that the exact dual's steps may take (the
branching after them takes what it needs): toulbar2's own bound on such cores treats the rows
apart and proves little (V: 0.54 of the optimum), while the dual and the branching after it are
what can prove (V at 300 s, load 3-5: 0.91 of the optimum with 0.9, 0.84 with 0.5; the plan
still came from toulbar2's engines at 13 s)."""
ENGINE_NICE = 10
"""How much lower the engines' CPU priority goes while the branching runs: it is what can prove on
such cores, while their searches with the rows as knapsacks prove little there, so its toulbar2
children take the processor they share (V at 300 s, load 5-6: 0.941 of the optimum, where the
same branching at the engines' priority reached 0.844 at load 5)."""
STEP_SECONDS = 2.0
"""Longest Lagrangian step beside the engines (TRW-S's messages carry over a step cut short)."""


def lower_priority(pid: int, by: int) -> None:
    """Raise process ``pid``'s nice value by ``by`` (a process that has ended is left alone)."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, pid) + by))
    except ProcessLookupError:
        pass


def allowed_strategies(value: float, scale: float, floors: list[np.ndarray], upper: int) -> list[np.ndarray]:
    """Per node, the strategies a plan costing at most ``upper`` can take: those whose floor
    leaves the bound ``value`` at or below ``upper``, less a margin for float64 sums (``scale``:
    their terms' magnitudes, as in certify.safe_bound)."""
    margin = 1e-9 * (scale + abs(value)) + 1.0
    return [np.flatnonzero(value + floor - margin <= upper) for floor in floors]


class PrunedProof:
    """TRW-S in this process while toulbar2's engines search, with toulbar2 on the pruned core
    every EVERY seconds (module docstring)."""

    def __init__(self, state: RunState, pool: EnginePool, heard: Callable[[], bool]) -> None:
        self.state, self.pool, self.heard = state, pool, heard
        self.mp: MessagePassing | None = None

    def wait(self) -> None:
        """Until the run is finished or out of time, or every exact engine has ended. Cores with
        memory rows get the Lagrangian's bound beside the engines instead of pruning (module
        docstring): the pruning is measured on memory-free cores only."""
        state, pool = self.state, self.pool
        if state.comp.has_memory:
            self._lagrangian_beside()
            return
        began = self.state.clock()
        attempt_at = began + ALONE + EVERY
        while pool.exact_running() and not state.out_of_time() and not state.finished():
            if self.state.clock() - began < ALONE:
                pool.poll(0.05)
                continue
            if self.mp is None:
                state.emit(Phase("pruning", "TRW-S beside toulbar2, then toulbar2 on the strategies its bound "
                                 "leaves", state.elapsed()))
                self.mp = MessagePassing(state.comp)
            self.mp.sweep(None, state.soon(SWEEP_SLICE))
            pool.poll()
            if self.state.clock() >= attempt_at:
                self._attempt()
                attempt_at = self.state.clock() + EVERY
        pool.poll()

    def _lagrangian_beside(self) -> None:
        """Until the engines end (as ``wait``): after ALONE seconds, Lagrangian steps on the memory
        rows whenever they have taken less than their share of the time since the engines
        started (module docstring), the exact ones until converged; then the branching on usage
        levels without a share; their bounds (and any plan they make) go to the run."""
        state, pool = self.state, self.pool
        began, spent = state.clock(), 0.0
        exact = state.options.toulbar and can_take(state.comp, rows=False)
        share = EXACT_SHARE if exact else BESIDE_SHARE
        lag: Lagrangian | None = None
        branching: LevelBranching | None = None
        while pool.exact_running() and not state.out_of_time() and not state.finished():
            now = state.clock()
            settled = lag is not None and lag.converged and (
                branching.done if branching is not None else state.best_cost is None)
            if now - began < ALONE or (branching is None and spent > share * (now - began)) or settled:
                left = state.left()
                pool.poll(0.05 if left is None else max(0.0, min(0.05, left)))
                continue
            if lag is not None and lag.converged:  # the exact dual's maximum: branch on usage levels
                if branching is None:
                    branching = self._branching(lag)
                assert state.best_cost is not None
                branching.lower(state.best_cost)
                if not branching.done:
                    branching.step()
                spent += state.clock() - now
                state.bound(branching.bound, "branching")
                pool.poll()
                continue
            if lag is None:
                state.emit(Phase("lagrange", f"the Lagrangian relaxation of memory ({'exact' if exact else 'TRW-S'}) "
                                 "beside toulbar2, for its bound", state.elapsed()))
                lag = dual_search(state.comp, state.rng, state.options.seed, self._forked) \
                    if exact else relaxed_lagrangian(state.comp, state.rng, back_to_best=True)
            result = lag.step(state.best_cost, state.soon(STEP_SECONDS))
            spent += state.clock() - now
            if result.plan is not None:
                state.offer(result.plan, "lagrange", None)
            state.bound(result.bound, "lagrange")
            if exact and lag.steps == 1 and result.bound is None:  # no proof without penalties: TRW-S's instead
                exact, share, lag = False, BESIDE_SHARE, None
            pool.poll()
        pool.poll()

    def _branching(self, lag: Lagrangian) -> LevelBranching:
        """Branch and bound on usage levels below the best plan's cost, from the converged exact
        dual's multipliers and cut plans (bounds/level_branching.py)."""
        state = self.state
        assert state.best_cost is not None
        for engine in self.pool.engines:
            if engine.pid is not None:
                lower_priority(engine.pid, ENGINE_NICE)
        state.emit(Phase("branching", "branch and bound on memory usage levels, each branch bounded by the exact "
                         "Lagrangian dual", state.elapsed()))
        return LevelBranching(state.comp, state.rng, state.options.seed,
                              self._forked,
                              state.best_cost, lag.model.centre, lag.minimiser.known or [],
                              state.lower if state.lower is not None else -(2**62))

    def _forked(self, call: Callable[[], T], seconds: float) -> T | None:
        """``call()`` in a child killed after ``seconds`` (or at the deadline), the engines heard
        meanwhile: how the exact dual and the branching run toulbar2."""
        return call_forked(call, self.state.soon(seconds), self.heard)

    def _attempt(self) -> None:
        """Report TRW-S's bound; prune by it and let toulbar2 search the rest in a child."""
        state, comp = self.state, self.state.comp
        assert self.mp is not None
        value, scale, floors = self.mp.floors()
        state.bound(safe_bound(value, scale), "trws")
        upper = state.best_cost
        if upper is None or state.finished():
            return
        allowed = allowed_strategies(value, scale, floors, upper)
        seed = state.options.seed
        answer = call_forked(lambda: prove_among(comp, allowed, upper, ATTEMPT_SECONDS, seed),
                             state.soon(ATTEMPT_SECONDS + 2.0), self.heard)
        if answer is None:
            return
        x, proved = answer
        state.offer(x, "pruning", None)
        if proved:
            state.bound(comp.cost(x), "pruning")
