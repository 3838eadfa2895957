"""A selectively recomputed plan's training step: MemTracker's peak against the predicted one.

The plan is torchtitan's on a 1-D mesh of 4 (FSDP: every parameter stored split and gathered
for its use; every LLaMA layer recomputed under torchtitan's op policy), run by the executor
(``runtime/recompute.py``: the kept matmuls' and attention's outputs saved, the rest of each
layer run again) on fake tensors of a fake process group (``runtime/measure.py``). The LLaMA
has 1,024 tokens, so activations dominate the peak. Its second step's peak must be within 10% of
what the cost model predicts for the plan, and below the same plan's peak keeping every layer.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers import LlamaConfig, LlamaForCausalLM

from autoshard.api import build_model_problem
from autoshard.frontend.trace import trace
from autoshard.problem.baselines.torchtitan import torchtitan_choice
from autoshard.problem.readback import make_plan
from autoshard.runtime.measure import measure_peak
from tests.cost.test_memory import WithLoss

from .dist import run_ranks

TOLERANCE = 0.10


def _llama() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A 2-layer LLaMA (hidden 64, fused attention) and 4 x 256 tokens."""
    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                         intermediate_size=128, vocab_size=128, max_position_embeddings=256, use_cache=False,
                         attn_implementation="sdpa")
    return WithLoss(LlamaForCausalLM(config).eval()), (torch.randint(0, 128, (4, 256)),)


def test_selective_plan_peak_is_within_ten_percent_of_memtracker() -> None:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        model, inputs = _llama()
    graph = trace(model, inputs)
    peaks = {}
    for policy in ("selective", "none"):
        mp = build_model_problem(graph, "4", mode="training", recompute=policy, memory_budget=10**15)
        choice = torchtitan_choice(mp)
        plan = make_plan(mp, choice)
        assert bool(plan.recompute_kept) == (policy == "selective")
        predicted = mp.problem.peak_usage(list(choice))
        measured = run_ranks(1, lambda rank, world: measure_peak(model, inputs, plan, graph, mode).total,
                             connect=False)[0]
        assert abs(predicted / measured - 1) <= TOLERANCE, f"{policy}: predicted {predicted}, measured {measured}"
        peaks[policy] = measured
    assert peaks["selective"] < 0.9 * peaks["none"], peaks
