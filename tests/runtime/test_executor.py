"""Plans executed on forked gloo ranks against the unsharded model: numerics, shards and collectives.

One forked run per (model, mesh) executes every plan of both modes through its lowered program
(``runtime/graph``: one GraphModule per rank, run eagerly): Megatron, data-parallel (MLP) and
random choices, each of which must reproduce the reference outputs and every parameter gradient
within 1e-5 relative, hold parameters in their planned local shapes, and run exactly the
collectives the plan lists, with the bytes the cost model charged for each edge. The executed
list is compared with ``expected_collectives`` by ``same_collectives``: per plan edge (or loss
count, or expert exchange) and pass, the same collectives in the same order of execution, each
with its kind, axis, bytes and ``ahead`` flag; the order between edges is the program's and is
not compared (autograd interleaves one edge's gradient steps with a recomputation as it likes).
Errors are those of ``relative_errors``: a reference gradient that is zero up to rounding (BERT's
attention key biases) is judged against a floor of 1e-3 of the largest gradient.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from autoshard.cost.communication import make_cost_model
from autoshard.errors import AutoshardError
from autoshard.problem.plan import Plan
from autoshard.sharding.reshard import REDUCE_SCATTER
from autoshard.runtime.collectives import BACKWARD, FORWARD
from autoshard.runtime.checks import (Collective, check_backend, expected_collectives, relative_errors,
                                      required_collectives, same_collectives)
from autoshard.runtime.executor import parallelize
from autoshard.runtime.placements import distribute, gather_full, local_of
from autoshard.runtime.groups import MeshGroups

from .dist import run_ranks
from .plans import Traced, loss_weights, plans, reference, sequence_parallel_plan, traced

TOLERANCE = 1e-5
# (model, mesh, random plans per mode, data-parallel plan too)
CASES = [
    ("tiny_mlp", "2", 4, True), ("tiny_mlp", "4", 4, True), ("tiny_mlp", "8", 4, True), ("tiny_mlp", "2x2", 4, True),
    ("tiny_mlp", "2x4", 4, True),
    ("attention", "2", 4, False), ("attention", "4", 4, False), ("attention", "8", 3, False),
    ("attention", "2x2", 4, False), ("attention", "2x4", 3, False),
    ("gpt2", "2", 3, False), ("gpt2", "4", 3, False), ("gpt2", "8", 1, False), ("gpt2", "2x2", 3, False),
    ("gpt2", "2x4", 1, False), ("llama", "2", 2, False), ("llama", "4", 1, False), ("llama", "2x2", 1, False),
    ("bert", "4", 2, False), ("cnn", "2x2", 3, False), ("cnn_loss", "4", 3, False), ("encoder", "4", 3, False),
    ("norm_mix", "2x2", 3, False), ("causal", "2", 4, False), ("causal", "4", 4, False), ("causal", "2x2", 4, False),
]


@dataclass
class Case:
    """One plan to run, with the reference it must reproduce."""

    label: str
    plan: Plan
    outputs: list[torch.Tensor]
    grads: dict[str, torch.Tensor]


@dataclass
class Outcome:
    """What one rank observed running one plan (errors of the whole tensors it gathered)."""

    label: str
    errors: dict[str, tuple[float, float]]
    param_shapes: dict[str, tuple[int, ...]]
    collectives: list[Collective]


def _grad(p: nn.Parameter) -> torch.Tensor:
    """This rank's piece of the parameter's gradient (zeros if it got none)."""
    return local_of(p.grad) if p.grad is not None else torch.zeros_like(local_of(p))


def _run_cases(rank: int, world: int, t: Traced, cases: list[Case], compiled: dict | None = None) -> list[Outcome]:
    """Each case's outputs, gradients and collectives on this rank (``compiled``: the program run
    under ``torch.compile(**compiled)``, which logs no collectives)."""
    groups = MeshGroups.create(cases[0].plan.mesh)
    outcomes = []
    for case in cases:
        module = parallelize(t.model, case.plan, groups, graph=t.graph)
        if compiled is not None:
            module.compile(**compiled)
        local = module(*t.inputs)
        local = list(local) if isinstance(local, tuple) else [local]
        # the reference's whole shapes, as a dim the mesh does not divide is cut unevenly (torch.chunk)
        outputs = [gather_full(o.detach(), s, groups, tuple(w.shape))
                   for o, s, w in zip(local, module.output_specs, case.outputs)]
        grads = {}
        if case.plan.mode == "training":
            weights = loss_weights(outputs)
            sum((o * distribute(w, s, groups)).sum() for o, w, s in zip(local, weights, module.output_specs)).backward()
            grads = {name: gather_full(_grad(p), module.param_specs[name], groups, tuple(case.grads[name].shape))
                     for name, p in module.named_parameters()}
        errors = relative_errors({f"output {k}": o for k, o in enumerate(outputs)},
                                 {f"output {k}": o for k, o in enumerate(case.outputs)})
        errors |= relative_errors(grads, case.grads)
        if len(outputs) != len(case.outputs) or set(grads) != set(case.grads):
            errors["structure"] = (float("inf"), float("inf"))
        shapes = {name: tuple(local_of(p).shape) for name, p in module.named_parameters()}
        outcomes.append(Outcome(case.label, errors, shapes, module.collectives()))
    return outcomes


def _charged_ticks(plan: Plan, collectives: list[Collective]) -> dict[str, int]:
    """Per edge, the alpha-beta price of the executed collectives, rounded per pass as the builder does."""
    cost = make_cost_model("alpha-beta", plan.mesh)
    seconds: dict[tuple[str, str], float] = {}
    for c in collectives:
        key = (c.edge, c.phase)
        seconds[key] = seconds.get(key, 0.0) + plan.mesh.latency[c.axis] + c.sent_bytes / plan.mesh.bandwidth[c.axis]
    ticks: dict[str, int] = {}
    for (edge, _), value in seconds.items():
        ticks[edge] = ticks.get(edge, 0) + cost.ticks(value)
    return ticks


@pytest.mark.parametrize("model,mesh,n_random,data_parallel", CASES, ids=[f"{m}-{s}" for m, s, *_ in CASES])
def test_plans_match_reference(model: str, mesh: str, n_random: int, data_parallel: bool) -> None:
    t = traced(model)
    cases = []
    for mode in ("inference", "training"):
        outputs, grads = reference(t, mode == "training")
        for label, plan in plans(t, mesh, mode, n_random, data_parallel).items():
            cases.append(Case(f"{mode}/{label}", plan, outputs, grads))
    results = run_ranks(cases[0].plan.mesh.size, _run_cases, t, cases, timeout=150)
    full_shapes = {name: tuple(p.shape) for name, p in t.model.named_parameters()}
    for k, case in enumerate(cases):
        plan, where = case.plan, f"{model} on {mesh}, {case.label}"
        expected = expected_collectives(plan)
        for rank, outcome in enumerate(r[k] for r in results):
            bad = {name: err for name, (_, err) in outcome.errors.items() if not err <= TOLERANCE}
            assert not bad, f"{where}: relative errors above {TOLERANCE} on rank {rank}: {bad}"
            assert len(outcome.errors) == len(case.outputs) + len(case.grads)
            assert same_collectives(outcome.collectives, expected), \
                f"{where}: rank {rank} ran other collectives than the plan lists"
            coords = plan.mesh.coords(rank)  # this rank's own pieces: shorter where a cut is uneven
            local = {n: plan.param_specs[n].piece_shape(s, coords, plan.mesh.shape) for n, s in full_shapes.items()}
            assert outcome.param_shapes == local, f"{where}: rank {rank} holds other parameter shapes than planned"
        charged = _charged_ticks(plan, results[0][k].collectives)
        assert {e.src + e.dst + str(e.operand): charged.get(f"{e.src}->{e.dst}[{e.operand}]", 0) for e in plan.edges} \
            == {e.src + e.dst + str(e.operand): e.cost for e in plan.edges}, f"{where}: executed bytes priced differently"
        if plan.mode == "training" and case.label.endswith("data-parallel"):
            assert any(c.phase == BACKWARD for c in expected), f"{where}: no gradient all-reduce"
        assert all(c.phase in (FORWARD, BACKWARD) for c in expected)


def test_plan_for_another_model_is_refused_before_running() -> None:
    mlp, attention = traced("tiny_mlp"), traced("attention")
    plan = next(iter(plans(attention, "2", "training", 0).values()))
    with pytest.raises(AutoshardError, match=r"^plan was made for another model \(attention\)"):
        parallelize(mlp.model, plan, graph=mlp.graph)


def test_wrong_world_size_is_refused_before_running() -> None:
    t = traced("tiny_mlp")
    plan = plans(t, "4", "training", 0)["megatron"]
    with pytest.raises(AutoshardError, match=r"plan is for mesh 4 \(4 devices\) but the world has 1 ranks"):
        parallelize(t.model, plan, example_inputs=t.inputs)


def test_unsupported_collective_is_refused() -> None:
    t = traced("tiny_mlp")
    plan = plans(t, "2", "training", 0)["megatron"]
    assert required_collectives(plan) == {"all_reduce"}
    check_backend(plan, "gloo")
    with pytest.raises(AutoshardError, match=r"needs all_reduce, which the gloo backend cannot run: use the nccl backend"):
        check_backend(plan, "gloo", {"gloo": frozenset({"all_gather"}), "nccl": frozenset({"all_reduce"})})
    sequence_parallel = sequence_parallel_plan(traced("sp_block"), "2", "inference")
    assert REDUCE_SCATTER in required_collectives(sequence_parallel)
    with pytest.raises(AutoshardError, match=r"^the plan needs reduce_scatter, which the mpi backend cannot run"):
        check_backend(sequence_parallel, "mpi")


def test_inference_plan_runs_without_autograd_and_on_one_device() -> None:
    t = traced("tiny_mlp")
    plan = plans(t, "1", "inference", 0)["megatron"]
    module = parallelize(t.model, plan, example_inputs=t.inputs)
    out = module(*t.inputs)
    assert not out.requires_grad
    assert relative_errors({"out": out}, {"out": reference(t, False)[0][0]})["out"][1] <= TOLERANCE
    with pytest.raises(AutoshardError, match=r"input x is \(8, 8, 8\) but the plan was made for shape \(8, 8, 16\)"):
        module(torch.zeros(8, 8, 8))


def _sgd_steps(rank: int, world: int, t: Traced, plan_list: list[Plan], steps: int,
               want: dict[str, torch.Tensor]) -> list[dict[str, tuple[float, float]]]:
    """Per plan, the errors of the parameters after ``steps`` SGD steps on local shards, gathered whole."""
    groups = MeshGroups.create(plan_list[0].mesh)
    results = []
    for plan in plan_list:
        module = parallelize(t.model, plan, groups, graph=t.graph)
        optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
        for _ in range(steps):
            optimizer.zero_grad()
            module.reset_log()
            local = module(*t.inputs)
            spec = module.output_specs[0]
            weight = loss_weights([gather_full(local.detach(), spec, groups)])[0]
            (local * distribute(weight, spec, groups)).sum().backward()
            optimizer.step()
            assert module.collectives() == expected_collectives(plan)
        got = {n: gather_full(local_of(p.detach()), module.param_specs[n], groups) for n, p in module.named_parameters()}
        results.append(relative_errors(got, want))
    return results


def test_optimizer_steps_on_local_shards_track_the_reference() -> None:
    t = traced("tiny_mlp")
    named = plans(t, "2x2", "training", 1, data_parallel=True)
    reference_model = copy.deepcopy(t.model)
    optimizer = torch.optim.SGD(reference_model.parameters(), lr=0.01)
    for _ in range(3):
        optimizer.zero_grad()
        out = reference_model(*t.inputs)
        (out * loss_weights([out])[0]).sum().backward()
        optimizer.step()
    want = {n: p.detach() for n, p in reference_model.named_parameters()}
    for rank_results in run_ranks(4, _sgd_steps, t, list(named.values()), 3, want, timeout=60):
        for label, errors in zip(named, rank_results):
            assert max(rel for _, rel in errors.values()) <= TOLERANCE, (label, errors)
