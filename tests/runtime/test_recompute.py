"""Recomputed layers and re-gathered parameters, run on forked gloo ranks against the unsharded model.

Plans that recompute every repeated layer (torch.utils.checkpoint) and that store parameters
sharded and gather them again for backward (FSDP's reshard-after-forward) must compute the same
outputs and gradients, run exactly the collectives the plan lists (the recomputation's reshards,
the second gather), and cost what the builder charged for them.
"""

from __future__ import annotations

import pytest

from autoshard.problem.baselines.torchtitan import torchtitan_choice
from autoshard.problem.build import BuildOptions, ModelProblem, build_problem
from autoshard.cost.communication import make_cost_model
from autoshard.problem.readback import make_plan
from autoshard.runtime.collectives import BACKWARD, RECOMPUTE
from autoshard.runtime.checks import expected_collectives, same_collectives
from autoshard.sharding.mesh import parse_mesh

from .dist import run_ranks
from .plans import data_parallel_choice, reference, traced
from .test_executor import TOLERANCE, Case, _charged_ticks, _run_cases


def _problem(name: str, mesh: str, policy: str = "full") -> ModelProblem:
    """A training problem under a (loose) memory budget, so recomputation (by ``policy``) is a choice."""
    m = parse_mesh(mesh)
    return build_problem(traced(name).graph, m, make_cost_model("alpha-beta", m),
                         BuildOptions(mode="training", memory_budget=10**15, recompute=policy))


def recompute_everything(mp: ModelProblem, choice: list[int]) -> list[int]:
    """``choice`` with every block recomputed."""
    index = {n: i for i, n in enumerate(mp.names)}
    fixed = list(choice[: len(mp.names)])
    for name in mp.blocks.block_of:
        half = len(mp.candidates[name].strategies) // 2
        fixed[index[name]] = fixed[index[name]] % half + half
    return mp.with_storage_of_users(fixed)


def store_sharded(mp: ModelProblem, choice: list[int], regather: bool) -> list[int]:
    """``choice`` with every parameter that can stored sharded and gathered for its owner (FSDP),
    kept until backward or gathered again for it (not where the owner is recomputed: that
    gathers it again anyway)."""
    full = mp.with_storage_of_users(choice)
    index = {n: i for i, n in enumerate(mp.names)}
    for name, cand in mp.candidates.items():
        if cand.storage is None or cand.storage[0].use is None:
            continue
        now = full[index[name]]
        again = cand.recompute is not None and cand.recompute[now]
        options = [i for i, s in enumerate(cand.storage) if s.regather == regather and s.use == cand.storage[now].use
                   and cand.strategies[i].out_spec != s.use and (cand.recompute is None or cand.recompute[i] == again)]
        if options:
            full[index[name]] = options[0]
    return mp.complete(full)


@pytest.mark.parametrize("model,mesh", [("gpt2", "2"), ("llama", "2x2"), ("tiny_mlp", "4")])
def test_recomputed_and_regathered_plans_match_reference(model: str, mesh: str) -> None:
    t = traced(model)
    mp = _problem(model, mesh)
    base = data_parallel_choice(mp) if model == "tiny_mlp" else mp.with_storage_of_users([0] * len(mp.names))
    chosen = {"regather": store_sharded(mp, base, regather=True)}
    if mp.blocks.block_of:
        gathered = recompute_everything(mp, store_sharded(mp, base, regather=False))
        chosen["recompute"] = gathered
        chosen["both"] = store_sharded(mp, gathered, regather=True)
        chosen["torchtitan"] = torchtitan_choice(mp)
    outputs, grads = reference(t, True)
    cases = [Case(label, make_plan(mp, choice, model=t.name), outputs, grads) for label, choice in chosen.items()]
    assert any(e.regather for e in cases[0].plan.edges)
    results = run_ranks(cases[0].plan.mesh.size, _run_cases, t, cases, timeout=150)
    for k, case in enumerate(cases):
        plan, where = case.plan, f"{model} on {mesh}, {case.label}"
        expected = expected_collectives(plan)
        if case.label != "regather":
            assert plan.recompute and any(c.phase == RECOMPUTE for c in expected), where
        for rank, outcome in enumerate(r[k] for r in results):
            bad = {name: err for name, (_, err) in outcome.errors.items() if not err <= TOLERANCE}
            assert not bad, f"{where}: relative errors above {TOLERANCE} on rank {rank}: {bad}"
            assert same_collectives(outcome.collectives, expected), f"{where}: rank {rank} ran other collectives than the plan lists"
        charged = _charged_ticks(plan, results[0][k].collectives)
        for e in plan.edges:
            got = charged.get(f"{e.src}->{e.dst}[{e.operand}]", 0)
            assert abs(got - e.cost) <= 2, f"{where}: {e.src}->{e.dst} executed {got} ticks, charged {e.cost}"
        regathered = [c for c in expected if c.phase == BACKWARD and any(
            e.regather and c.edge == f"{e.src}->{e.dst}[{e.operand}]" and c.kind == "all_gather" for e in plan.edges)]
        if case.label == "regather":
            assert regathered, f"{where}: no parameter is gathered again in backward"


def _check_runs(cases: list[Case], results: list, where: str) -> None:
    """Every rank computed the reference, ran the plan's collectives, and each edge cost what it was charged."""
    for k, case in enumerate(cases):
        plan, label = case.plan, f"{where}, {case.label}"
        expected = expected_collectives(plan)
        for rank, outcome in enumerate(r[k] for r in results):
            bad = {name: err for name, (_, err) in outcome.errors.items() if not err <= TOLERANCE}
            assert not bad, f"{label}: relative errors above {TOLERANCE} on rank {rank}: {bad}"
            assert same_collectives(outcome.collectives, expected), f"{label}: rank {rank} ran other collectives"
        charged = _charged_ticks(plan, results[0][k].collectives)
        for e in plan.edges:
            got = charged.get(f"{e.src}->{e.dst}[{e.operand}]", 0)
            assert abs(got - e.cost) <= 2, f"{label}: {e.src}->{e.dst} executed {got} ticks, charged {e.cost}"


@pytest.mark.parametrize("model,mesh", [("llama", "2x2"), ("llama", "4")])
def test_selectively_recomputed_plans_match_reference(model: str, mesh: str) -> None:
    """torchtitan's plan under the selective policy: the kept matmuls and attention are neither
    run again nor resharded again into (their edges from other ops have no recompute pass), the
    rest of each layer is; outputs, gradients, collectives (per edge and pass, in order) and
    per-edge costs as charged."""
    t = traced(model)
    mp = _problem(model, mesh, "selective")
    plan = make_plan(mp, torchtitan_choice(mp), model=t.name)
    assert plan.recompute and plan.recompute_kept, "the selective plan keeps nothing"
    kept, expected = set(plan.recompute_kept), expected_collectives(plan)
    recomputed = {c.edge for c in expected if c.phase == RECOMPUTE}
    into_kept = [e for e in plan.edges if e.dst in kept and e.steps and plan.nodes[e.src].op is not None]
    assert all(f"{e.src}->{e.dst}[{e.operand}]" not in recomputed for e in into_kept)
    assert into_kept or mesh == "4", "no activation is resharded into a kept op: the case this test is for"
    assert any(c.phase == RECOMPUTE for c in expected)
    outputs, grads = reference(t, True)
    cases = [Case("selective", plan, outputs, grads)]
    _check_runs(cases, run_ranks(plan.mesh.size, _run_cases, t, cases, timeout=150), f"{model} on {mesh}")
