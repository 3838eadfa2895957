"""Cost-model fidelity against what PyTorch itself says: flops and per-device peak memory.

    .venv/bin/python benchmarks/fidelity.py [--models mlp attention cnn gpt2 llama] [--mesh 2x2]
    .venv/bin/python benchmarks/fidelity.py --llama3-8b [--layers 32] [--mesh 8] [--budget 80GiB]
    .venv/bin/python benchmarks/fidelity.py --zoo [--mesh 8]

Flops: the flops the cost model charges (each op's ``OpWork``, summed over the graph) against
``torch.utils.flop_counter.FlopCounterMode`` over the whole model's forward and backward on the
meta device, per op kind.

Memory: for each model (wrapped so the graph ends in its loss, as a training step does) and
several plans (ours, the Megatron baseline, fully replicated), the predicted per-device peak
against the peak PyTorch's MemTracker measures on rank 0 running the plan's real step with our
executor (fake tensors, fake process group, second AdamW step: ``autoshard/runtime/measure.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import CausalLMLoss  # noqa: E402

from autoshard.api import build_model_problem, default_solve_options, solve_model_problem  # noqa: E402
from autoshard.problem.baselines.megatron import megatron_choice  # noqa: E402
from autoshard.frontend.load import load_model  # noqa: E402
from autoshard.frontend.trace import trace  # noqa: E402
from autoshard.frontend.graph import NodeKind  # noqa: E402
from autoshard.problem.readback import make_plan  # noqa: E402
from autoshard.runtime.measure import measure_peak  # noqa: E402
from autoshard.cost.units import format_bytes, parse_bytes  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


class WithLoss(torch.nn.Module):
    """A model whose step ends in a scalar: the mean square of its first floating output."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.model(*inputs)
        first = next(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point())
        return first.float().pow(2).mean() if first.numel() > 1 else first


def example_builder(name: str) -> Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    """An example model file, wrapped with a loss unless it already returns one."""
    def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        loaded = load_model(str(EXAMPLES / f"{name}.py"))
        return WithLoss(loaded.model), loaded.example_inputs
    return build


def llama3_8b_builder(layers: int) -> Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    """LLaMA-3-8B (fused attention, bf16, 8 x 4096 tokens) with labels, built on whatever device is current."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        config = LlamaConfig(num_hidden_layers=layers, hidden_size=4096, num_attention_heads=32,
                             num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                             max_position_embeddings=8192, rope_theta=500000.0, use_cache=False,
                             attn_implementation="sdpa", tie_word_embeddings=False)
        tokens = torch.zeros(8, 4096, dtype=torch.long)
        return CausalLMLoss(_in_dtype(torch.bfloat16, lambda: LlamaForCausalLM(config))), (tokens, tokens)
    return build


def _in_dtype(dtype: torch.dtype, make: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """``make()`` with ``dtype`` as the default, so a bf16 model is never materialised in fp32."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return make().eval()
    finally:
        torch.set_default_dtype(default)


def zoo_builders() -> dict[str, Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]]:
    """Three families at sizes where tensor parallelism (partial sums) pays: a GPT-2 XL decoder (fp32),
    a Mixtral mixture of experts (bf16) and a BERT-large encoder with its masked-LM loss (fp32), 2
    layers each, every step ending in Hugging Face's own loss."""
    from transformers import (BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, MixtralConfig,
                              MixtralForCausalLM)

    def gpt2_xl() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        config = GPT2Config(n_layer=2, n_embd=1600, n_head=25, n_positions=1024, vocab_size=50257,
                            attn_implementation="sdpa", use_cache=False, bos_token_id=0, eos_token_id=0)
        tokens = torch.zeros(8, 1024, dtype=torch.long)
        return CausalLMLoss(GPT2LMHeadModel(config).eval()), (tokens, tokens)

    def mixtral() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        config = MixtralConfig(num_hidden_layers=2, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                               intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                               max_position_embeddings=4096, use_cache=False, attn_implementation="sdpa",
                               tie_word_embeddings=False)
        tokens = torch.zeros(4, 2048, dtype=torch.long)
        return CausalLMLoss(_in_dtype(torch.bfloat16, lambda: MixtralForCausalLM(config))), (tokens, tokens)

    def bert_large() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        config = BertConfig(num_hidden_layers=2, hidden_size=1024, num_attention_heads=16, intermediate_size=4096,
                            vocab_size=30522, max_position_embeddings=512, attn_implementation="sdpa")
        tokens = torch.zeros(32, 512, dtype=torch.long)
        return CausalLMLoss(BertForMaskedLM(config).eval()), (tokens, tokens)

    return {"gpt2-xl": gpt2_xl, "mixtral": mixtral, "bert-large": bert_large}


@contextlib.contextmanager
def _no_packed_sequence_check() -> Iterator[None]:
    """Hugging Face looks for packed sequences with ``.item()``, which a meta tensor cannot answer;
    the batches measured here hold none, so the check is skipped while the reference runs."""
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def flop_table(name: str, build: Callable) -> list[str]:
    """Charged flops per op kind against FlopCounterMode over the whole model on the meta device."""
    with torch.device("meta"):
        model, inputs = build()
    graph = trace(model, inputs)
    charged: Counter[str] = Counter()
    for node in graph:
        if node.kind == NodeKind.OP and node.work is not None and (node.work.flops or node.work.backward_flops):
            charged[node.op] += node.work.flops + node.work.backward_flops
    with FlopCounterMode(display=False) as counter, _no_packed_sequence_check():
        loss = model(*inputs)
        loss.backward()
    torch_total = counter.get_total_flops()
    ours = sum(charged.values())
    kinds = ", ".join(f"{op} {v:.3g}" for op, v in charged.most_common(4))
    return [f"| {name} | {ours:.4g} | {torch_total:.4g} | {ours / torch_total:.4f} | {kinds} |"]


def memory_rows(name: str, build: Callable, mesh: str, budget: int | None, timeout: float) -> list[str]:
    """Predicted vs measured peak for our plan, the Megatron baseline and full replication."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        model, inputs = build()
    graph = trace(model, inputs)
    mp = build_model_problem(graph, mesh, mode="training", memory_budget=budget)
    plans = {"ours": solve_model_problem(mp, default_solve_options(mp, timeout)).solution.choice,
             "megatron": megatron_choice(mp)}
    replicated = mp.complete([0] * len(mp.names))
    if mp.problem.evaluate(replicated).feasible or budget is None:
        plans["replicated"] = replicated
    rows = []
    for label, choice in plans.items():
        plan = make_plan(mp, list(choice))
        predicted = mp.problem.peak_usage(list(choice))
        start = time.perf_counter()
        if plan.expert_parallel():  # its token exchanges depend on the routing, which fake tensors cannot compute
            rows.append(f"| {name} | {mesh} | {label} | {format_bytes(predicted)} | - | - | not measurable: expert "
                        f"parallel, routed by values fake tensors do not have | - |")
            continue
        measured = measure_peak(model, inputs, plan, graph, mode)
        seconds = time.perf_counter() - start
        cats = ", ".join(f"{k[:5].lower()} {format_bytes(v)}" for k, v in measured.by_category.items() if v)
        rows.append(f"| {name} | {mesh} | {label} | {format_bytes(predicted)} | {format_bytes(measured.total)} | "
                    f"{predicted / measured.total:.3f} | {cats} | {seconds:.0f} s |")
    return rows


def main() -> None:
    """Print the flop and memory tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["mlp", "attention", "cnn", "cnn_loss", "gpt2", "bert", "llama"])
    parser.add_argument("--mesh", default="2x2")
    parser.add_argument("--llama3-8b", action="store_true", help="LLaMA-3-8B instead of the examples")
    parser.add_argument("--zoo", action="store_true", help="GPT-2 XL, Mixtral and BERT-large (2 layers each) instead")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--budget", default=None, help="memory budget per device, e.g. 80GiB")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    builders = {"llama3-8b": llama3_8b_builder(args.layers)} if args.llama3_8b else zoo_builders() if args.zoo \
        else {name: example_builder(name) for name in args.models}
    print("| model | charged flops | FlopCounterMode | ratio | largest op kinds |\n|---|---:|---:|---:|---|")
    for name, build in builders.items():
        print("\n".join(flop_table(name, build)), flush=True)
    print("\n| model | mesh | plan | predicted peak | measured peak | ratio | measured by category | measure time |"
          "\n|---|---|---|---:|---:|---:|---|---:|")
    budget = parse_bytes(args.budget) if args.budget else None
    for name, build in builders.items():
        print("\n".join(memory_rows(name, build, args.mesh, budget, args.timeout)), flush=True)


if __name__ == "__main__":
    main()
