"""Plans that cut a sequence the mesh does not divide run like the unsharded model.

A tiny Hugging Face LLaMA (fused attention, its causal mask materialised by the export) with
the usual shifted next-token loss (``logits[:, :-1]``): one sequence of 31 positions (30 scored)
on 4 gloo ranks, so every sequence dim is cut as ``torch.chunk`` cuts it (8, 8, 8, 7 and
8, 8, 8, 6). The plans the solver picks for LLaMA-3.1-8B at 131072 and 262144 tokens have the
structures checked here: every tensor cut along the sequence wherever a strategy can (the
shifted logits and the loss on pieces), parameters stored split (FSDP), and attention either
split by query rows (context parallelism, keys and values gathered) or by heads (the sequence
exchanged around it) with every layer recomputed. They, and random plans, must reproduce the
reference outputs and every parameter gradient, and run exactly the collectives they list.
"""

from __future__ import annotations

from pathlib import Path

import torch

from autoshard.cost.communication import make_cost_model
from autoshard.frontend.graph import NodeKind
from autoshard.frontend.load import load_model
from autoshard.frontend.trace import trace
from autoshard.problem.baselines.torchtitan import fsdp_storage
from autoshard.problem.build import BuildOptions, ModelProblem, build_problem
from autoshard.problem.readback import make_plan
from autoshard.runtime.checks import expected_collectives, same_collectives
from autoshard.sharding.mesh import parse_mesh

from .dist import run_ranks
from .plans import Traced, random_choices, reference
from .test_executor import TOLERANCE, Case, _run_cases

MODEL = """import torch
from transformers import LlamaConfig, LlamaForCausalLM

SEQ = 31


def build():
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=64, max_position_embeddings=64, use_cache=False,
                         attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval(), (torch.randint(0, 64, (1, SEQ), generator=torch.Generator().manual_seed(1)),)


example_targets = torch.randint(0, 64, (1, SEQ), generator=torch.Generator().manual_seed(2))


def loss(outputs, labels):
    logits = outputs.logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten())
"""


def _traced(path: Path) -> Traced:
    path.write_text(MODEL)
    loaded = load_model(str(path)).for_training()
    model = loaded.model.eval()
    return Traced("tiny_llama_31", model, loaded.example_inputs, trace(model, loaded.example_inputs))


def _cuts_unevenly(mp: ModelProblem, name: str, i: int) -> bool:
    """True when strategy ``i`` of ``name`` holds some operand or its output in uneven pieces."""
    cand, mesh = mp.candidates[name], mp.mesh.shape
    s = cand.strategies[i]
    metas = [mp.graph[src].tensor for src in cand.node.inputs]
    pairs = [(s.out_spec, cand.node.tensor), *zip(s.in_specs, metas)]
    return any(spec is not None and meta is not None and spec.ndim == len(meta.shape) and spec.uneven_dims(meta.shape, mesh)
               for spec, meta in pairs)


def sequence_choice(mp: ModelProblem, attention: str = "rows", recompute: bool = False) -> list[int]:
    """Every op on uneven pieces of the sequence where one of its strategies is, the cheapest such;
    attention split by query ``rows`` (context parallelism) or by ``heads``; every layer recomputed
    or none; parameters stored split over the mesh and gathered for use (FSDP)."""
    choice = []
    for name in mp.names:
        cand = mp.candidates[name]
        if cand.node.kind in (NodeKind.PARAM, NodeKind.BUFFER):
            choice.append(next(i for i, s in enumerate(cand.strategies) if s.out_spec.is_replicated))
            continue
        options = list(range(len(cand.strategies)))
        if cand.recompute is not None:
            options = [i for i in options if cand.recompute[i] == recompute]
        if cand.node.op == "scaled_dot_product_attention":
            split = -2 if attention == "rows" else 1
            options = [i for i in options if cand.strategies[i].in_specs[0].dims[split]] or options
        else:
            options = [i for i in options if _cuts_unevenly(mp, name, i)] or options
        choice.append(min(options, key=lambda i: cand.costs[i]))
    return fsdp_storage(mp, mp.with_storage_of_users(choice), 0)


def test_a_sequence_the_mesh_does_not_divide_trains_like_one_device(tmp_path: Path) -> None:
    t = _traced(tmp_path / "tiny_llama_31.py")
    mesh = parse_mesh("4")  # a memory budget, so that layers may be recomputed
    mp = build_problem(t.graph, mesh, make_cost_model("alpha-beta", mesh), BuildOptions(mode="training", memory_budget=10**15))
    chosen = {"rows": sequence_choice(mp), "heads, recomputed": sequence_choice(mp, "heads", True),
              **{f"random{k}": c for k, c in enumerate(random_choices(mp, 2, 54))}}
    plans = {label: make_plan(mp, choice, model=t.name) for label, choice in chosen.items()}
    shifted = next(n.name for n in t.graph if n.op == "slice" and n.attrs.get("end") == -1)
    for label, split in (("rows", -2), ("heads, recomputed", 1)):
        plan = plans[label]
        assert plan.nodes[shifted].out_spec.dims[1] == (0,)  # the shifted logits on pieces 8, 8, 8, 6
        assert all(p.in_specs[0].dims[split] for n, p in plan.nodes.items() if t.graph[n].op == "scaled_dot_product_attention")
        assert any(step.shape for e in plan.edges for step in e.steps + e.grad_steps)  # padded collectives
        assert any(spec.used_axes for spec in plan.param_specs.values())  # parameters stored split (FSDP)
    assert plans["heads, recomputed"].recompute and not plans["rows"].recompute
    outputs, grads = reference(t, True)
    cases = [Case(label, plan, outputs, grads) for label, plan in plans.items()]
    results = run_ranks(4, _run_cases, t, cases, timeout=240)
    for k, case in enumerate(cases):
        expected = expected_collectives(case.plan)
        for rank, outcome in enumerate(r[k] for r in results):
            bad = {name: err for name, (_, err) in outcome.errors.items() if not err <= TOLERANCE}
            assert not bad, f"{case.label}: relative errors above {TOLERANCE} on rank {rank}: {bad}"
            assert len(outcome.errors) == len(outputs) + len(grads)
            assert same_collectives(outcome.collectives, expected), f"{case.label}: rank {rank} ran other collectives"


def _pieces_against_dtensor(rank: int, world: int) -> list[str]:
    """On a 2x2 mesh, for layouts cutting dims of 7 and 5 unevenly: our piece against DTensor's
    ``distribute_tensor`` (the reference), and the whole gathered back from our pieces."""
    from torch.distributed.tensor import distribute_tensor

    from autoshard.runtime.groups import MeshGroups
    from autoshard.runtime.placements import as_dtensor, distribute, gather_full, spec_placements
    from autoshard.sharding.mesh import parse_mesh
    from autoshard.sharding.spec import TensorSpec

    groups = MeshGroups.create(parse_mesh("2x2"))
    full = torch.arange(35.0).reshape(7, 5)
    wrong = []
    for text in ("S0R", "RS1", "S0S1", "S1S0", "S1R"):
        spec = TensorSpec.parse(text, 2, 2)
        mine = distribute(full, spec, groups)
        theirs = distribute_tensor(full, groups.device_mesh, spec_placements(spec, (2, 2))).to_local()
        whole = gather_full(as_dtensor(mine, spec, groups, tuple(full.shape)), spec, groups)
        if not (torch.equal(mine, theirs) and torch.equal(whole, full)):
            wrong.append(text)
    return wrong


def test_uneven_pieces_are_dtensors_and_gather_back_whole() -> None:
    assert run_ranks(4, _pieces_against_dtensor, timeout=120) == [[]] * 4
