"""The model problem builder on hand-built graphs, against brute force over every plan."""

from __future__ import annotations

import itertools

import pytest

from autoshard.problem.build import BuildOptions, ModelProblem, build_problem
from autoshard.cost.communication import make_cost_model
from autoshard.errors import AutoshardError
from autoshard.solver.model.problem import FORBIDDEN
from autoshard.frontend.graph import NodeKind
from autoshard.lower.slapo import schedule_lines
from autoshard.sharding.mesh import parse_mesh
from autoshard.problem.readback import make_plan
from tests.graphs import mlp_graph


def brute_force(mp: ModelProblem) -> tuple[int, list[int]] | None:
    """The cheapest plan that fits the memory limit, by enumerating every choice of the graph's
    nodes that uses no forbidden pair (auxiliary memory nodes follow their owners; tiny problems only)."""
    p = mp.problem
    n = len(mp.names)
    earlier: list[list[tuple[int, object, bool]]] = [[] for _ in range(n)]
    for (u, v), m in zip(p.edges, p.edge_costs):
        if u < n and v < n:
            earlier[max(u, v)].append((min(u, v), m, u < v))
    best = None
    choice = [0] * n

    def extend(i: int) -> None:
        nonlocal best
        if i == n:
            full = mp.complete(choice)
            ev = p.evaluate(full)
            if ev.feasible and (best is None or ev.cost < best[0]):
                best = (ev.cost, full)
            return
        for s in range(p.num_strategies(i)):
            if all((m[choice[j], s] if forward else m[s, choice[j]]) < FORBIDDEN for j, m, forward in earlier[i]):
                choice[i] = s
                extend(i + 1)

    extend(0)
    return best


def layouts(mp: ModelProblem, choice: list[int], kind: NodeKind) -> dict[str, str]:
    return {n: mp.candidates[n].strategies[c].out_spec.format(mp.mesh.ndim)
            for n, c in zip(mp.names, choice) if mp.candidates[n].node.kind == kind}


def build(graph, mesh="8", cost="alpha-beta", **options) -> ModelProblem:
    m = parse_mesh(mesh)
    return build_problem(graph, m, make_cost_model(cost, m), BuildOptions(**options))


def test_seed_mlp_under_slapo_costs_matches_the_seed():
    mp = build(mlp_graph(), cost="slapo", slapo_space=True)
    every = sorted({mp.problem.cost(mp.complete(list(c))) for c in itertools.product(
        *[range(mp.problem.num_strategies(i)) for i in range(len(mp.names))])})
    for seen in (1507328, 1048576, 655360, 589824, 131072):
        assert seen in every
    cost, choice = brute_force(mp)
    assert cost == 131072
    plan = make_plan(mp, choice)
    assert schedule_lines(plan, mp.graph) == [
        'sch["fc1"].sync(mode="fwd_pre", sync_op_or_fn="RR->SR")',
        'sch["fc2"].sync(mode="fwd_post", sync_op_or_fn="SR->RR")',
    ]


def test_slapo_space_splits_every_linear():
    mp = build(mlp_graph(), cost="slapo", slapo_space=True)
    for name in ("linear", "linear_1"):
        assert all(s.degree > 1 for s in mp.candidates[name].strategies)


def test_inference_default_model_shards_tokens_and_replicates_weights():
    mp = build(mlp_graph())
    cost, choice = brute_force(mp)
    params = layouts(mp, choice, NodeKind.PARAM)
    assert set(params.values()) <= {"RR", "R"}
    ops = layouts(mp, choice, NodeKind.OP)
    assert ops["linear"] in ("SRR", "RSR") and ops["linear_1"] == ops["linear"]


def test_training_prefers_data_parallel_until_memory_forces_tensor_parallel():
    graph = mlp_graph(12, 256, 256, 1024)  # activations outweigh weights: data parallelism is cheapest
    free = build(graph, mode="training")
    cost, choice = brute_force(free)
    assert set(layouts(free, choice, NodeKind.PARAM).values()) <= {"RR", "R"}
    peak = free.problem.peak_usage(choice)
    tight = build(graph, mode="training", memory_budget=int(0.65 * peak))
    tight_cost, tight_choice = brute_force(tight)
    assert tight_cost > cost
    assert tight.problem.peak_usage(tight_choice) <= int(0.65 * peak)
    weights = {n: s for n, s in layouts(tight, tight_choice, NodeKind.PARAM).items() if n.endswith("weight")}
    assert all("S" in s for s in weights.values()), weights


def test_training_gradient_all_reduce_is_charged_for_replicated_weights():
    mp = build(mlp_graph(12, 256, 256, 1024), mode="training")
    edge = next(e for e in mp.edges if e.src == "fc1_weight")
    assert edge.backward
    dp = next(j for j, s in enumerate(mp.candidates["linear"].strategies) if s.assignment == (("b1", (0,)),))
    rep = next(i for i, s in enumerate(mp.candidates["fc1_weight"].strategies) if s.out_spec.is_replicated)
    assert mp.problem.edge_costs[edge.index][rep, dp] > 0  # the all-reduce of a partial weight gradient


def test_memory_budget_is_the_usage_limit_and_inference_usage_is_local_bytes():
    mp = build(mlp_graph(), memory_budget=10**9)
    assert mp.problem.usage_limit == 10**9
    weight = mp.candidates["fc1_weight"]
    stored = next(item for item in weight.items if item.what == "parameter")
    sizes = {s.out_spec.format(1): u for s, u in zip(weight.strategies, stored.usage)}
    assert sizes["RR"] == 4096 * 1024 * 4 and sizes["SR"] == sizes["RR"] // 8


def test_pins_restrict_strategies():
    mp = build(mlp_graph(), pins={"fc1.weight": "SR"})
    weight = mp.candidates["fc1_weight"]
    assert {s.out_spec.format(1) for s in weight.strategies} == {"SR"}
    assert {u.use.format(1) for u in weight.storage} == {"SR", "RR"}  # used as stored, or gathered (FSDP)


@pytest.mark.parametrize("pin,match", [
    ({"fc3.weight": "SR"}, "no tensor or node named"),
    ({"fc1.weight": "SRS"}, "dims"),
    ({"fc1.weight": "S1R"}, "axis"),
])
def test_bad_pins_get_one_line_errors(pin, match):
    with pytest.raises(AutoshardError, match=match) as err:
        build(mlp_graph(), pins=pin)
    assert "\n" not in str(err.value)


def test_indivisible_pin_names_the_shape():
    """4100 rows cut 8 ways are pieces of 513 and a last of 509 (torch.chunk); 5 rows leave 3 pieces empty."""
    build(mlp_graph(8, 1024, 1024, 4100), pins={"fc1.weight": "SR"})
    with pytest.raises(AutoshardError, match="does not divide"):
        build(mlp_graph(8, 1024, 1024, 5), pins={"fc1.weight": "SR"})


def test_a_mesh_that_cuts_nothing_warns_and_replicates():
    mp = build(mlp_graph(3, 5, 7, 11))
    assert any("cuts no shardable dim" in w for w in mp.warnings)
    assert all(len(mp.candidates[n].strategies) == 1 for n in ("linear", "gelu", "linear_1"))


def test_plan_json_round_trip(tmp_path):
    from autoshard.problem.plan import Plan

    mp = build(mlp_graph(12, 256, 256, 1024), mode="training")
    _, choice = brute_force(mp)
    plan = make_plan(mp, choice, model="MLP")
    path = tmp_path / "plan.json"
    plan.save(path)
    again = Plan.load(path)
    assert again.to_json() == plan.to_json()
    assert again.total_cost == mp.problem.cost(choice)


def test_malformed_plan_files_get_one_line_errors(tmp_path):
    from autoshard.problem.plan import Plan

    path = tmp_path / "plan.json"
    path.write_text("{not json")
    with pytest.raises(AutoshardError, match="not JSON"):
        Plan.load(path)
    path.write_text('{"version": 1}')
    with pytest.raises(AutoshardError, match="malformed"):
        Plan.load(path)
    with pytest.raises(AutoshardError, match="does not exist"):
        Plan.load(tmp_path / "missing.json")
