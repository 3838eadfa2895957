"""Overlap as priced: the collectives ``cost/overlap.py`` hides run ahead, everything else blocking.

Plans of a LLaMA and GPT-2 on forked gloo ranks, built with overlap on (the presets' FSDP2 and
DDP behaviour) and off (``--no-overlap``), with parameters stored sharded (FSDP) or replicated
(DDP): outputs and gradients equal the unsharded model's, and the executed collectives equal
the plan's list, compared per edge and pass in execution order (``same_collectives``), each
with its ``ahead`` flag: the hidden edges' forward gathers (issued a layer ahead) and gradient
reductions (waited during the next layer's backward), and their gathers again in the backward
(recomputation, re-gather; issued a layer ahead in the backward's order) are ahead, nothing else is.
"""

from __future__ import annotations

import pytest

from autoshard.cost.communication import make_cost_model
from autoshard.problem.baselines.torchtitan import torchtitan_choice
from autoshard.problem.build import BuildOptions, build_problem
from autoshard.problem.readback import make_plan
from autoshard.runtime.checks import expected_collectives, same_collectives
from autoshard.runtime.collectives import BACKWARD, FORWARD, RECOMPUTE
from autoshard.sharding.mesh import parse_mesh

from .dist import run_ranks
from .plans import data_parallel_choice, reference, traced
from .test_executor import TOLERANCE, Case, _run_cases


def _plans(model: str, mesh: str) -> list[Case]:
    """torchtitan's plan (FSDP on the first axis, re-gathered for backward in the layers; tensor
    parallel on the second) and data parallelism (DDP), with overlap on and off."""
    t = traced(model)
    outputs, grads = reference(t, True)
    cases = []
    m = parse_mesh(mesh)
    for overlap in (True, False):
        mp = build_problem(t.graph, m, make_cost_model("alpha-beta", m), BuildOptions(mode="training", overlap=overlap))
        for storage, choice in (("fsdp", torchtitan_choice(mp)), ("ddp", data_parallel_choice(mp))):
            plan = make_plan(mp, choice, model=t.name)
            cases.append(Case(f"{storage}, overlap {'on' if overlap else 'off'}", plan, outputs, grads))
    budget = BuildOptions(mode="training", overlap=True, memory_budget=10**15)  # recomputation offered
    mp = build_problem(t.graph, m, make_cost_model("alpha-beta", m), budget)
    cases.append(Case("fsdp recomputed, overlap on", make_plan(mp, torchtitan_choice(mp), model=t.name), outputs, grads))
    return cases


@pytest.mark.parametrize("model,mesh", [("llama", "2"), ("gpt2", "2x2")])
def test_hidden_collectives_run_ahead_and_the_rest_blocking(model: str, mesh: str) -> None:
    cases = _plans(model, mesh)
    results = run_ranks(cases[0].plan.mesh.size, _run_cases, traced(model), cases, timeout=150)
    for k, case in enumerate(cases):
        where = f"{model} on {mesh}, {case.label}"
        expected = expected_collectives(case.plan)
        ahead = {(c.phase, c.kind) for c in expected if c.ahead}
        if case.label.endswith("on"):
            assert any(e.hidden for e in case.plan.edges), where
            assert (BACKWARD, "all_reduce") in ahead if case.label.startswith("ddp") else (FORWARD, "all_gather") in ahead
            if model == "llama" and case.label.startswith("fsdp"):  # layer gathers again in backward, ahead too
                again = RECOMPUTE if "recomputed" in case.label else BACKWARD
                assert {(BACKWARD, "reduce_scatter"), (again, "all_gather")} <= ahead, where
            assert not any(c.ahead for c in expected if c.phase == FORWARD and c.kind != "all_gather"), where
        else:
            assert not ahead and not any(e.hidden for e in case.plan.edges), where
        for rank, outcome in enumerate(r[k] for r in results):
            bad = {name: err for name, (_, err) in outcome.errors.items() if not err <= TOLERANCE}
            assert not bad, f"{where}: relative errors above {TOLERANCE} on rank {rank}: {bad}"
            assert same_collectives(outcome.collectives, expected), f"{where}: rank {rank} ran other collectives"
