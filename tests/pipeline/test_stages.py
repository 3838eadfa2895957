"""Cutting a traced model into pipeline stages: every op placed once, boundaries sent and received."""

from __future__ import annotations

from fractions import Fraction

import pytest

from autoshard.cost.lifetimes import lifetimes
from autoshard.cost.memory import MemoryItem, microbatched_items
from autoshard.errors import AutoshardError
from autoshard.frontend.graph import RECEIVED, NodeKind
from autoshard.pipeline.stages import cut, even_cuts
from autoshard.sharding.layers import find_repeated_layers
from tests.pipeline.models import tiny_llama_graph


@pytest.fixture(scope="module")
def graph():
    return tiny_llama_graph(4, 4)


def _ops(g):
    return {n.name for n in g if n.kind == NodeKind.OP}


def test_two_stages_place_every_op_once_and_pass_the_residual_stream(graph) -> None:
    repeated = find_repeated_layers(graph)
    stages = cut(graph, repeated, (2, 2), 2)
    first, second = stages
    assert first.first and not first.last and second.last and not second.first
    recomputed = _ops(first.graph) & _ops(second.graph)
    assert all(not graph[n].requires_grad for n in recomputed)  # only gradient-free ops run twice
    assert _ops(first.graph) | _ops(second.graph) == _ops(graph)
    assert len(first.sent) == 1 and first.sent == second.received
    boundary = second.graph[second.received[0]]
    assert boundary.kind == NodeKind.INPUT and boundary.attrs[RECEIVED] and boundary.requires_grad
    assert graph[boundary.name].module.startswith("layers.1")
    assert {"cos", "sin"} <= set(first.graph.nodes) & set(second.graph.nodes)  # buffers go where read
    total = [sum(n.work.flops for n in graph if n.kind == NodeKind.OP and n.work),
             sum(n.work.backward_flops for n in graph if n.kind == NodeKind.OP and n.work)]
    split = [sum(f for s in stages for f, _ in s.flops), sum(b for s in stages for _, b in s.flops)]
    assert split[0] >= total[0] and split[1] == total[1]  # forward of recomputed masks counted twice at most
    for stage in stages:
        seen = set()
        for node in stage.graph:
            assert all(src in seen for src in node.inputs), node.name
            seen.add(node.name)


def test_interleaved_devices_hold_every_other_stage(graph) -> None:
    repeated = find_repeated_layers(graph)
    stages = cut(graph, repeated, (1, 1, 1, 1), 2)
    assert [s.stages for s in stages] == [(0, 2), (1, 3)]
    assert len(stages[0].received) == 1 and len(stages[1].received) == 2
    assert len(stages[0].sent) == 2 and len(stages[1].sent) == 1  # the last stage sends nothing on


def test_even_cuts_and_their_errors() -> None:
    assert even_cuts(126, 8) == (15, 16, 16, 16, 16, 16, 16, 15)
    assert even_cuts(8, 4) == (2, 2, 2, 2) and sum(even_cuts(10, 4)) == 10
    with pytest.raises(AutoshardError, match="at least 9 repeated layers"):
        even_cuts(8, 9)


def test_microbatched_items_hold_the_boundary_state_once_more_per_microbatch(graph) -> None:
    life = lifetimes(graph, training=True)
    t = life.horizon
    saved = MemoryItem("x", "saved for backward", (t - 3, t + 3), (10, 7))
    forward_only = MemoryItem("y", "activation", (0, t - 1), (5, 5))
    gradient = MemoryItem("w", "gradient", (t + 2, life.end), (4, 2))
    out = microbatched_items([saved, forward_only], life, Fraction(3, 2), stored=False)
    assert out == [saved, MemoryItem("x", "other microbatches in flight", (0, life.end), (15, 11)), forward_only]
    assert microbatched_items([gradient], life, Fraction(3), stored=True) == [
        MemoryItem("w", "gradient", (0, life.end), (4, 2))]
