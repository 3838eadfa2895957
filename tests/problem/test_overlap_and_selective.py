"""Overlapped parameter traffic and the selective recomputation policy, on a small torchtitan-style LLaMA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autoshard.api import build_model_problem
from autoshard.errors import AutoshardError
from autoshard.frontend.trace import trace
from autoshard.problem.baselines.torchtitan import torchtitan_choice
from autoshard.problem.readback import make_plan
from autoshard.runtime.checks import check_layouts
from autoshard.sharding.layers import find_repeated_layers
from autoshard.sharding.reshard import reshard_steps
from benchmarks.titan_llama import Transformer

LAYERS = 3


@pytest.fixture(scope="module")
def graph():
    model = Transformer(LAYERS, 64, 4, 2, 128, 256, 128).to(torch.bfloat16)  # activations dominate the peak
    tokens = torch.zeros(8, 128, dtype=torch.long)
    return trace(model, (tokens, tokens.clone()))


def _build(graph, **options):
    return build_model_problem(graph, "4", mode="training", device="h100", precision="bf16-mixed", **options)


def _seconds(mp, spec_from, spec_to, meta) -> int:
    """Ticks of one reshard, priced step by step straight from the cost model."""
    steps = reshard_steps(spec_from, spec_to, meta.shape, meta.itemsize, mp.mesh.shape)
    return mp.cost_model.ticks(sum(mp.cost_model.step_cost(s, meta.shape) for s in steps))


def test_parameter_traffic_in_layers_exposes_only_what_the_owner_compute_cannot_hide(graph) -> None:
    hidden, exposed = _build(graph), _build(graph, overlap=False)
    in_layers = find_repeated_layers(graph).nodes
    checked = 0
    for edge, edge_off in zip(hidden.edges, exposed.edges):
        if edge.index is None or hidden.life.first_reader.get(edge.src) != edge.dst:
            continue
        param, owner = hidden.candidates[edge.src], hidden.candidates[edge.dst]
        if param.storage is None:
            continue
        on, off = hidden.problem.edge_costs[edge.index], exposed.problem.edge_costs[edge_off.index]
        in_layer = edge.dst in in_layers
        for i, (stored, storage) in enumerate(zip(param.strategies, param.storage)):
            gather = _seconds(hidden, stored.out_spec, storage.use, edge.meta)
            for j, s in enumerate(owner.strategies):
                again = bool(owner.recompute and owner.recompute[j])
                if s.in_specs[edge.operand] != storage.use or again != bool(param.recompute and param.recompute[i]):
                    continue
                back = _seconds(hidden, s.grad_specs[edge.operand], stored.out_spec, edge.meta)
                forward_pass, backward_pass = gather, back + gather * (storage.regather + again)
                assert off[i, j] == forward_pass + backward_pass
                if not in_layer:
                    assert on[i, j] == off[i, j]
                    continue
                fwd = owner.forward_costs[j]
                expected = max(0, forward_pass - fwd) + max(0, backward_pass - (owner.costs[j] - fwd))
                assert on[i, j] == expected
                checked += 1
    assert checked > 0
    plan = torchtitan_choice(hidden)
    assert hidden.problem.cost(plan) < exposed.problem.cost(plan)


def test_selective_policy_keeps_attention_and_every_other_weight_matmul(graph) -> None:
    mp = _build(graph, memory_budget=2**30, recompute="selective")
    assert len(mp.blocks.last) == LAYERS
    for layer in range(LAYERS):
        ops = [n for n in mp.blocks.block_of if mp.blocks.block_of[n] == layer]
        linears = [n for n in sorted(ops, key=list(graph.nodes).index) if graph[n].op == "linear"]
        kept = {n for n in ops if n in mp.blocks.saved}
        modules = sorted(graph[n].module.rsplit(".", 1)[1] for n in kept if graph[n].op == "linear")
        assert len(linears) == 7 and modules == ["w1", "w2", "wq", "wv"]  # 1st, 3rd, 5th, 7th in forward order
        assert sum(graph[n].op == "scaled_dot_product_attention" for n in kept) == 1


def test_selective_sits_between_keeping_and_full_recomputation(graph) -> None:
    problems = {policy: _build(graph, memory_budget=2**30, recompute=policy) for policy in ("full", "selective")}
    figures = {}
    for policy, mp in problems.items():
        recomputing = torchtitan_choice(mp)
        keeping = mp.complete([c - len(mp.candidates[n].strategies) // 2
                               if mp.candidates[n].recompute is not None and mp.candidates[n].recompute[c] else c
                               for n, c in zip(mp.names, recomputing)])
        figures[policy] = [(mp.problem.cost(c), mp.problem.peak_usage(c)) for c in (keeping, recomputing)]
    (keep_cost, keep_peak), (full_cost, full_peak) = figures["full"]
    assert figures["selective"][0] == (keep_cost, keep_peak)  # keeping is the same plan under either policy
    selective_cost, selective_peak = figures["selective"][1]
    assert keep_cost < selective_cost < full_cost
    assert full_peak < selective_peak < keep_peak


def test_a_selectively_recomputing_plan_is_refused_by_the_executor_in_one_line(graph) -> None:
    mp = _build(graph, memory_budget=2**30, recompute="selective")
    plan = make_plan(mp, torchtitan_choice(mp))
    assert plan.recompute and plan.recompute_kept
    with pytest.raises(AutoshardError, match="recomputes selectively .* --recompute full"):
        check_layouts(plan, graph)


def test_an_unknown_policy_names_the_choices(graph) -> None:
    with pytest.raises(AutoshardError, match="full, selective, none"):
        _build(graph, memory_budget=2**30, recompute="some")
    assert not np.any([c.recompute is not None for c in _build(graph, memory_budget=2**30,
                                                                 recompute="none").candidates.values()])
