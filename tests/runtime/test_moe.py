"""Mixture-of-experts models run expert-parallel on forked gloo ranks against the unsharded model.

Hugging Face Mixtral (examples/mixtral.py) and Qwen2-MoE (shared expert beside the routed ones)
from small configs, on 4 and 2x2 ranks, inference and training: the plans are the solver's
optima with expert parallelism pinned to a mesh axis (``expert_parallel``; at these sizes the
free optimum replicates the experts). Each must reproduce the reference outputs and every
parameter gradient within 1e-5 relative and run the plan's collectives; the exchanges' bytes are
the routing's, so each rank's dispatch is checked against the pairs the reference model routed
from its tokens to experts held by the other ranks of its exchange group.
"""

from __future__ import annotations

import functools

import pytest
import torch

from autoshard.api import build_model_problem, solve_model_problem
from autoshard.frontend.load import load_model
from autoshard.frontend.trace import trace
from autoshard.problem.plan import Plan
from autoshard.runtime.checks import expected_collectives, same_collectives
from autoshard.runtime.experts import exchange_label

from .dist import run_ranks
from .plans import EXAMPLES, Traced, reference
from .test_executor import TOLERANCE, Case, _run_cases

CASES = [("mixtral", "4", 0), ("mixtral", "2x2", 1), ("qwen2_moe", "4", 0), ("qwen2_moe", "2x2", 0)]
"""(model, mesh, mesh axis the experts are pinned to exchange tokens over)."""


@functools.lru_cache(maxsize=None)
def traced(name: str) -> Traced:
    """``mixtral``: the example; ``qwen2_moe``: 2 layers, hidden 32, 4 experts (top-2) of 32, a shared expert."""
    if name == "mixtral":
        loaded = load_model(str(EXAMPLES / "mixtral.py"))
        model, inputs = loaded.model, loaded.example_inputs
    else:
        from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

        torch.manual_seed(0)
        config = Qwen2MoeConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                num_experts=4, num_experts_per_tok=2, vocab_size=64, max_position_embeddings=32,
                                use_cache=False, attn_implementation="eager")
        model = Qwen2MoeForCausalLM(config).eval()
        inputs = (torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(1)),)
    return Traced(name, model, inputs, trace(model, inputs))


def expert_parallel_plan(t: Traced, mesh: str, mode: str, axis: int) -> Plan:
    """The optimum with every MoE layer expert-parallel over ``axis``."""
    mp = build_model_problem(t.graph, mesh, mode=mode, expert_parallel=axis)
    return solve_model_problem(mp, model_name=t.name).plan


def routed_rows(t: Traced) -> dict[str, torch.Tensor]:
    """Each experts module's top-k expert ids [tokens, k] in the reference forward."""
    seen: dict[str, torch.Tensor] = {}
    hooks = [module.register_forward_hook(lambda m, args, out, path=path: seen.__setitem__(path, args[1].clone()))
             for path, module in t.model.named_modules() if path.endswith("mlp.experts")]
    with torch.no_grad():
        t.model(*t.inputs)
    for hook in hooks:
        hook.remove()
    return seen


def dispatch_bytes(t: Traced, plan: Plan, node: str, ids: torch.Tensor, coords: tuple[int, ...]) -> int:
    """Bytes the rank at ``coords`` must send in ``node``'s forward dispatch: its token-expert pairs
    for experts held by the other ranks of its exchange group, one hidden row each."""
    place, shape = plan.nodes[node], plan.mesh.shape
    tokens, experts = place.in_specs[0], place.in_specs[3]
    hidden, gate_up = (t.graph[t.graph[node].inputs[k]].tensor for k in (0, 3))
    count = ids.shape[0] // tokens.shard_factor(0, shape)
    mine = ids[tokens.chunk_index(0, coords, shape) * count:][:count]
    held = gate_up.shape[0] // experts.shard_factor(0, shape)
    axis = place.exchange_axis
    group_first = experts.chunk_index(0, coords, shape) * held - coords[axis] * held
    in_group = (mine >= group_first) & (mine < group_first + shape[axis] * held)
    elsewhere = in_group & ((mine - group_first).div(held, rounding_mode="floor") != coords[axis])
    return int(elsewhere.sum()) * hidden.shape[1] * hidden.itemsize


@pytest.mark.parametrize("model,mesh,axis", CASES, ids=[f"{m}-{s}" for m, s, _ in CASES])
def test_expert_parallel_plans_match_reference(model: str, mesh: str, axis: int) -> None:
    t = traced(model)
    cases = []
    for mode in ("inference", "training"):
        outputs, grads = reference(t, mode == "training")
        cases.append(Case(f"{mode}/expert-parallel", expert_parallel_plan(t, mesh, mode, axis), outputs, grads))
    results = run_ranks(cases[0].plan.mesh.size, _run_cases, t, cases, timeout=150)
    routed = routed_rows(t)
    for k, case in enumerate(cases):
        plan, where = case.plan, f"{model} on {mesh}, {case.label}"
        assert set(plan.expert_parallel().values()) == {axis} and len(plan.expert_parallel()) == len(routed)
        expected = expected_collectives(plan)
        for rank, outcome in enumerate(r[k] for r in results):
            bad = {name: err for name, (_, err) in outcome.errors.items() if not err <= TOLERANCE}
            assert not bad, f"{where}: relative errors above {TOLERANCE} on rank {rank}: {bad}"
            assert len(outcome.errors) == len(case.outputs) + len(case.grads)
            assert same_collectives(outcome.collectives, expected), f"{where}: rank {rank} ran other collectives"
            coords = plan.mesh.coords(rank)
            for node in plan.nodes.values():
                if node.exchange_axis is None:
                    continue
                sent = [c for c in outcome.collectives if c.edge == exchange_label(node.name)]
                assert sent[1].sent_bytes == dispatch_bytes(t, plan, node.name, routed[node.module], coords), where
