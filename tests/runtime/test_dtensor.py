"""Plans exported as torchtitan-style PyTorch code, exec'd on forked gloo ranks against the unsharded model.

The printed ``build_mesh`` / ``parallelize`` / ``loss_context`` must give the unsharded model's
outputs and parameter gradients: each data-parallel rank feeds its slice of the batch and
compares its slice of the outputs; gradients (summed over data-parallel ranks by FSDP, each rank's
loss its share of the whole batch's, ``loss_share``) are gathered whole. On 2x2: the LLaMA example's optimum
(every rank computes everything), its Megatron-style plan pinned as torchtitan shards it (FSDP
on axis 0, tensor parallelism on axis 1, vocabulary-sharded logits under loss_parallel), GPT-2's
optimum and a data-parallel GPT-2 plan; and LLaMA with its own loss in the graph (the plan
``autoshard.solve --mode training`` makes), whose logits are gathered for the cross-entropy.
Plans PyTorch's APIs cannot express must say why.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils import _pytree as pytree

from autoshard.api import solve_model_problem
from autoshard.frontend.graph import NodeKind
from autoshard.lower.dtensor import export_dtensor
from autoshard.problem.plan import Plan
from autoshard.problem.readback import make_plan
from autoshard.runtime.checks import relative_errors
from autoshard.cli.train import quiet_dtensor_hints

from .dist import run_ranks
from .plans import (Traced, batch_pins, data_parallel_choice, loss_weights, megatron_pins, plans, problem,
                    sequence_parallel_plan, traced)

TOLERANCE = 1e-5
MEGATRON_MLP = '''"""tiny_mlp's autoshard plan on mesh 2 in PyTorch's own APIs (torchtitan style).

Mesh dims: "tp" (tp); every rank gets the whole batch. Each rank's loss is its share of the whole batch's (loss_share).
"""

from contextlib import nullcontext
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def build_mesh(device_type="cuda"):
    """The 2 device mesh with named dims (call on every rank)."""
    return init_device_mesh(device_type, (2,), mesh_dim_names=('tp',))


def parallelize(model, mesh):
    """Shard ``model`` in place as the plan does; returns it."""
    apply_tp(model, mesh)
    return model


def apply_tp(model, mesh):
    """Tensor parallelism: the modules the plan shards, each with its style."""
    parallelize_module(model, mesh["tp"], {
        "fc1": ColwiseParallel(),
        "fc2": RowwiseParallel(),
    })


def loss_context():
    """Run the loss and its backward inside this context."""
    return nullcontext()


def loss_share(loss):
    """This rank's share of the whole batch's loss: its loss over the rows it holds, of 1 slice."""
    return loss
'''


@dataclass
class Export:
    """One exported plan to run: the model, the source, and whether to train."""

    label: str
    model: str
    source: str
    training: bool


def _exported(label: str, model: str, plan: Plan) -> Export:
    t = traced(model)
    export = export_dtensor(plan, t.graph, t.model)
    assert not export.notes, f"{label}: {export.notes}"
    return Export(label, model, export.source, plan.mode == "training")


def _logits(out: object) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else pytree.tree_leaves(out)[0]


def _loss_kind(model: str) -> str:
    """``own``: the model returns its loss; ``lm``: token ids in, logits out, trained with cross-entropy under
    loss_context; ``sum``: loss = sum(output * R)."""
    t = traced(model)
    if _output_is_scalar(t):
        return "own"
    return "lm" if t.inputs[0].dtype == torch.long else "sum"


def _output_is_scalar(t: Traced) -> bool:
    output = next(n for n in t.graph if n.kind == NodeKind.OUTPUT)
    meta = t.graph[output.inputs[0]].tensor
    return meta is not None and meta.shape == ()


def _labels(inputs: tuple[torch.Tensor, ...], vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, inputs[0].shape, generator=torch.Generator().manual_seed(3))


def _loss(kind: str, out: torch.Tensor, inputs: tuple[torch.Tensor, ...], weight: torch.Tensor | None,
          labels: torch.Tensor | None) -> torch.Tensor:
    if kind == "own":
        return out
    if kind == "lm":
        return torch.nn.functional.cross_entropy(out.flatten(0, 1), labels.flatten())
    return (out * weight).sum()


def _reference(model: str, training: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Outputs and gradients of the unsharded model under its test loss (see ``_loss_kind``)."""
    t = traced(model)
    reference = copy.deepcopy(t.model)
    with torch.set_grad_enabled(training):
        out = _logits(reference(*t.inputs))
    if not training:
        return out.detach(), {}
    kind = _loss_kind(model)
    labels = _labels(t.inputs, out.shape[-1]) if kind == "lm" else None
    _loss(kind, out, t.inputs, loss_weights([out])[0] if kind == "sum" else None, labels).backward()
    return out.detach(), {n: p.grad.clone() for n, p in reference.named_parameters()}


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _run_exports(rank: int, world: int, cases: list[Export], wants: list) -> list[dict[str, float]]:
    """Exec each export on its mesh; relative errors of this rank's outputs and the gathered gradients."""
    quiet_dtensor_hints()
    results = []
    for case, (want_out, want_grads) in zip(cases, wants):
        t = traced(case.model)
        namespace: dict = {}
        exec(compile(case.source, f"<{case.label}>", "exec"), namespace)
        mesh = namespace["build_mesh"]("cpu")
        model = namespace["parallelize"](copy.deepcopy(t.model), mesh)
        data = [d for d, name in enumerate(mesh.mesh_dim_names) if name.startswith("dp")]
        parts = math.prod(mesh.size(d) for d in data)
        index = 0
        for d in data:
            index = index * mesh.size(d) + mesh.get_local_rank(d)
        inputs = tuple(x.chunk(parts)[index] for x in t.inputs)
        with torch.set_grad_enabled(case.training):
            out = _logits(model(*inputs))
        share = namespace["loss_share"]
        if out.ndim == 0:  # a loss: each rank's share of the whole batch's; replicas hold the same share
            whole = share(_whole(out)).detach().clone()
            dist.all_reduce(whole)
            errors = relative_errors({"output": whole / (share(torch.tensor(1.0)) * world)}, {"output": want_out})
        else:
            errors = relative_errors({"output": _whole(out)}, {"output": want_out.chunk(parts)[index]})
        if case.training:
            kind = _loss_kind(case.model)
            labels = _labels(t.inputs, want_out.shape[-1]).chunk(parts)[index] if kind == "lm" else None
            weight = loss_weights([want_out])[0].chunk(parts)[index] * parts if kind == "sum" else None
            with namespace["loss_context"]():
                share(_loss(kind, _whole(out) if kind == "sum" else out, inputs, weight, labels)).backward()
            errors |= relative_errors({n: _whole(p.grad) for n, p in model.named_parameters()}, want_grads)
        results.append({name: rel for name, (_, rel) in errors.items()})
    return results


def _check(world: int, cases: list[Export]) -> None:
    wants = [_reference(case.model, case.training) for case in cases]
    for rank_results in run_ranks(world, _run_exports, cases, wants, timeout=150):
        for case, errors in zip(cases, rank_results):
            bad = {k: v for k, v in errors.items() if not v <= TOLERANCE}
            assert not bad, f"{case.label} on {world} ranks: {bad}"
            assert len(errors) == 1 + case.training * len(list(traced(case.model).model.parameters())), case.label


def test_megatron_mlp_source() -> None:
    assert _exported("mlp", "tiny_mlp", plans(traced("tiny_mlp"), "2", "training", 0)["megatron"]).source == MEGATRON_MLP


def test_one_dimensional_exports_run_on_dtensor() -> None:
    mlp = traced("tiny_mlp")
    cases = [_exported(f"mlp {mode}", "tiny_mlp", plans(mlp, "2", mode, 0)["megatron"])
             for mode in ("inference", "training")]
    mp = problem(mlp, "2", "training")
    cases.append(_exported("mlp data parallel", "tiny_mlp", make_plan(mp, data_parallel_choice(mp))))
    cases.append(_exported("sp_block", "sp_block", sequence_parallel_plan(traced("sp_block"), "2", "training")))
    assert 'RowwiseParallel(output_layouts=Shard(1))' in cases[-1].source
    assert '"norm": SequenceParallel(use_local_output=True)' in cases[-1].source
    assert 'ColwiseParallel(input_layouts=Shard(1))' in cases[-1].source
    assert 'dp = mesh["dp"]' in cases[2].source and "fully_shard(model, mesh=dp" in cases[2].source
    _check(2, cases)


def _solved(model: str, mesh: str, pins: dict[str, str] | None = None) -> Plan:
    return solve_model_problem(problem(traced(model), mesh, "training", pins), model_name=model).plan


def test_llama_and_gpt2_plans_on_2x2_export_to_torchtitan_style_code() -> None:
    llama, gpt2 = traced("llama"), traced("gpt2")
    optimum = _solved("llama", "2x2")
    # A tiny model: collectives' latency outweighs splitting any weight.
    assert all(optimum.param_specs[name].is_replicated for name, _ in llama.model.named_parameters())
    torchtitan = _solved("llama", "2x2", megatron_pins(llama, ("o_proj", "down_proj")))
    with_loss = _solved("llama+loss", "2x2", megatron_pins(traced("llama+loss"), ("o_proj", "down_proj")))
    cases = [_exported("mlp megatron", "tiny_mlp", plans(traced("tiny_mlp"), "2x2", "training", 0)["megatron"]),
             _exported("llama optimum", "llama", optimum), _exported("llama torchtitan", "llama", torchtitan),
             _exported("llama+loss torchtitan", "llama+loss", with_loss),
             _exported("gpt2 optimum", "gpt2", _solved("gpt2", "2x2")),
             _exported("gpt2 data parallel", "gpt2", _solved("gpt2", "2x2", batch_pins(gpt2)))]
    assert "mesh_dim_names=('dp', 'tp')" in cases[0].source and 'dp = mesh["dp"]' in cases[0].source
    source = cases[2].source
    assert "mesh_dim_names=('dp', 'tp')" in source and '"model.layers.0.self_attn.q_proj": ColwiseParallel()' in source
    assert '"model.layers.1.mlp.down_proj": RowwiseParallel()' in source
    assert '"lm_head": ColwiseParallel(use_local_output=False)' in source and "return loss_parallel()" in source
    assert 'for module in model.get_submodule("model.layers"):' in source
    assert "parallelize_module" not in cases[1].source and "fully_shard" not in cases[1].source
    # With the loss in the graph the plan gathers the logits before the cross-entropy (after a flatten).
    assert '"lm_head": ColwiseParallel(output_layouts=Replicate())' in cases[3].source
    assert "return nullcontext()" in cases[3].source
    assert 'for module in model.get_submodule("transformer.h"):\n        fully_shard(module, mesh=dp' \
        in cases[5].source and "('dp', 'replica')" in cases[5].source
    _check(4, cases)


def test_choices_the_apis_cannot_express_are_named_and_the_rest_exports() -> None:
    attention, gpt2 = traced("attention"), traced("gpt2")
    conv1d_pins = {"transformer.h.0.mlp.c_fc.weight": "RS1", "transformer.h.0.mlp.c_proj.weight": "S1R"}
    cases = {
        "attention": (plans(attention, "2", "training", 0)["megatron"], attention,
                      "mesh axis 0 (2 devices): input x reaches add as RRS on an axis that shards weights; the "
                      "styles take whole inputs; PyTorch has no API for that, so its ranks compute as replicas"),
        "gpt2 Conv1D": (_solved("gpt2", "2x2", conv1d_pins), gpt2,
                        "its module transformer.h.0.mlp.c_fc (Conv1D) is not an nn.Linear"),
        "gpt2 megatron": (plans(gpt2, "2x2", "inference", 0)["megatron"], gpt2,
                          "mesh axis 0 (2 devices): edge embedding -> add_1 runs all_to_all (SRR->RSR) where the "
                          "axis shards no weight"),
    }
    for label, (plan, t, reason) in cases.items():
        export = export_dtensor(plan, t.graph, t.model)
        assert any(reason in note for note in export.notes), (label, export.notes)
        assert f"# not exported: {export.notes[0]}" in export.source
        namespace: dict = {}
        exec(compile(export.source, f"<{label}>", "exec"), namespace)
        assert callable(namespace["parallelize"])
