"""Plans exported as torch.distributed.tensor.parallel code, exec'd with DTensor on forked gloo ranks.

The printed ``apply_tensor_parallel(model, device_mesh)`` must give the unsharded model's
outputs and parameter gradients; plans PyTorch's styles cannot express must say why instead.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from autoshard.lower.dtensor import export_dtensor
from autoshard.planning import make_plan
from autoshard.runtime.executor import relative_errors

from .dist import run_ranks
from .plans import data_parallel_choice, loss_weights, plans, problem, reference, sequence_parallel_plan, traced

TOLERANCE = 1e-5
MEGATRON_MLP = '''from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def apply_tensor_parallel(model, device_mesh):
    """tiny_mlp's autoshard plan on mesh 2 as PyTorch tensor parallelism."""
    return parallelize_module(model, device_mesh, {
        "fc1": ColwiseParallel(),
        "fc2": RowwiseParallel(),
    })
'''


def _exported(model: str, mesh: str, mode: str) -> str:
    t = traced(model)
    plan = sequence_parallel_plan(t, mesh, mode) if model == "sp_block" else plans(t, mesh, mode, 0)["megatron"]
    export = export_dtensor(plan, t.graph, t.model)
    assert export.source is not None, export.reason
    return export.source


def _run_sources(rank: int, world: int, cases: list[tuple[str, str, bool]]) -> list[dict[str, float]]:
    """Exec each (model, source, training) on a DTensor mesh; relative errors against the reference."""
    mesh = init_device_mesh("cpu", (world,))
    results = []
    for model_name, source, training in cases:
        t = traced(model_name)
        ref_outputs, ref_grads = reference(t, training)
        namespace: dict = {}
        exec(source, namespace)
        model = namespace["apply_tensor_parallel"](copy.deepcopy(t.model), mesh)
        with torch.set_grad_enabled(training):
            out = model(*t.inputs)
        errors = relative_errors({"output": out}, {"output": ref_outputs[0]})
        if training:
            (out * loss_weights([out])[0]).sum().backward()
            grads = {name: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                     for name, p in model.named_parameters()}
            errors |= relative_errors(grads, ref_grads)
        results.append({name: rel for name, (_, rel) in errors.items()})
    return results


def test_megatron_mlp_source() -> None:
    assert _exported("tiny_mlp", "2", "training") == MEGATRON_MLP


@pytest.mark.parametrize("world", [2, 4])
def test_exported_plans_run_on_dtensor(world: int) -> None:
    cases = [("tiny_mlp", _exported("tiny_mlp", str(world), mode), mode == "training") for mode in ("inference", "training")]
    cases.append(("sp_block", _exported("sp_block", str(world), "training"), True))
    assert 'RowwiseParallel(output_layouts=Shard(1))' in cases[-1][1]
    assert '"norm": SequenceParallel(use_local_output=True)' in cases[-1][1]
    assert 'ColwiseParallel(input_layouts=Shard(1))' in cases[-1][1]
    for rank_results in run_ranks(world, _run_sources, cases, timeout=90):
        for (model, _, training), errors in zip(cases, rank_results):
            bad = {k: v for k, v in errors.items() if not v <= TOLERANCE}
            assert not bad, f"{model} ({'training' if training else 'inference'}) on {world} ranks: {bad}"
            assert len(errors) == 1 + training * len(list(traced(model).model.parameters()))


def test_plans_the_styles_cannot_express_say_why() -> None:
    mlp = traced("tiny_mlp")
    mp = problem(mlp, "2", "training")
    cases = {
        "2-D": (plans(mlp, "2x2", "training", 0)["megatron"], mlp, "mesh 2x2 is 2-D"),
        "data-parallel": (make_plan(mp, data_parallel_choice(mp)), mlp, "input x is fed sharded (SRR)"),
        "attention": (plans(traced("attention"), "2", "training", 0)["megatron"], traced("attention"),
                      "edge x -> add reshards RRR->RRS away from any Linear input or output"),
        "gpt2": (plans(traced("gpt2"), "2", "inference", 0)["megatron"], traced("gpt2"),
                 "belongs to no Linear/LayerNorm a style shards"),
    }
    for label, (plan, t, reason) in cases.items():
        export = export_dtensor(plan, t.graph, t.model)
        assert export.source is None and reason in export.reason, (label, export.reason)
