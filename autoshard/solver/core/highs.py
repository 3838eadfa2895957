"""The one place the solver calls HiGHS (highspy): models in; solutions, row duals and statuses out.

Every LP and MILP of the solver is written as one ``LpModel``

    min c.z   s.t.   row_lower <= A z <= row_upper,   col_lower <= z <= col_upper,
                     z_j integer for j < integers

and solved here: ``solve_lp`` for a one-off LP (bounds/lp.py, the column-generation master),
``Highs`` for a model that is run, changed (rows added and taken off, a start) and run again
(the LP's dive in branching.py, the MILP in engines/milp.py). No other module imports highspy or
scipy's ``linprog``, which runs a second copy of HiGHS. Every instance is silent and, in a forked
child, resets the thread pool it inherited (HiGHS would wait forever on the parent's threads).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import highspy
import numpy as np
from scipy.sparse import csc_array, sparray

from autoshard.solver.procs.silence import silenced

_scheduler_pid: int | None = None
"""The process whose HiGHS thread pool exists: a forked child inherits the pool's state but not
its threads, and HiGHS waits on them forever unless the pool is reset first."""


@dataclass(frozen=True)
class LpModel:
    """min c.z  s.t.  row_lower <= a z <= row_upper,  col_lower <= z <= col_upper; the first
    ``integers`` columns integer (0: an LP). Infinite row bounds are free sides."""

    c: np.ndarray
    a: sparray
    row_lower: np.ndarray
    row_upper: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integers: int = 0

    def relaxed(self) -> LpModel:
        """The same model without integrality: its LP relaxation."""
        return LpModel(self.c, self.a, self.row_lower, self.row_upper, self.col_lower, self.col_upper)


@dataclass(frozen=True)
class LpAnswer:
    """How an LP ended (``optimal``, ``infeasible`` or ``stopped``: a limit or a failure), its
    solution and row duals (None unless optimal) and its objective value."""

    status: str
    x: np.ndarray | None = None
    duals: np.ndarray | None = None
    value: float | None = None


def own_scheduler() -> None:
    """Reset HiGHS's thread pool when it was started by the process this one was forked from."""
    global _scheduler_pid
    if _scheduler_pid is not None and _scheduler_pid != os.getpid():
        highspy.Highs.resetGlobalScheduler(False)
    _scheduler_pid = os.getpid()


def _highs_lp(model: LpModel) -> highspy.HighsLp:
    """``model`` in HiGHS's own form (column-wise matrix)."""
    a = csc_array(model.a)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(model.c), a.shape[0]
    lp.col_cost_ = np.asarray(model.c, dtype=np.float64)
    lp.col_lower_, lp.col_upper_ = model.col_lower, model.col_upper
    lp.row_lower_, lp.row_upper_ = model.row_lower, model.row_upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
    if model.integers:
        lp.integrality_ = [highspy.HighsVarType.kInteger] * model.integers + [highspy.HighsVarType.kContinuous] * (
            len(model.c) - model.integers)
    return lp


class Highs:
    """One HiGHS instance on one model: run to a time limit or deadline, rows added and taken
    off, a start and callbacks for the MILP; silent. ``raw`` (tests): a stand-in for highspy's."""

    def __init__(self, model: LpModel | None, raw: Any = None, **options: float | int | str | bool) -> None:
        if raw is None:
            own_scheduler()
            with silenced():  # the constructor prints HiGHS's banner
                raw = highspy.Highs()
            raw.setOptionValue("output_flag", False)
        self.raw = raw
        for name, value in options.items():
            raw.setOptionValue(name, value)
        if model is not None:
            raw.passModel(_highs_lp(model))

    def add_row(self, columns: np.ndarray, lower: float, upper: float) -> None:
        """Append the row lower <= sum of ``columns`` <= upper (coefficients 1)."""
        self.raw.addRow(lower, upper, len(columns), columns, np.ones(len(columns)))

    def drop_last_row(self) -> None:
        """Take off the last row added."""
        self.raw.deleteRows(1, np.array([self.raw.getNumRow() - 1], dtype=np.int32))

    def start_from(self, columns: np.ndarray) -> None:
        """A MILP start: ``columns`` at 1, every other integer column at 0."""
        self.raw.setSolution(len(columns), np.asarray(columns, dtype=np.int32), np.ones(len(columns)))

    def listen(self, plan: Callable[[np.ndarray], None], bound: Callable[[float], None]) -> None:
        """While the MILP runs: ``plan(z)`` for each improving solution, ``bound(dual bound)`` at
        each poll."""
        self.raw.cbMipImprovingSolution.subscribe(lambda event: plan(np.asarray(event.data_out.mip_solution)))
        self.raw.cbMipInterrupt.subscribe(lambda event: bound(float(event.data_out.mip_dual_bound)))

    def run(self, time_limit: float | None = None) -> None:
        """Run to the end or ``time_limit`` seconds."""
        if time_limit is not None:
            self.raw.setOptionValue("time_limit", float(time_limit))
        with silenced():
            self.raw.run()

    def run_until(self, deadline: float | None) -> bool:
        """Run within ``deadline`` (a ``time.monotonic`` reading); True when it reached an optimum.
        A warm start from a run that ended without an optimum (status Unknown) can end with no
        status at all and no duals; such a run is repeated once from scratch."""
        for _ in range(2):
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0.1:
                    return False
                self.raw.setOptionValue("time_limit", left)
            self.raw.run()
            if self.raw.getModelStatus() != highspy.HighsModelStatus.kNotset:
                break
            self.raw.clearSolver()
        return self.optimal

    @property
    def optimal(self) -> bool:
        """Whether the last run proved its solution optimal (within HiGHS's tolerances)."""
        return self.raw.getModelStatus() == highspy.HighsModelStatus.kOptimal

    @property
    def infeasible(self) -> bool:
        """Whether the last run declared the model infeasible (within HiGHS's tolerances)."""
        return self.raw.getModelStatus() == highspy.HighsModelStatus.kInfeasible

    def has_solution(self) -> bool:
        """Whether the last run holds a feasible solution (a MILP's incumbent)."""
        return self.raw.getInfo().primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible

    def x(self) -> np.ndarray:
        """The columns' values."""
        return np.asarray(self.raw.getSolution().col_value)

    def duals(self) -> np.ndarray | None:
        """The rows' duals (d objective / d row bound), None when the last run left none."""
        solution = self.raw.getSolution()
        return np.asarray(solution.row_dual, dtype=np.float64) if solution.dual_valid else None

    def dual_bound(self) -> float:
        """The MILP's dual bound (of the model's objective), inf or nan when it has none."""
        return float(self.raw.getInfo().mip_dual_bound)

    def objective(self) -> float:
        """The objective value of the last run's solution."""
        return float(self.raw.getInfo().objective_function_value)

    def model(self) -> LpModel:
        """The model as it stands, rows added included."""
        lp = self.raw.getLp()
        a = csc_array((np.asarray(lp.a_matrix_.value_), np.asarray(lp.a_matrix_.index_),
                       np.asarray(lp.a_matrix_.start_)), shape=(lp.num_row_, lp.num_col_))
        return LpModel(np.asarray(lp.col_cost_, dtype=np.float64), a, np.asarray(lp.row_lower_),
                       np.asarray(lp.row_upper_), np.asarray(lp.col_lower_), np.asarray(lp.col_upper_))


def solve_lp(model: LpModel, time_limit: float | None = None) -> LpAnswer:
    """The LP ``model`` by HiGHS's dual simplex within ``time_limit`` seconds."""
    highs = Highs(model, solver="simplex")
    highs.run(time_limit)
    if highs.infeasible:
        return LpAnswer("infeasible")
    if not highs.optimal:
        return LpAnswer("stopped")
    return LpAnswer("optimal", highs.x(), highs.duals(), highs.objective())
