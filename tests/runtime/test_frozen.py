"""Frozen parameters and in-place slice fills through the run check and training, on forked gloo ranks.

For each model (a frozen Linear, frozen embeddings, LoRA on frozen bases, DeepSeek-style slice
copies) and mesh, the solver's plan under a compute-bound cost model (which shards) and the
Megatron plan run ``autoshard.run``'s own step (``_sharded_step`` against ``_reference``): the
outputs and the trainable parameters' gradients match the unsharded model, and a frozen
parameter has no gradient to report. Then three AdamW steps (``autoshard.train``'s optimizer)
leave every frozen piece bit for bit as it was and change the trained ones.
"""

from __future__ import annotations

import argparse

import pytest
import torch
from torch import nn

from autoshard.api import build_model_problem, default_solve_options, solve_model_problem
from autoshard.problem.baselines.megatron import megatron_choice
from autoshard.errors import AutoshardError
from autoshard.frontend.trace import trace
from autoshard.frontend.graph import OpGraph
from autoshard.problem.plan import Plan
from autoshard.problem.readback import make_plan
from autoshard.cli.run import Prepared, _loss_weights, _reference, _sharded_step
from autoshard.runtime.checks import check_model, expected_collectives, relative_errors, same_collectives
from autoshard.runtime.executor import parallelize
from autoshard.runtime.placements import distribute, local_of
from autoshard.runtime.groups import MeshGroups
from autoshard.cli.training import make_optimizer
from tests.frozen import FrozenEmbedding, LoRAMLP, SliceFills, frozen_linears, inputs

from .dist import run_ranks

TOLERANCE = 1e-5
MODELS = {"frozen-linear": frozen_linears, "frozen-embedding": FrozenEmbedding, "lora": LoRAMLP,
          "slice-fills": SliceFills}


def _plans(model: nn.Module, x: tuple[torch.Tensor, ...], mesh: str) -> tuple[OpGraph, dict[str, Plan]]:
    """The traced graph, the solver's compute-bound training plan and Megatron's."""
    graph = trace(model, x)
    mp = build_model_problem(graph, mesh, mode="training", peak_flops=1e6, memory_bandwidth=1e6)
    solved = solve_model_problem(mp, default_solve_options(mp, 30)).plan
    return graph, {"solved": solved, "megatron": make_plan(mp, megatron_choice(mp))}


def _train(parallel: nn.Module, x: tuple[torch.Tensor, ...], groups: MeshGroups, steps: int = 3) -> None:
    """``steps`` AdamW steps of loss = sum(output * R) with autoshard.train's optimizer."""
    optimizer = make_optimizer(parallel, argparse.Namespace(lr=1e-2, weight_decay=0.1))
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        local = parallel(*x)
        spec = parallel.output_specs[0]
        shape = tuple(n * spec.shard_factor(d, groups.mesh.shape) for d, n in enumerate(local.shape))
        weight = _loss_weights([torch.empty(shape)], torch.device("cpu"))[0]
        (local * distribute(weight, spec, groups)).sum().backward()
        optimizer.step()


def _run(rank: int, world: int, model: nn.Module, x: tuple[torch.Tensor, ...], graph: OpGraph,
         plans: dict[str, Plan]) -> dict[str, dict]:
    """Each plan's run check (errors, gradient names, frozen flags) and training outcome on this rank."""
    results = {}
    for label, plan in plans.items():
        groups = MeshGroups.create(plan.mesh)
        prep = Prepared(plan=plan, model=model, inputs=x, graph=graph, device=torch.device("cpu"))
        parallel = parallelize(model, plan, groups, graph=graph)
        outputs, grads = _sharded_step(prep, parallel, groups, training=True)
        model.zero_grad(set_to_none=True)
        ref_outputs, ref_grads = _reference(prep, training=True)
        errors = relative_errors({f"output {k}": o for k, o in enumerate(outputs)},
                                 {f"output {k}": o for k, o in enumerate(ref_outputs)})
        errors |= relative_errors(grads, ref_grads)
        frozen = {n for n, p in parallel.named_parameters() if not p.requires_grad}
        no_grads = all(p.grad is None for n, p in parallel.named_parameters() if n in frozen)
        collectives = same_collectives(parallel.collectives(), expected_collectives(plan))
        before = {n: local_of(p).detach().clone() for n, p in parallel.named_parameters()}
        _train(parallel, x, groups)
        after = {n: local_of(p).detach() for n, p in parallel.named_parameters()}
        results[label] = {"worst": max(rel for _, rel in errors.values()), "grads": sorted(grads),
                          "reference": sorted(ref_grads), "frozen": sorted(frozen), "no_grads": no_grads,
                          "collectives": collectives, "shards": not plan.shards_nothing(),
                          "unchanged": sorted(n for n in before if torch.equal(before[n], after[n]))}
    return results


@pytest.mark.parametrize("mesh", ["2x2", "4"])
@pytest.mark.parametrize("name", list(MODELS))
def test_frozen_weights_and_slice_fills_pass_the_run_check_and_stay_frozen_in_training(name: str, mesh: str) -> None:
    model = MODELS[name]()
    model.eval()
    x = inputs(model)
    graph, plans = _plans(model, x, mesh)
    frozen = sorted(n for n, p in model.named_parameters() if not p.requires_grad)
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    results = run_ranks(4, _run, model, x, graph, plans, timeout=120)
    assert plans["solved"].proved_optimal
    for label, got in results[0].items():
        where = f"{name} on {mesh}, {label} plan"
        assert got["shards"] or label == "megatron", where
        assert got["worst"] <= TOLERANCE, f"{where}: relative error {got['worst']}"
        assert got["grads"] == got["reference"] == trainable, where  # frozen ones are not reported
        assert got["frozen"] == frozen and got["no_grads"] and got["collectives"], where
        assert got["unchanged"] == frozen, where  # bit for bit; every trained parameter moved


def test_a_plan_made_with_the_weights_trainable_is_refused_for_the_frozen_model() -> None:
    trainable, frozen = frozen_linears(frozen=False), frozen_linears()
    _, plans = _plans(trainable, inputs(trainable), "2")
    with pytest.raises(AutoshardError) as info:
        check_model(plans["megatron"], trace(frozen, inputs(frozen)))
    assert "the plan has fc1_weight (shape (32, 16)), this model fc1_weight (frozen, shape (32, 16))" in str(info.value)


def test_a_training_plan_of_a_model_with_nothing_to_train_is_refused_in_one_line() -> None:
    model = frozen_linears()
    model.fc2.requires_grad_(False)
    graph = trace(model, inputs(model))
    with pytest.raises(AutoshardError, match=r"^--mode training, but no output depends on a trainable parameter "
                                             r"\(frozen ones, requires_grad=False, are not trained\): plan --mode "
                                             r"inference, or unfreeze what should train$"):
        build_model_problem(graph, "2", mode="training")
    assert build_model_problem(graph, "2", mode="inference").problem.num_nodes > 0
