"""z3's part of the portfolio: CEGIS in a background thread beside the other searches (its
answers turned into plans, bounds and proofs), z3 alone, and the certificate of an optimum
another method proved. The solver's loop itself is cegis.py; this is how a run uses it.
"""

from __future__ import annotations

import queue
from typing import Callable

from autoshard.solver.engines.cegis import CheckResult, Z3Search, Z3Worker, objective_size
from autoshard.solver.core.reduced import FrozenCore
from autoshard.solver.core.dual_cut import DualCut
from autoshard.solver.model.events import Phase
from autoshard.solver.run.state import RunState

Z3_MAX_TERMS = 200_000
"""Cores whose z3 encoding would have more weighted literals are left to the heuristics."""
Z3_CONFIRM = 0.5
"""After another method proved the optimum, z3 gets this share of the time so far to certify it."""
Z3_CONFIRM_MIN = 2.0
"""... and at least this many seconds."""
Z3_CERTIFY_MAX_TERMS = 100_000
"""Cores with more weighted literals are not given to z3 for the certificate: below it z3 answers
within seconds, above it gave no verdict in minutes even with a near-optimal cut (measured: see
benchmarks/README.md, "Measurements behind the design")."""


def z3_takes(comp: FrozenCore) -> bool:
    """True when z3 is given the core at all (at most Z3_MAX_TERMS weighted literals)."""
    return objective_size(comp, Z3_MAX_TERMS) <= Z3_MAX_TERMS


class Z3Phases:
    """The z3 phases of one ``solve`` call, on its run state."""

    def __init__(self, state: RunState) -> None:
        self.state = state

    def start(self, cut: DualCut | None) -> Z3Worker | None:
        """z3's CEGIS in a background thread from the best cost, with ``cut`` (None when z3
        cannot take the core)."""
        state = self.state
        if not z3_takes(state.comp):
            state.emit(Phase("z3", "core too large for z3; heuristics only", state.elapsed()))
            return None
        with_cut = f" with a dual cut (bound {cut.const})" if cut is not None else ""
        state.emit(Phase("z3", f"z3 CEGIS on {state.comp.n} core nodes{with_cut} (background)", state.elapsed()))
        thread = Z3Worker(state.comp, state.deadline, cut)
        thread.bound = state.best_cost
        thread.start()
        return thread

    def drain(self, thread: Z3Worker) -> None:
        """Turn the z3 thread's answers into events (the callback runs on this thread only)."""
        while True:
            try:
                bound, result = thread.results.get_nowait()
            except queue.Empty:
                return
            self.answer(bound, result)

    def answer(self, bound: int | None, result: CheckResult) -> None:
        """A plan (SAT), a bound or a proof (UNSAT) from z3 asked for a plan cheaper than ``bound``."""
        state = self.state
        state.checked(bound, result.result)
        if result.result == "sat":
            state.offer(result.choice, "z3", bound)
        elif result.result == "unsat" and bound is not None:
            state.bound(bound, "z3")

    def certify(self, make_cut: Callable[[], DualCut | None]) -> None:
        """z3 asked for a plan cheaper than the proved optimum, with the cut ``make_cut()`` gives
        (called only for cores small enough), for Z3_CONFIRM of the time so far (at least
        Z3_CONFIRM_MIN s, within the limit): its UNSAT is the certificate the user sees;
        otherwise the proof stays the other method's."""
        state = self.state
        if objective_size(state.comp, Z3_CERTIFY_MAX_TERMS) > Z3_CERTIFY_MAX_TERMS:
            state.emit(Phase("z3", "core too large for a z3 certificate", state.elapsed()))
            return
        cut = make_cut()
        until = state.soon(max(Z3_CONFIRM_MIN, Z3_CONFIRM * state.elapsed()))
        thread = self.start(cut)
        if thread is None:
            return
        thread.deadline = until
        with state.timed("z3"):
            thread.join_until(until)
            thread.stop(state.teardown_by)
        self.drain(thread)

    def alone(self) -> None:
        """z3 on its own: ask for any plan, then any plan cheaper than the last, until UNSAT."""
        state = self.state
        if not z3_takes(state.comp):
            state.emit(Phase("z3", "core too large for z3", state.elapsed()))
            return
        state.emit(Phase("z3", f"z3 CEGIS on {state.comp.n} nodes", state.elapsed()))
        z3s = Z3Search(state.comp)
        while not state.out_of_time() and not state.proved():
            bound = state.best_cost
            result = z3s.check(bound, state.left())
            self.answer(bound, result)
            if result.result != "sat":
                break
