"""A model traced over three of its identical blocks and replicated equals its full trace, node for
node (names, operands, paths, shapes, measured work), and replays to the model's own loss."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from autoshard.frontend.call import run_graph
from autoshard.frontend.graph import OpGraph
from autoshard.frontend.loss import with_loss
from autoshard.frontend.replicate import TEMPLATE, repeated_blocks, trace_replicated
from autoshard.frontend.trace import trace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from titan_llama import Transformer  # noqa: E402


def _hf_llama(layers: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Hugging Face LLaMA (traced by torch.export) with a shifted next-token loss."""
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=layers, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=64, max_position_embeddings=16, use_cache=False,
                         attn_implementation="sdpa")

    def loss(outputs, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(outputs.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())

    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    return with_loss(LlamaForCausalLM(config).eval(), loss, 1, 1), (tokens, tokens.clone())


def _titan(layers: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """torchtitan's LLaMA modules (traced by torch.fx) with their loss."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    return Transformer(layers, 32, 4, 2, 64, 100, 16), (tokens, tokens.clone())


def _fields(graph: OpGraph) -> list[dict]:
    return [asdict(node) for node in graph]


@pytest.mark.parametrize("build", [_titan, _hf_llama], ids=["fx", "export"])
def test_replicated_graph_equals_the_full_trace(build) -> None:
    model, inputs = build(6)
    full = trace(model, inputs)
    replicated = trace_replicated(model, inputs)
    assert replicated.frontend == full.frontend
    assert list(replicated.nodes) == list(full.nodes)
    assert _fields(replicated) == _fields(full)
    with torch.no_grad():
        expected = model(*inputs)
        got = run_graph(replicated, inputs)[0]
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_the_model_is_restored_and_short_lists_are_traced_whole() -> None:
    model, inputs = _titan(TEMPLATE)
    assert repeated_blocks(model) is None  # no block beyond the template: nothing to copy
    assert len(trace_replicated(model, inputs)) == len(trace(model, inputs))
    model, inputs = _titan(5)
    trace_replicated(model, inputs)
    assert len(model.layers) == 5


def test_blocks_that_differ_are_not_copied() -> None:
    model, _ = _titan(5)
    model.layers[4].feed_forward.w2 = torch.nn.Linear(64, 48, bias=False)  # a different shape: not alike
    assert repeated_blocks(model) is None


def test_a_block_configured_otherwise_is_traced_whole() -> None:
    """A later block whose attributes differ (as a sliding-window layer among full ones) is not a copy
    of the traced ones; an attribute that differs in every block (a layer index) is allowed."""
    model, _ = _titan(6)
    for i, block in enumerate(model.layers):
        block.layer_index = i
    assert repeated_blocks(model) == ("layers", 6)
    model.layers[5].attention.window = 4
    for block in list(model.layers)[:5]:
        block.attention.window = None
    assert repeated_blocks(model) is None
