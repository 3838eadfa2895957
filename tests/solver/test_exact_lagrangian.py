"""The exact Lagrangian search (exact_lagrangian.py) on random small cores, against enumeration:
every bound it claims is at most the optimum, every plan it offers fits and costs what it says,
and with no penalty toulbar2's proved minimum is the optimum without memory rows."""

from __future__ import annotations

import itertools
import time

import numpy as np

from autoshard.solver.core.reduce import reduce_core
from autoshard.solver.core.reduced import INF, Core
from autoshard.solver.bounds.exact_lagrangian import exact_lagrangian, search
from autoshard.solver.engines.toulbar import prove_penalised, solve_penalised
from tests.runtime.dist import run_ranks
from tests.solver.helpers import core_of, memory_cores, random_problem


def direct(call, seconds):
    """toulbar2 called in this process (the search forks a child for it in the solver)."""
    return call()


GUARD = 30
"""toulbar2's time limit here, a guard: these 8-node cores are proved in milliseconds, but a 1 s
limit ended a proof unproved on a loaded CI machine."""


def free_optimum(comp) -> int:
    """The core's optimum without its memory rows, by enumeration."""
    return min(comp.cost(list(x)) for x in itertools.product(*[range(len(c)) for c in comp.costs]))


def _proofs_of_free_optima() -> list[tuple[int, bool, bool]]:
    """Per seed with a core, (seed, proved, cost equal to the enumerated optimum without rows)."""
    found = []
    for seed in range(120):
        comp = core_of(seed, nodes=8)
        if comp is None or comp.n == 0 or free_optimum(comp) >= INF:
            continue
        x, proved = prove_penalised(comp, np.zeros(comp.arrays.c_off[-1]), GUARD, seed)
        found.append((seed, bool(proved), int(comp.cost(x)) == free_optimum(comp)))
    return found


def test_with_no_penalty_the_proved_minimum_is_the_optimum_without_rows() -> None:
    """Every plan is proved and is the optimum without rows, in a fresh process and after a
    neighbourhood search in the same process (toulbar2's options are process-wide)."""
    found = run_ranks(1, lambda rank, world: _proofs_of_free_optima(), connect=False)[0]
    assert len(found) >= 15 and all(proved and equal for _, proved, equal in found), found
    comp = next(c for seed in range(40) if (c := core_of(seed, nodes=8)) is not None and c.n > 0)
    assert solve_penalised(comp, np.zeros(comp.arrays.c_off[-1]), 1, 0) is not None
    found = _proofs_of_free_optima()
    assert len(found) >= 15 and all(proved and equal for _, proved, equal in found), found


def test_a_search_its_time_limit_cuts_is_not_proved() -> None:
    """A random 300-node network toulbar2 cannot close in one second of CPU: a plan, no proof."""
    problem = random_problem(np.random.default_rng(1), 300, max_k=6, edge_prob=0.1, memory=False,
                             forbid_prob=0.0, functional_prob=0.0)
    core = Core(problem)
    reduce_core(core)
    comp = core.freeze()
    x, proved = prove_penalised(comp, np.zeros(comp.arrays.c_off[-1]), 1, 1)
    assert comp.cost(x) < INF and not proved


def test_bounds_never_pass_the_optimum_and_offered_plans_fit() -> None:
    checked = bounded = 0
    for seed, comp, best in memory_cores(range(120), 8):
        plans: list[np.ndarray] = []
        bounds: list[int] = []

        def offer(x: np.ndarray) -> bool:
            assert comp.is_feasible(x)
            plans.append(x)
            return True

        def bound(value: int) -> None:
            assert value <= best, (seed, value, best)
            bounds.append(value)

        steps = search(comp, np.random.default_rng(seed), seed, lambda: min((comp.cost(p) for p in plans), default=None),
                       offer, bound, direct, time.monotonic() + 1)
        assert steps >= 1
        checked += 1
        bounded += bool(bounds)
    assert checked >= 15 and bounded >= 15


def test_the_multipliers_grow_on_rows_the_plan_overflows() -> None:
    for seed in range(120):
        comp = core_of(seed, nodes=8)
        if comp is None or comp.n == 0 or not comp.has_memory:
            continue
        lagrangian = exact_lagrangian(comp, np.random.default_rng(seed), seed, direct)
        result = lagrangian.step(None, time.monotonic() + 5)
        free = np.asarray(prove_penalised(comp, np.zeros(comp.arrays.c_off[-1]), 1, seed)[0])
        over = comp.profile(free) > comp.capacity
        if not result.answered or not over.any():
            continue
        assert (lagrangian.lam[over] > 0).all() and (lagrangian.lam[~over] == 0).all()
        return
    raise AssertionError("no core whose free optimum overflows")
