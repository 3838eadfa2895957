"""LLaMA-3-8B's optimum in PyTorch's own APIs, run on a 2-layer LLaMA of the same code on forked gloo ranks.

The structures (tests/lower/structures/, read off the 8B plans by tests/lower/structure.py) are
the optima of LLaMA-3-8B training (bf16-mixed, ``--device h100``, 80 GiB) on mesh 8 and 2x8. On 8: a
column-parallel embedding that hands each rank its batch slice, data-parallel layers with their
weights stored sharded (FSDP), a column-parallel ``lm_head`` on the gathered batch whose logits
go back to the rank's slice for the loss; with eager attention also a recomputed layer and a
layer re-gathering two of its weights for backward. Carried to mesh 4, each exports with no
note, and the exported ``build_mesh`` / ``parallelize`` / ``loss_share`` give the unsharded
model's loss (the ranks' shares summed) and every gradient within 1e-5. The same structure under
the selective policy exports torchtitan's op policy. The 2x8 optima carried to 2x2 export whole as
well: the second axis runs the layers on sequence slices with attention split by heads through
all-to-alls (``lower/sequence.py``, for models that dispatch attention through transformers'
AttentionInterface; others keep the axis as a named note); both run equal to the unsharded model. A plan splitting attention by
query rows names torch's context_parallel and why it cannot run it (``lower/context.py``), and
its export of the rest runs equal too.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from autoshard.cli.train import quiet_dtensor_hints
from autoshard.cost.communication import make_cost_model
from autoshard.lower.dtensor import DTensorExport, export_dtensor
from autoshard.problem.build import BuildOptions, build_problem
from autoshard.problem.readback import make_plan
from autoshard.runtime.checks import relative_errors
from autoshard.sharding.mesh import parse_mesh
from tests.runtime.dist import run_ranks
from tests.runtime.test_uneven import sequence_choice

from .models import tiny_llama3
from .structure import structure_choice

TOLERANCE = 1e-5
STRUCTURES = Path(__file__).parent / "structures"


def _export(structure: str, attention: str, mesh: str, recompute: str = "full",
            model: torch.nn.Module | None = None) -> DTensorExport:
    """The 8B structure ``structure`` on the tiny model (or ``model``, of the same code) and ``mesh``, exported."""
    tiny, _, graph = tiny_llama3(attention)
    model = tiny if model is None else model
    m = parse_mesh(mesh)
    budget = 1 << 40 if recompute != "none" else None  # a budget offers recomputation; this one never binds
    mp = build_problem(graph, m, make_cost_model("alpha-beta", m),
                       BuildOptions(mode="training", memory_budget=budget, recompute=recompute))
    choice = structure_choice(json.loads((STRUCTURES / f"{structure}.json").read_text()), mp)
    return export_dtensor(make_plan(mp, choice, model="llama3_tiny"), graph, model)


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _reference(attention: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model, inputs, _ = tiny_llama3(attention)
    reference = copy.deepcopy(model)
    loss = reference(*inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in reference.named_parameters()}


def _run(rank: int, world: int, cases: list[tuple[str, str]], wants: list) -> list[dict[str, float]]:
    """Each (source, attention) on its mesh: the relative errors of the summed loss shares and the gradients."""
    quiet_dtensor_hints()
    results = []
    for (source, attention), (want_loss, want_grads) in zip(cases, wants):
        model, inputs, _ = tiny_llama3(attention)
        namespace: dict = {}
        exec(compile(source, "<export>", "exec"), namespace)
        mesh = namespace["build_mesh"]("cpu")
        data = [d for d, name in enumerate(mesh.mesh_dim_names) if name.startswith("dp")]
        index = parts = 1
        for d in data:
            index, parts = (index - 1) * mesh.size(d) + mesh.get_local_rank(d) + 1, parts * mesh.size(d)
        sharded = namespace["parallelize"](copy.deepcopy(model), mesh)
        with namespace["loss_context"]():
            share = namespace["loss_share"](sharded(*(x.chunk(parts)[index - 1] for x in inputs)))
            share.backward()
        total = _whole(share).detach().clone()
        dist.all_reduce(total)
        replicas = world / float(1 / namespace["loss_share"](torch.tensor(1.0)))
        grads = {n.replace("_checkpoint_wrapped_module.", ""): _whole(p.grad) for n, p in sharded.named_parameters()}
        errors = relative_errors({"loss": total / replicas}, {"loss": want_loss}) | relative_errors(grads, want_grads)
        results.append({name: rel for name, (_, rel) in errors.items()})
    return results


def _check(world: int, cases: list[tuple[str, str]]) -> None:
    wants = [_reference(attention) for _, attention in cases]
    for rank_results in run_ranks(world, _run, cases, wants, timeout=240):
        for (_, attention), errors in zip(cases, rank_results):
            bad = {k: v for k, v in errors.items() if not v <= TOLERANCE}
            assert not bad, f"{attention}: {bad}"
            assert len(errors) == 1 + len(list(tiny_llama3(attention)[0].parameters()))


def test_llama3_8b_optima_on_mesh_8_export_whole_and_run_equal() -> None:
    fused = _export("llama3_8b_sdpa_8", "sdpa", "4", recompute="none")
    eager = _export("llama3_8b_eager_8", "eager", "4")
    selective = _export("llama3_8b_eager_8", "eager", "4", recompute="selective")
    for export in (fused, eager, selective):
        assert export.notes == () and "not exported" not in export.source
        assert '"model.embed_tokens": ColwiseParallel(output_layouts=Shard(0)),' in export.source
        assert '"lm_head": ColwiseParallel(input_layouts=Shard(0), output_layouts=Shard(0)),' in export.source
        assert "return loss / 4" in export.source
        # the labels meet the loss as each rank's batch slice; the tokens enter the embedding whole
        assert "input_layouts=(Replicate(), Replicate()), desired_input_layouts=(Replicate(), Shard(0))" in export.source
    assert "checkpoint_wrapper" not in fused.source and "reshard_after_forward=False, ignored" in fused.source
    # 8B layer 1 (recomputed) is layer 0 here; 8B layer 9 re-gathers its up and down projections.
    assert "for i in (0,):\n        blocks.register_module(str(i), checkpoint_wrapper(blocks[i], preserve_rng_state" \
           in eager.source
    assert "for path in ('model.layers.1.mlp.down_proj', 'model.layers.1.mlp.up_proj'):" in eager.source
    assert "again = (0,)" in eager.source and "reshard_after_forward=i in again" in eager.source
    assert "checkpoint_wrapper(blocks[i], context_fn=selective_context" in selective.source
    _check(4, [(fused.source, "sdpa"), (eager.source, "eager"), (selective.source, "eager")])


def test_llama3_8b_optima_on_mesh_2x8_export_whole_with_sequence_parallel_blocks_and_run_equal() -> None:
    fused = _export("llama3_8b_sdpa_2x8", "sdpa", "2x2", recompute="none")
    # 8B layers 21 (the MLP column/row-parallel) and 24 (recomputed, the MLP on the slices)
    eager = _export("llama3_8b_eager_2x8", "eager", "2x2")
    for export in (fused, eager):
        assert export.notes == () and "not exported" not in export.source
        assert "mesh_dim_names=('tp', 'sp')" in export.source
        assert '"lm_head": ColwiseParallel(input_layouts=Shard(0), output_layouts=Replicate()),' in export.source
        # the blocks on sequence slices of axis 1; the rotary tables cut the same way; attention by heads
        assert ('"model.layers.0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), '
                'use_local_output=True),') in export.source
        assert '"model.layers.1": PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Replicate()),' \
               in export.source
        assert '"model.rotary_emb": PrepareModuleOutput(output_layouts=(Replicate(), Replicate()), ' \
               'desired_output_layouts=(Shard(1), Shard(1))),' in export.source
        assert 'attention_by_heads(model, sp, "model.layers.0.self_attn")' in export.source
        assert 'along = mesh[(\'tp\', \'sp\')]._flatten("tp_sp")' in export.source
    # fused: every MLP column/row-parallel on the gathered sequence; eager: layer 1's MLP on the slices
    assert '"mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),' in fused.source
    assert "for i in range(2):\n        parallelize_module(blocks[i], sp, {" in fused.source
    assert "('input_layernorm', 'post_attention_layernorm', 'self_attn')], mesh=along" in fused.source
    assert "for i in (0,):\n        parallelize_module(blocks[i], sp, {" in eager.source
    assert "    for i in (1,):\n        fully_shard([blocks[i].get_submodule(p) for p in ('input_layernorm', 'mlp', " \
           "'post_attention_layernorm', 'self_attn')], mesh=along" in eager.source
    assert "for i in (1,):\n        blocks.register_module(str(i), checkpoint_wrapper(" in eager.source
    _check(4, [(fused.source, "sdpa"), (eager.source, "eager")])


def test_a_model_without_transformers_attention_dispatch_keeps_the_heads_split_as_a_note() -> None:
    model, _, graph = tiny_llama3("sdpa")
    unhooked = copy.deepcopy(model)
    unhooked.config = None  # attention not dispatched through transformers' AttentionInterface
    note, = _export("llama3_8b_sdpa_2x8", "sdpa", "2x2", recompute="none", model=unhooked).notes
    assert note.startswith("mesh axis 1 (2 devices): it splits attention ")
    assert note.endswith("the sequence-parallel export does not fit it: the export hooks the all-to-alls into "
                         "transformers' AttentionInterface, and this model does not dispatch its attention through "
                         "one; PyTorch has no API for that, so its ranks compute as replicas here (run the JSON plan "
                         "with autoshard.run for the rest)")


def test_attention_split_by_query_rows_names_context_parallel_and_the_rest_runs() -> None:
    model, _, graph = tiny_llama3("sdpa")
    mesh = parse_mesh("2")
    mp = build_problem(graph, mesh, make_cost_model("alpha-beta", mesh), BuildOptions(mode="training"))
    plan = make_plan(mp, sequence_choice(mp, "rows"), model="llama3_tiny")
    attention = [n for n in graph if n.op == "scaled_dot_product_attention"]
    assert all(plan.nodes[n.name].in_specs[0].dims[-2] == (0,) for n in attention)  # the query rows split
    export = export_dtensor(plan, graph, model)
    assert export.notes == (f"mesh axis 0 (2 devices): it splits attention {attention[0].name} "
                            "(model.layers.0.self_attn) by query rows, the keys and values gathered, which torch's "
                            "context_parallel runs only over SDPA's CUDA kernels and only for a model taking its "
                            "position ids and shifted labels as inputs (it shards the sequence of the tensors it is "
                            "handed); PyTorch has no API for that, so its ranks compute as replicas here (run the "
                            "JSON plan with autoshard.run for the rest)",)
    _check(2, [(export.source, "sdpa")])
