"""Branching on tallies (branching.py): the count of identical layers that recompute, split by the LP,
is branched on as a whole; the optimum stays the enumerated one and the bound is certified."""

from __future__ import annotations

import itertools
from dataclasses import replace

import highspy
import numpy as np
import pytest

from autoshard.errors import AutoshardError
from autoshard.solver.core.reduced import Core
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.core.ilp import linearise
from autoshard.solver.core.highs import Highs
from autoshard.solver.engines.milp import ilp_model, solve_core_milp
from autoshard.solver.core import branching
from autoshard.solver.model.problem import ShardingProblem, Tally
from autoshard.solver.bounds.lp import lp_bound
from autoshard.solver.core.branching import dive
from autoshard.solver.search.layer_flips import fit_by_flips, flip_groups
from tests.solver.test_milp import cores, fitting_plans


def test_counts_branched_on_keep_the_enumerated_optimum_and_every_bound_below_it() -> None:
    rng = np.random.default_rng(7)
    checked = 0
    for comp, best in cores(20):
        marked = [(v, np.flatnonzero(rng.random(len(c)) < 0.5)) for v, c in enumerate(comp.costs)]
        counted = replace(comp, tallies=[[(v, s) for v, s in marked if len(s)]] if any(len(s) for _, s in marked) else [])
        plans = fitting_plans(counted)
        for start in (plans[0], plans[-1]):
            heard: list[tuple[str, int, list[int] | None]] = []
            result = solve_core_milp(counted, exact=True, start=start, progress=lambda *event: heard.append(event))
            assert result.optimal and result.cost == best and counted.is_feasible(result.choice)
            assert result.certified is None or result.certified <= max(best, counted.cost(start))
            assert all(value <= best for kind, value, _ in heard if kind == "bound")
            checked += 1
    assert checked == 40


def layers_that_must_partly_recompute(layers: int = 8) -> ShardingProblem:
    """Identical layers in a chain, live at once: each keeps its activations (10 bytes, no cost) or
    recomputes them in one of two ways (7 or 8 ticks, no bytes); the limit fits the activations of 3.5."""
    costs = [np.array([0, 7, 8], dtype=np.int64) for _ in range(layers)]
    usages = [np.array([10, 0, 0], dtype=np.int64) for _ in range(layers)]
    chain = np.zeros((3, 3), dtype=np.int64)
    edges = [(i, i + 1) for i in range(layers - 1)]
    marked = tuple(((i, (1, 2), ()),) for i in range(layers))
    return ShardingProblem(costs, usages, [(0, 1)] * layers, edges, [chain] * len(edges), usage_limit=35,
                           tallies=[Tally("recomputing layers", marked)])


def test_the_count_of_recomputing_layers_lifts_the_bound_to_the_whole_number_optimum() -> None:
    problem = layers_that_must_partly_recompute()
    core = Core(problem)
    attach_memory(core, problem)
    comp = core.freeze()
    assert len(comp.tallies) == 1 and len(comp.tallies[0]) == 8
    optimum = 5 * 7  # five layers recompute
    assert solve_core_milp(comp, exact=True).cost == optimum
    assert lp_bound(comp, 30.0).bound < optimum  # the LP recomputes 4.5 layers
    lin = linearise(comp)
    region = dive(ilp_model(lin, len(comp.capacity)), comp, lin, optimum, None)
    assert region.closed and region.bound >= optimum  # <= 4 recompute: too big; >= 5: not cheaper
    region = dive(ilp_model(lin, len(comp.capacity)), comp, lin, None, None)  # no plan known
    assert not region.closed and [(row.lower, row.upper) for row in region.rows] == [(5, np.inf)]
    assert region.bound == optimum and region.cost == optimum  # the region's LP is whole: rounding it is the plan
    assert comp.is_feasible(region.plan) and comp.cost(region.plan) == optimum


def test_a_tally_outside_the_problem_is_refused() -> None:
    problem = layers_that_must_partly_recompute(2)
    with pytest.raises(AutoshardError, match=r"tally 'x' marks node 0 strategies \[5\]"):
        replace(problem, tallies=[Tally("x", (((0, (5,), ()),),))]).validate()
    for twins in ((1, 2), (1, 2, 3)):  # one twin per strategy, each a strategy or -1
        with pytest.raises(AutoshardError, match="one twin per strategy"):
            replace(problem, tallies=[Tally("x", (((0, (1,), twins),),))]).validate()


def test_flipping_whole_layers_makes_the_moves_no_single_node_can() -> None:
    """Layers of two nodes that must agree on recomputing (a forbidden pair between them); all
    recompute at the start. Flips stop two of them recomputing (all that fits), never a third."""
    layers, keep, again = 4, (0, 1), (2, 3)  # strategies: keep x, keep y, recompute x, recompute y
    agree = np.full((4, 4), 10**18, dtype=np.int64)
    agree[np.ix_(keep, keep)] = agree[np.ix_(again, again)] = 0
    costs, usages, edges = [], [], []
    for layer in range(layers):
        costs += [np.array([0, 0, 7, 7], dtype=np.int64), np.array([1, 2, 1, 2], dtype=np.int64)]
        usages += [np.array([10, 10, 0, 0], dtype=np.int64), np.zeros(4, dtype=np.int64)]
        edges.append((2 * layer, 2 * layer + 1))
    pair = (2, 3, 0, 1)  # each strategy's twin: the same variant, the choice flipped
    groups = tuple(((2 * layer, again, pair), (2 * layer + 1, again, pair)) for layer in range(layers))
    problem = ShardingProblem(costs, usages, [(0, 1)] * (2 * layers), edges, [agree] * layers, usage_limit=25,
                              tallies=[Tally("recomputing layers", groups)])
    core = Core(problem)
    attach_memory(core, problem)
    comp = core.freeze()
    start = np.array([2, 2] * layers)  # every layer recomputes, the second nodes at x
    assert comp.cost(start) == 4 * 7 + 4 and comp.is_feasible(start)
    flipped = flip_groups(comp, start)
    assert flipped is not None and comp.is_feasible(flipped) and comp.cost(flipped) == 2 * 7 + 4
    assert sorted(flipped[0::2].tolist()) == [0, 0, 2, 2] and (flipped[1::2] % 2 == 0).all()
    assert flip_groups(comp, flipped) is None  # a third layer would not fit


class _StatusAfterUnfinishedRun:
    """HiGHS as it behaves after an LP that ended Unknown: the next warm run leaves no status
    (and no duals) until the solver is cleared."""

    def __init__(self) -> None:
        self.status, self.runs, self.cleared = highspy.HighsModelStatus.kNotset, 0, False

    def setOptionValue(self, name: str, value: float) -> None:
        pass

    def run(self) -> None:
        self.runs += 1
        if self.cleared:
            self.status = highspy.HighsModelStatus.kOptimal

    def clearSolver(self) -> None:
        self.cleared = True

    def getModelStatus(self) -> highspy.HighsModelStatus:
        return self.status


def test_a_run_that_leaves_no_status_is_repeated_from_scratch() -> None:
    raw = _StatusAfterUnfinishedRun()
    assert Highs(None, raw=raw).run_until(None) and raw.runs == 2 and raw.cleared


def test_a_child_set_aside_caps_every_bound_and_takes_the_proof_with_it(monkeypatch) -> None:
    """8 identical layers, live at once, under 35 bytes: each keeps its activations (10 bytes,
    free), compresses them (6 bytes, 4 ticks) or recomputes them (no bytes, 7 ticks). The optimum
    recomputes 5 layers (35). From a plan recomputing 6 (42), the LP recomputes 4.5; K <= 4 is
    bounded by 33 (its plans cost 36 at best) and K >= 5 by 35. With ASIDE at 0.19, K >= 5
    (within 19% of 42) is set aside and the MILP searches K <= 4 alone: it finds 36 there, so it
    must claim neither a proof nor a bound above the 35 set aside."""
    layers = 8
    costs = [np.array([0, 4, 7], dtype=np.int64) for _ in range(layers)]
    usages = [np.array([10, 6, 0], dtype=np.int64) for _ in range(layers)]
    edges = [(i, i + 1) for i in range(layers - 1)]
    marked = tuple(((i, (2,), ()),) for i in range(layers))
    problem = ShardingProblem(costs, usages, [(0, 1)] * layers, edges, [np.zeros((3, 3), dtype=np.int64)] * len(edges),
                              usage_limit=35, tallies=[Tally("recomputing layers", marked)])
    core = Core(problem)
    attach_memory(core, problem)
    comp = core.freeze()
    six = [2] * 6 + [0] * 2
    assert comp.is_feasible(six) and comp.cost(six) == 42
    monkeypatch.setattr(branching, "ASIDE", 0.19)
    monkeypatch.setattr(branching, "_round", lambda comp, choice, known, region: known)  # it would find the 35
    lin = linearise(comp)
    region = dive(ilp_model(lin, len(comp.capacity)), comp, lin, 42, None)
    assert region.aside == 35 and [(row.lower, row.upper) for row in region.rows] == [(-np.inf, 4)]
    heard: list[tuple[str, int, list[int] | None]] = []
    result = solve_core_milp(comp, exact=True, start=six, progress=lambda *event: heard.append(event))
    assert result.cost == 36 and not result.optimal
    assert result.bound is not None and result.bound <= 35 and result.certified <= 35
    assert all(value <= 35 for kind, value, _ in heard if kind == "bound")


def test_nodes_tied_to_a_flipped_group_follow_it() -> None:
    """As above, with each layer's first node feeding a node outside the group whose strategy is
    a function of it (a reshard copy's: ``none`` while the layer keeps, ``copy`` while it
    recomputes; any other pair forbidden), holding 1 byte while it copies. Flipping the group
    alone leaves a forbidden pair; the tied node follows, so two layers stop recomputing."""
    layers, keep, again = 4, (0, 1), (2, 3)
    agree = np.full((4, 4), 10**18, dtype=np.int64)
    agree[np.ix_(keep, keep)] = agree[np.ix_(again, again)] = 0
    tie = np.full((4, 2), 10**18, dtype=np.int64)
    tie[keep, 0] = tie[again, 1] = 0
    costs, usages, edges, matrices = [], [], [], []
    for layer in range(layers):
        costs += [np.array([0, 0, 7, 7], dtype=np.int64), np.array([1, 2, 1, 2], dtype=np.int64)]
        usages += [np.array([10, 10, 0, 0], dtype=np.int64), np.zeros(4, dtype=np.int64)]
        edges.append((2 * layer, 2 * layer + 1))
        matrices.append(agree)
    for layer in range(layers):
        costs.append(np.zeros(2, dtype=np.int64))
        usages.append(np.array([0, 1], dtype=np.int64))
        edges.append((2 * layer, 2 * layers + layer))
        matrices.append(tie)
    pair = (2, 3, 0, 1)
    groups = tuple(((2 * layer, again, pair), (2 * layer + 1, again, pair)) for layer in range(layers))
    problem = ShardingProblem(costs, usages, [(0, 1)] * (3 * layers), edges, matrices, usage_limit=25,
                              tallies=[Tally("recomputing layers", groups)])
    core = Core(problem)
    attach_memory(core, problem)
    comp = core.freeze()
    start = np.array([2, 2] * layers + [1] * layers)
    assert comp.is_feasible(start) and comp.cost(start) == 4 * 7 + 4
    flipped = flip_groups(comp, start)
    assert flipped is not None and comp.is_feasible(flipped) and comp.cost(flipped) == 2 * 7 + 4
    kept = [layer for layer in range(layers) if flipped[2 * layer] < 2]
    assert len(kept) == 2 and all(flipped[2 * layers + layer] == (0 if layer in kept else 1) for layer in range(layers))
    assert flip_groups(comp, flipped) is None


def test_a_plan_over_the_limit_fits_by_recomputing_the_layers_that_pay_least_per_byte() -> None:
    """Eight layers that keep (10 bytes) or recompute at 7 or 8 ticks, under 35 bytes: from every
    layer kept (80 bytes, 45 over) flips recompute the fewest layers that fit, each the cheaper
    way, which is the exact optimum."""
    problem = layers_that_must_partly_recompute()
    pair = (1, 0, 0)  # keep <-> recompute at 7; recomputing at 8 flips back to keep
    groups = tuple(((layer, (1, 2), pair),) for layer in range(8))
    problem = replace(problem, tallies=[Tally("recomputing layers", groups)])
    core = Core(problem)
    attach_memory(core, problem)
    comp = core.freeze()
    every_kept = np.zeros(8, dtype=np.int64)
    assert comp.overflow(every_kept) == 45
    fitted = fit_by_flips(comp, every_kept)
    assert fitted is not None and comp.is_feasible(fitted)
    assert comp.cost(fitted) == solve_core_milp(comp, exact=True).cost == 5 * 7
    assert fit_by_flips(comp, fitted) is not None  # fits already: unchanged


def test_a_flip_that_overflows_is_taken_when_freeing_memory_elsewhere_still_pays() -> None:
    """Four layers keep (10 bytes) or recompute (7 ticks); four parameters stay gathered (5 bytes)
    or are gathered again (1 tick); 30 bytes. From every layer recomputing and every parameter
    kept (28 ticks), one flip fits; each further flip overflows, and pays once local search
    gathers two parameters again: three layers keep and all four parameters re-gather (11 ticks,
    the optimum by enumeration). Without ``rng`` the flips stop after the first."""
    layers = 4
    costs = [np.array([0, 7], dtype=np.int64)] * layers + [np.array([0, 1], dtype=np.int64)] * layers
    usages = [np.array([10, 0], dtype=np.int64)] * layers + [np.array([5, 0], dtype=np.int64)] * layers
    groups = tuple(((layer, (1,), (1, 0)),) for layer in range(layers))
    problem = ShardingProblem(costs, usages, [(0, 1)] * (2 * layers), [], [], usage_limit=30,
                              tallies=[Tally("recomputing layers", groups)])
    core = Core(problem)
    attach_memory(core, problem)
    comp = core.freeze()
    start = np.array([1] * layers + [0] * layers)
    assert comp.is_feasible(start) and comp.cost(start) == 28
    optimum = min(comp.cost(x) for x in itertools.product((0, 1), repeat=2 * layers) if comp.is_feasible(x))
    assert optimum == 11
    alone = flip_groups(comp, start)
    assert alone is not None and comp.cost(alone) == 21
    repaired = flip_groups(comp, start, rng=np.random.default_rng(0))
    assert repaired is not None and comp.is_feasible(repaired) and comp.cost(repaired) == optimum
