"""Mixture of experts from model to plan: fusion of the experts modules, what expert parallelism is
charged (against a brute-force count of balanced routing), the plan and its JSON, the pinned
expert-parallel option, the torchtitan-style baseline and the command line."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest

from autoshard.api import build_model_problem, solve_model_problem
from autoshard.problem.baselines.torchtitan import torchtitan_choice
from autoshard.errors import AutoshardError
from autoshard.frontend.experts import EXPERTS_OP, experts_activation
from autoshard.frontend.load import load_model
from autoshard.frontend.trace import trace
from autoshard.problem.plan import Plan
from autoshard.problem.readback import make_plan
from autoshard.runtime.checks import Collective, expected_collectives, same_collectives
from autoshard.sharding.exchange import expert_exchanges
from autoshard.cli.solve import main

ROOT = Path(__file__).resolve().parents[2]
MIXTRAL = str(ROOT / "examples" / "mixtral.py")


@functools.lru_cache(maxsize=None)
def mixtral():
    """The example's model, inputs and graph (traced with its loss, as training plans are)."""
    loaded = load_model(MIXTRAL).for_training()
    return loaded.model, loaded.example_inputs, trace(loaded.model, loaded.example_inputs)


def test_each_experts_module_is_one_node_reading_its_inputs_and_weights():
    model, _, graph = mixtral()
    fused = [n for n in graph if n.op == EXPERTS_OP]
    assert [n.module for n in fused] == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    for node in fused:
        hidden, index, weights, gate_up, down = (graph[s] for s in node.inputs)
        assert (gate_up.qualname, down.qualname) == (f"{node.module}.gate_up_proj", f"{node.module}.down_proj")
        assert not index.tensor.is_float and weights.tensor.shape == index.tensor.shape == (64, 2)
        assert hidden.tensor.shape == node.tensor.shape == (64, 64)
        assert not any(n.module.startswith(node.module) for n in graph if n.op in ("sort", "histc", "index_put"))
    assert node.work.flops == 2 * 64 * 2 * 64 * 3 * 128  # rows x (gate_up 64->256, down 128->64), both counted


def test_only_modules_it_computes_exactly_are_fused():
    model, _, _ = mixtral()
    experts = model.model.layers[0].mlp.experts
    assert experts_activation(experts) == "silu"
    experts.has_bias = True
    try:
        assert experts_activation(experts) is None
    finally:
        experts.has_bias = False


def brute_force_sent_rows(tokens: int, top_k: int, experts: int, held: int, group: int) -> int:
    """Rows one device sends under perfectly balanced routing: its pairs spread evenly over every expert,
    sent when the expert is in its exchange group (the first ``group * held`` experts) but not its own."""
    per_expert = tokens * top_k // experts
    mine = range(held)  # the device holds the group's first experts
    return sum(per_expert for e in range(group * held) if e not in mine)


@pytest.mark.parametrize("tokens,top_k,experts,held,group", [(8, 2, 8, 2, 4), (16, 2, 8, 1, 4), (32, 1, 8, 2, 2),
                                                               (4, 2, 4, 1, 4)])
def test_exchange_bytes_are_balanced_routing(tokens, top_k, experts, held, group):
    hidden, itemsize = 12, 2
    exchanges = expert_exchanges((tokens, hidden), itemsize, top_k, experts, held, 0, group, 1.0, True)
    assert [(x.what, x.phase, x.routed) for x in exchanges] == [
        ("counts", "forward", False), ("dispatch", "forward", True), ("combine", "forward", True),
        ("combine", "backward", True), ("dispatch", "backward", True)]
    rows = brute_force_sent_rows(tokens, top_k, experts, held, group)
    assert all(x.sent_bytes(group) == rows * hidden * itemsize for x in exchanges[1:])
    assert exchanges[0].sent_bytes(group) == (group - 1) * held * 8
    padded = expert_exchanges((tokens, hidden), itemsize, top_k, experts, held, 0, group, 1.5, False)
    assert padded[1].in_bytes == math.ceil(1.5 * tokens * top_k * group * held / experts) * hidden * itemsize


def _ep_problem(mesh: str, capacity: float = 1.0):
    _, _, graph = mixtral()
    return build_model_problem(graph, mesh, mode="training", expert_parallel=0, capacity_factor=capacity)


def test_expert_parallel_cost_is_compute_times_capacity_plus_the_priced_all_to_alls():
    plain, padded = _ep_problem("4"), _ep_problem("4", 1.5)
    node = next(n for n in plain.candidates.values() if n.node.op == EXPERTS_OP)
    model = plain.cost_model
    exchanges = {c: expert_exchanges((16, 64), 4, 2, 8, 2, 0, 4, c, True) for c in (1.0, 1.5)}
    comm = {c: sum(model.ticks(plain.mesh.latency[0] + x.sent_bytes(4) / plain.mesh.bandwidth[0]) for x in xs)
            for c, xs in exchanges.items()}
    assert comm[1.5] > comm[1.0] > 0
    for s, cost, padded_cost in zip(node.strategies, node.costs, padded.candidates[node.node.name].costs):
        assert s.exchange_axis == 0 and dict(s.assignment) == {"t": (0,), "e": (0,)}
        assert padded_cost - comm[1.5] == pytest.approx(1.5 * (cost - comm[1.0]), abs=2)


def test_plan_lists_the_exchanges_and_round_trips_through_json():
    mp = _ep_problem("4", 1.25)
    plan = solve_model_problem(mp, model_name="mixtral").plan
    assert plan.expert_parallel() == {"model.layers.0.mlp.experts": 0, "model.layers.1.mlp.experts": 0}
    again = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again.capacity_factor == 1.25 and again.expert_parallel() == plan.expert_parallel()
    planned = expected_collectives(again)
    assert planned == expected_collectives(plan)
    exchanges = [c for c in planned if c.edge.endswith(":exchange")]
    assert len(exchanges) == 2 * 5 and sum(c.routed for c in exchanges) == 2 * 4
    node_costs = sum(n.cost for n in plan.nodes.values())
    assert node_costs + sum(e.cost for e in plan.edges) == plan.total_cost


def test_routed_bytes_may_differ_from_the_plan_but_nothing_else():
    planned = [Collective("e", "all_to_all", 0, 96, "forward", routed=True), Collective("f", "all_gather", 0, 8, "forward")]
    assert same_collectives([Collective("e", "all_to_all", 0, 40, "forward", routed=True), planned[1]], planned)
    assert not same_collectives([planned[0], Collective("f", "all_gather", 0, 9, "forward")], planned)
    assert not same_collectives([Collective("e", "all_to_all", 1, 96, "forward", routed=True), planned[1]], planned)
    assert not same_collectives(planned[:1], planned)


def test_expert_parallel_pin_errors_name_the_problem_and_the_fix():
    _, _, graph = mixtral()
    with pytest.raises(AutoshardError, match=r"--expert-parallel 1: mesh 4 has no axis 1 .* name one of 0"):
        build_model_problem(graph, "4", expert_parallel=1)
    with pytest.raises(AutoshardError, match=r"--expert-parallel 0: model.layers.0.mlp.experts has no expert-parallel "
                                             r"layout on mesh axis 0 \(its experts or tokens do not divide by 16\)"):
        build_model_problem(graph, "16", expert_parallel=0)
    with pytest.raises(AutoshardError, match=r"--capacity-factor 0.5 is below 1"):
        build_model_problem(graph, "4", capacity_factor=0.5)
    mlp = load_model(str(ROOT / "examples" / "mlp.py"))
    with pytest.raises(AutoshardError, match=r"has no mixture-of-experts layer"):
        build_model_problem(trace(mlp.model, mlp.example_inputs), "2", expert_parallel=0)


@pytest.mark.parametrize("mesh,axis", [("4", 0), ("2x2", 1)])
def test_torchtitan_baseline_is_expert_parallel_with_fsdp_and_never_beats_the_optimum(mesh, axis):
    _, _, graph = mixtral()
    mp = build_model_problem(graph, mesh, mode="training")
    choice = torchtitan_choice(mp)
    plan = make_plan(mp, choice)
    assert set(plan.expert_parallel().values()) == {axis} and len(plan.expert_parallel()) == 2
    dense = plan.param_specs["model.layers.0.self_attn.q_proj.weight"]
    assert 0 in dense.used_axes  # FSDP: stored split over the first axis
    if mesh == "2x2":
        assert plan.nodes["linear"].in_specs[1].dims[0] == (1,)  # q_proj column-parallel on the last axis
    optimum = solve_model_problem(mp).solution
    assert optimum.status == "optimal" and optimum.cost <= mp.problem.cost(choice)


def test_command_line_names_expert_parallel_layers_and_the_capacity_factor(capsys, tmp_path):
    out_file = tmp_path / "plan.json"
    code = main([MIXTRAL, "--mesh", "2x2", "--mode", "training", "--expert-parallel", "1", "--capacity-factor", "1.5",
                 "--baseline", "torchtitan", "--quiet", "--tables", "none", "--out", str(out_file)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert ("expert parallel: 2 of 2 MoE layers, model.layers.0.mlp.experts, model.layers.1.mlp.experts over mesh "
            "axis 1 (tokens sent to their experts by all-to-all, priced at balanced routing with capacity factor 1.5)"
            in out)
    assert "torchtitan baseline: " in out and "proved optimal" in out
    saved = json.loads(out_file.read_text())
    assert saved["capacity_factor"] == 1.5 and set(saved["expert_parallel"].values()) == {1}
    assert main([MIXTRAL, "--mesh", "4", "--expert-parallel", "3", "--quiet"]) == 2
    assert "error: --expert-parallel 3: mesh 4 has no axis 3" in capsys.readouterr().err
