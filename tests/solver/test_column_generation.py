"""The hull bound (column_generation.py): column generation on the memory rows and the dive on counts, checked
against the enumerated optimum and against the Lagrangian dual solved exactly over every plan."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

import numpy as np
from scipy.optimize import linprog

from autoshard.solver.core.reduced import INF, Core, FrozenCore
from autoshard.solver.bounds.column_generation import ColumnGeneration, dive
from autoshard.solver.core.branching import Branch
from autoshard.solver.core.rows import attach_memory
from tests.solver.test_milp import cores, fitting_plans
from tests.solver.test_branching import layers_that_must_partly_recompute


def every_plan(comp: FrozenCore) -> list[np.ndarray]:
    """Every plan of the core without a forbidden strategy or pair, fitting or not."""
    plans = [np.array(x) for x in itertools.product(*[range(len(c)) for c in comp.costs])]
    return [x for x in plans if comp.cost(x) < INF]


def hull_value(comp: FrozenCore, branches: list[Branch]) -> float:
    """The Lagrangian dual of the memory (and branch) rows, exactly: the master LP over every plan."""
    plans = every_plan(comp)
    usage = np.column_stack([comp.profile(x) for x in plans]).astype(np.float64)
    counts = [np.array([sum(int(x[v] in set(m.tolist())) for v, m in tally) for x in plans], dtype=np.float64)
              for tally in comp.tallies]
    rows, rhs = [usage], [comp.capacity.astype(np.float64)]
    for b in branches:
        rows.append(b.sense * counts[b.tally][None, :])
        rhs.append(np.array([b.sense * b.k], dtype=np.float64))
    res = linprog(np.array([comp.cost(x) for x in plans], dtype=np.float64), A_ub=np.vstack(rows),
                  b_ub=np.concatenate(rhs), A_eq=np.ones((1, len(plans))), b_eq=[1.0], bounds=(0, None), method="highs")
    return float(res.fun) if res.status == 0 else float("inf")


def with_random_tally(comp: FrozenCore, rng: np.random.Generator) -> FrozenCore:
    marked = [(v, np.flatnonzero(rng.random(len(c)) < 0.5)) for v, c in enumerate(comp.costs)]
    return replace(comp, tallies=[[(v, s) for v, s in marked if len(s)]])


def test_every_bound_is_below_the_exact_dual_and_the_optimum_and_every_offered_plan_fits() -> None:
    rng = np.random.default_rng(3)
    checked = 0
    for comp, best in cores(12):
        counted = with_random_tally(comp, rng)
        offered: list[np.ndarray] = []
        generation = ColumnGeneration(counted, rng, offered.append)
        generation.add(np.array(fitting_plans(counted)[0]))
        root = generation.search([], time.monotonic() + 10)
        exact = hull_value(counted, [])
        assert root.bound is not None and root.master is not None
        assert root.bound <= exact + 1e-6 * abs(exact) and root.bound <= best
        assert root.master >= exact - 1e-6 * abs(exact)  # the pool is a subset of every plan
        for k in range(len(counted.tallies[0]) + 1):
            for sense in (1, -1):
                branch = [Branch(0, sense, k)]
                inside = [x for x in fitting_plans(counted)
                          if sense * sum(int(x[v] in set(m.tolist())) for v, m in counted.tallies[0]) <= sense * k]
                child = generation.search(branch, time.monotonic() + 10)
                assert child.bound is not None and child.bound <= hull_value(counted, branch) + 1e-6 * abs(exact)
                if inside:
                    assert child.bound <= min(counted.cost(x) for x in inside)
        assert offered and all(counted.is_feasible(x) and counted.cost(x) >= best for x in offered)
        checked += 1
    assert checked == 12


def test_a_dive_from_a_dearer_plan_keeps_the_optimum_inside_and_below_its_bound() -> None:
    rng = np.random.default_rng(5)
    dived = 0
    for comp, best in cores(12):
        counted = with_random_tally(comp, rng)
        plans = fitting_plans(counted)
        if counted.cost(plans[0]) == best:
            continue
        generation = ColumnGeneration(counted, rng, lambda x: None)
        generation.add(np.array(plans[0]))
        ended = dive(generation, lambda: counted.cost(plans[0]), time.monotonic() + 20)
        assert not ended.closed and ended.bound is not None and ended.bound <= best
        optimal = [x for x in plans if counted.cost(x) == best]
        count = [sum(int(x[v] in set(m.tolist())) for v, m in counted.tallies[0]) for x in optimal]
        assert any(all(b.sense * c <= b.sense * b.k for b in ended.branches) for c in count)
        dived += 1
    assert dived >= 8


def test_branching_on_the_count_of_recomputing_layers_proves_the_whole_number_optimum() -> None:
    """Eight identical layers, 3.5 of whose activations fit: the dual mixes keeping and recomputing
    (4.5 layers recompute); the child with at most 4 recomputing cannot fit (its bound passes the
    optimum), the other costs 5 x 7."""
    problem = layers_that_must_partly_recompute()
    core = Core(problem)
    attach_memory(core, problem)
    comp = core.freeze()
    optimum = 5 * 7
    generation = ColumnGeneration(comp, np.random.default_rng(0), lambda x: None)
    generation.add(np.array([1] * 8))  # every layer recomputes: 56
    root = generation.search([], time.monotonic() + 10)
    assert root.bound is not None and root.bound < optimum and abs(root.counts[0] - 4.5) < 1e-6
    ended = dive(generation, lambda: 56, time.monotonic() + 30)  # both children open below 56
    assert not ended.closed and optimum - 1 <= ended.bound <= optimum
    ended = dive(generation, lambda: optimum, time.monotonic() + 30)
    assert ended.closed  # nothing cheaper than the optimum on either side


class _FakeClock:
    """Stands for ``time`` in column_generation: each reading a millisecond after the last."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 1e-3
        return self.now


def test_the_root_search_ends_on_its_own_once_neither_the_master_nor_the_messages_move(monkeypatch) -> None:
    """With a deadline that never comes, the search ends (the dual solved over the pool, or STALL
    steps that moved neither the master nor TRW-S's bound), its bound below the exact dual."""
    import autoshard.solver.bounds.column_generation as column_generation
    clock = _FakeClock()
    monkeypatch.setattr(column_generation, "time", clock)
    rng = np.random.default_rng(7)
    for comp, best in cores(8):
        generation = ColumnGeneration(comp, rng, lambda x: None)
        generation.add(np.array(fitting_plans(comp)[0]))
        root = generation.search([], 1e9)
        exact = hull_value(comp, [])
        assert root.bound is not None and root.bound <= exact + 1e-6 * abs(exact) and root.master >= exact - 1e-6
    assert clock.now < 1e3  # every search ended long before its deadline
