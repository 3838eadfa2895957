"""TRW-S, or exact variable elimination, as the minimiser of the Lagrangian (lagrangian.py).

Each step solves the penalised core exactly by variable elimination when the core's treewidth
allows (``EliminationPlan``; the bound is then the exact dual value L(lam)), otherwise
approximately by SWEEPS TRW-S sweeps (the messages carry over from step to step: the bound is
TRW-S's dual, the minimiser read off the messages and polished by local search under the
penalties). ``plan`` repairs a minimiser that overflows by at most REPAIR_OVERFLOW of the
capacity and polishes a fitting one. Without memory rows lam is empty and this is plain TRW-S
with local-search polishing.
"""

from __future__ import annotations

import time

import numpy as np

from autoshard.solver.bounds.lagrangian import Lagrangian, Minimum, row_penalties
from autoshard.solver.bounds.trws import MessagePassing
from autoshard.solver.core.certify import safe_bound
from autoshard.solver.core.dual_cut import DualCut
from autoshard.solver.core.local_search import Search
from autoshard.solver.core.flat_core import views
from autoshard.solver.core.reduced import FrozenCore
from autoshard.solver.engines.elimination import EliminationPlan

SWEEPS = 2
"""TRW-S sweeps per step (the messages carry over from step to step): two gave better plans than
one on a quiet machine (measured: see benchmarks/README.md, "Measurements behind the design")."""
REPAIR_OVERFLOW = 0.01
"""Largest overflow (a share of the summed capacity) of a minimiser that ``plan`` repairs."""


class RelaxedMinimiser:
    """The penalised core minimised by elimination (``plan``, when feasible) or TRW-S (``mp``)."""

    def __init__(self, comp: FrozenCore, rng: np.random.Generator, plan: EliminationPlan | None = None,
                 sweeps: int = SWEEPS) -> None:
        self.comp, self.rng, self.sweeps = comp, rng, sweeps
        self.elimination = plan if plan is not None and plan.feasible else None
        self.mp = MessagePassing(comp)
        self.capacity = np.zeros(0) if comp.capacity is None else comp.capacity.astype(np.float64)

    @property
    def exact(self) -> bool:
        """Whether elimination solves each penalised core exactly."""
        return self.elimination is not None

    def minimise(self, lam: np.ndarray, penalty: np.ndarray | None, deadline: float) -> Minimum | None:
        """The penalised minimum (exact by elimination, else TRW-S's bound and its polished
        primal), certified by ``safe_bound``; None when the sweeps ran out of time."""
        comp = self.comp
        if self.elimination is not None:
            a = comp.arrays
            unary = None if penalty is None else views(a.costs.astype(np.float64) + penalty, a.c_off)
            x, value = self.elimination.solve(unary)
            x = np.asarray(x, dtype=np.int64)
            magnitude = abs(float(value)) + (0.0 if penalty is None else float(np.abs(penalty).sum()))
            scale = magnitude * max(1.0, comp.n / 100)  # float sums over up to n terms
            value = float(value) + (0.0 if penalty is None else comp.const)
        else:
            began = time.monotonic()
            for _ in range(self.sweeps):
                if not self.mp.sweep(penalty, deadline):
                    return None
            sweep = (time.monotonic() - began) / max(self.sweeps, 1)
            if deadline - time.monotonic() < sweep:  # reading the bound and plan off takes about a sweep
                return None
            value, scale = self.mp.bound(penalty)
            x = self.mp.primal(penalty)
        value -= float(lam @ self.capacity)
        scale += float(np.abs(lam * self.capacity).sum())
        if penalty is not None and self.elimination is None:
            polish = Search(comp, x, self.rng, penalty=penalty)
            polish.descend(deadline)
            x = polish.x
        return Minimum(x, value, safe_bound(value, scale))

    def plan(self, x: np.ndarray, deadline: float) -> tuple[np.ndarray, int] | None:
        """``x`` repaired when it overflows by at most REPAIR_OVERFLOW, then polished, if it fits."""
        search = Search(self.comp, x, self.rng)
        overflow = float(-np.minimum(search.slack, 0).sum() / max(1.0, self.capacity.sum())) if search.memory else 0.0
        if not search.feasible and overflow <= REPAIR_OVERFLOW:
            search.repair(deadline)
        if not search.feasible:
            return None
        search.descend(deadline)
        return search.x.copy(), search.total

    def cut(self, lam: np.ndarray) -> DualCut:
        """The multipliers ``lam`` and the messages as a cut for z3 (valid for every plan that fits)."""
        penalty = row_penalties(self.comp, lam) if len(lam) and lam.any() else None
        return self.mp.cut(penalty, -float(lam @ self.capacity))


def relaxed_lagrangian(comp: FrozenCore, rng: np.random.Generator, plan: EliminationPlan | None = None,
                       deflect: bool = True, sweeps: int = SWEEPS, back_to_best: bool = False) -> Lagrangian[RelaxedMinimiser]:
    """The Lagrangian search with TRW-S or elimination (``plan``) as its minimiser."""
    return Lagrangian(comp, RelaxedMinimiser(comp, rng, plan, sweeps), deflect=deflect, back_to_best=back_to_best)
