"""z3's part of the portfolio: CEGIS in a background thread beside the other searches (its
answers turned into plans, bounds and proofs), z3 alone, and the certificate of an optimum
another method proved. The solver's loop itself is cegis.py; this is how a run uses it.
"""

from __future__ import annotations

import queue
from typing import Callable

from autoshard.solver.cegis import CheckResult, Z3Search, Z3Worker, objective_size
from autoshard.solver.core import Compact
from autoshard.solver.cut import DualCut
from autoshard.solver.events import Checked, Phase
from autoshard.solver.state import RunState

Z3_MAX_TERMS = 200_000
"""Cores whose z3 encoding would have more weighted literals are left to the heuristics."""
Z3_CONFIRM = 0.5
"""After another method proved the optimum, z3 gets this share of the time so far to certify it."""
Z3_CONFIRM_MIN = 2.0
"""... and at least this many seconds."""
Z3_CERTIFY_MAX_TERMS = 100_000
"""Cores with more weighted literals are not given to z3 for the certificate: on IOPDDL B (36k)
it answers UNSAT in under a second; on LLaMA-3-8B 8x8 (160k) it had no verdict after 120 s even
with a TRW-S cut 4e-7 below the optimum."""


def z3_takes(comp: Compact) -> bool:
    """True when z3 is given the core at all (at most Z3_MAX_TERMS weighted literals)."""
    return objective_size(comp) <= Z3_MAX_TERMS


class Z3Phases(RunState):
    """The z3 phases of one ``solve`` call (the Portfolio's base)."""

    def _start_z3(self, cut: DualCut | None) -> Z3Worker | None:
        """z3's CEGIS in a background thread from the best cost, with ``cut`` (None when z3
        cannot take the core)."""
        if not z3_takes(self.comp):
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
        """A plan (SAT), a bound or a proof (UNSAT) from z3 asked for a plan cheaper than ``bound``."""
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

    def _z3_certificate(self, make_cut: Callable[[], DualCut | None]) -> None:
        """z3 asked for a plan cheaper than the proved optimum, with the cut ``make_cut()`` gives
        (called only for cores small enough), for Z3_CONFIRM of the time so far (at least
        Z3_CONFIRM_MIN s, within the limit): its UNSAT is the certificate the user sees;
        otherwise the proof stays the other method's."""
        if objective_size(self.comp) > Z3_CERTIFY_MAX_TERMS:
            self.emit(Phase("z3", "core too large for a z3 certificate", self.elapsed()))
            return
        cut = make_cut()
        until = self.soon(max(Z3_CONFIRM_MIN, Z3_CONFIRM * self.elapsed()))
        thread = self._start_z3(cut)
        if thread is None:
            return
        thread.deadline = until
        with self.timed("z3"):
            thread.join_until(until)
            thread.stop(self.teardown_by)
        self._drain(thread)

    def _cegis_alone(self) -> None:
        """z3 on its own: ask for any plan, then any plan cheaper than the last, until UNSAT."""
        if not z3_takes(self.comp):
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
