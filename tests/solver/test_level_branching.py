"""Branch and bound on usage levels (bounds/level_branching.py) against enumeration on small
random cores: its bound never passes the optimum, and from the optimum as ``upper`` it closes
every branch (toulbar2 called in this process)."""

from __future__ import annotations

import numpy as np

from autoshard.solver.bounds.exact_lagrangian import dual_search
from autoshard.solver.bounds.level_branching import LevelBranching
from tests.solver.helpers import memory_cores


def branching(comp, seed: int, upper: int) -> LevelBranching:
    """The root's dual to convergence, then the branching from it."""
    run = lambda call, seconds: call()  # noqa: E731
    lagrangian = dual_search(comp, np.random.default_rng(seed), seed, run)
    root = -(2**62)
    while not lagrangian.converged and lagrangian.steps < 40:
        bound = lagrangian.step(upper, np.inf).bound
        root = max(root, bound if bound is not None else root)
    return LevelBranching(comp, np.random.default_rng(seed), seed, run, upper, lagrangian.model.centre,
                          lagrangian.minimiser.known or [], root)


def test_the_bound_never_passes_the_optimum_and_closes_at_it() -> None:
    checked = closed = 0
    for seed, comp, best in memory_cores(range(300), 7):
        for upper in (best, best + 5):
            search = branching(comp, seed, upper)
            while not search.done and search.branches < 300:
                assert search.bound <= best, (seed, upper, search.bound, best)
                search.step()
            assert search.bound <= best, (seed, upper, search.bound, best)
            closed += upper == best and search.done and search.bound == best
        checked += 1
        if checked >= 12:
            break
    assert checked >= 12 and closed >= 10, (checked, closed)
