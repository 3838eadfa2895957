"""A device's bound from its parts on the shortened option, against the exact optimum of its whole problem."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from autoshard.api import build_model_problem
from autoshard.cost.devices import get_device
from autoshard.pipeline.deadline import TimeLimit
from autoshard.pipeline.layer_bound import (OUTSIDE, SAMPLE, PartFloors, node_groups, part_floors, shortened,
                                            solved_floor, subproblem, whole_floor)
from autoshard.pipeline.options import options_for
from autoshard.pipeline.search import PipelineSearch
from autoshard.pipeline.stages import cut
from autoshard.sharding.layers import find_repeated_layers
from autoshard.sharding.mesh import parse_mesh
from autoshard.solver import SolveOptions, solve
from autoshard.solver.model.problem import ShardingProblem
from tests.pipeline.models import tiny_llama_graph

LAYERS, BATCH = 10, 8


@pytest.fixture(scope="module")
def engine() -> PipelineSearch:
    device = get_device("h100")
    mesh = parse_mesh("2x2", None, None, 8, device.intra, device.inter)
    build = dict(mode="training", device=device, precision="bf16-mixed", recompute="full")
    return PipelineSearch(lambda m: tiny_llama_graph(LAYERS, BATCH // m), mesh, 0, build, None)


def _optimum(problem: ShardingProblem) -> int:
    found = solve(problem, SolveOptions(timeout=120))
    assert found.status == "optimal"
    return found.cost


def test_shortened_model_is_the_model_with_fewer_layers() -> None:
    """Node for node (kind, op, shape, operand positions) the trace of the same model built with
    fewer layers: the ops after the layers read the last kept one."""
    graph = tiny_llama_graph(LAYERS, 2)
    short = shortened(graph, find_repeated_layers(graph), 3)
    small = tiny_llama_graph(3, 2)

    def shape(g):
        order = {n.name: k for k, n in enumerate(g)}
        return [(n.kind, n.op, repr(n.out), tuple(order[s] for s in n.inputs)) for n in g]

    assert shape(short) == shape(small)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-1f1b"])
def test_parts_bound_every_device_and_meet_its_optimum_here(engine, schedule) -> None:
    """Every device's bound from the shortened option is at most the exact optimum of its whole
    problem without a budget (each parameter policy, even and uneven cuts); on this model the
    layers chain at no cost, so it meets it."""
    checked = 0
    for option in options_for(LAYERS, 2, [2], (schedule,)):
        for stage in engine.stages(option):
            for kept in (True, False):
                bound = engine.floors.seconds(option, stage, kept)
                if min(stage.counts) < SAMPLE:
                    assert bound is None  # a one-layer stage has no first and last layer to sample
                    continue
                mp = engine.stage_problem(option, stage, option.virtual, bounded=False, kept=kept)
                exact = _optimum(mp.problem) / mp.cost_model.ticks_per_unit
                assert bound <= exact * (1 + 1e-9)
                assert bound == pytest.approx(exact, rel=1e-9)
                checked += 1
    assert checked >= 6


def test_the_whole_device_holds_the_shortened_devices_parts(engine) -> None:
    """What the bound assumes, checked problem for problem: every layer of a full device is one of
    the shortened device's layers, and its nodes outside the layers are the shortened device's."""
    option = options_for(LAYERS, 2, [2], ("1f1b",))[0]
    graph = engine.graph(option.microbatches)
    layer_of = {n: i for i, layer in enumerate(find_repeated_layers(graph).layers) for n in layer}

    def parts(mp):
        groups = node_groups(mp, layer_of)
        members: dict[int, list[int]] = {}
        for node, group in enumerate(groups):
            members.setdefault(group, []).append(node)
        return {g: _content(subproblem(mp.problem, nodes)) for g, nodes in members.items()}

    for device, stage in enumerate(engine.stages(option)):
        whole = parts(engine.stage_problem(option, stage, 1, bounded=False))
        engine.floors.seconds(option, stage, True)
        graph_short, layers = engine.floors.graphs[(option.microbatches, SAMPLE * len(option.counts))]
        short_option = replace(option, counts=(SAMPLE,) * len(option.counts))
        short_stage = cut(graph_short, layers, short_option.counts, option.devices)[device]
        short = parts(engine.stage_problem(short_option, short_stage, 1, bounded=False))
        assert whole[OUTSIDE] == short[OUTSIDE]
        assert {v for g, v in whole.items() if g != OUTSIDE} <= {v for g, v in short.items() if g != OUTSIDE}


def _content(problem: ShardingProblem) -> tuple:
    return (tuple(tuple(c) for c in problem.node_costs),
            tuple((u, v, m.tobytes()) for (u, v), m in zip(problem.edges, problem.edge_costs)))


def test_parts_drop_only_non_negative_edges_and_take_the_cheapest_layer() -> None:
    """Two layers with different optima: the layer floor is the lesser; the ends keep the edges
    to the outside and drop the one between the layers."""
    costs = [np.array([0, 5]), np.array([3, 1]), np.array([2, 7])]  # outside, layer 1, layer 2
    edges = [(0, 1), (1, 2)]
    matrices = [np.array([[0, 4], [4, 0]]), np.array([[0, 9], [9, 0]])]
    problem = ShardingProblem(costs, [np.zeros(2, dtype=np.int64)] * 3, [(0, 0)] * 3, edges, matrices)
    found = part_floors(problem, [OUTSIDE, 1, 2], _brute)
    # ends: outside + both layers, the 1-2 edge dropped: min over (a, b, d) of c0 + c1 + c2 + M01
    assert found == PartFloors(ends=min(costs[0][a] + costs[1][b] + costs[2][d] + matrices[0][a, b]
                                        for a in range(2) for b in range(2) for d in range(2)),
                               layer=1, sampled=2)
    assert found.device(5) == found.ends + 3 * 1
    negative = ShardingProblem(costs, problem.node_usages, problem.intervals, edges,
                               [matrices[0], np.array([[0, -1], [0, 0]])])
    with pytest.raises(ValueError, match="negative"):
        part_floors(negative, [OUTSIDE, 1, 2], _brute)


def _brute(problem: ShardingProblem) -> int:
    return min(problem.cost(list(c)) for c in itertools.product(*(range(problem.num_strategies(i))
                                                                  for i in range(problem.num_nodes))))


def test_solved_floor_is_the_optimum_of_a_small_problem() -> None:
    problem = ShardingProblem([np.array([4, 1]), np.array([0, 3])], [np.zeros(2, dtype=np.int64)] * 2,
                              [(0, 0)] * 2, [(0, 1)], [np.array([[0, 2], [6, 0]])])
    assert solved_floor(TimeLimit(30))(problem) == _brute(problem)


def test_the_whole_models_bound_from_two_layers_meets_its_optimum() -> None:
    """Without a pipeline (``--pipeline auto``'s unpipelined candidate): the bound from the model
    shortened to two layers is at most the exact optimum of the whole problem without a budget,
    and meets it here."""
    device = get_device("h100")
    graph = tiny_llama_graph(5, 4)
    build = dict(mode="training", device=device, precision="bf16-mixed", recompute="full", memory_budget=1 << 62)
    bound = whole_floor(graph, lambda short: build_model_problem(short, "2x2", **build), solved_floor(TimeLimit(120)))
    mp = build_model_problem(graph, "2x2", **build)
    exact = _optimum(mp.problem) / mp.cost_model.ticks_per_unit
    assert bound <= exact * (1 + 1e-9)
    assert bound == pytest.approx(exact, rel=1e-9)
