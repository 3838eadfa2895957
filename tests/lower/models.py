"""LLaMA-3 in miniature: the code and config shape of examples/llama3_8b.py (GQA, untied head, its
next-token loss) at 2 layers, hidden 64, 8 heads over 2 key/value heads, 4 x 16 tokens, fp32."""

from __future__ import annotations

import functools

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from autoshard.frontend.graph import OpGraph
from autoshard.frontend.loss import with_loss
from autoshard.frontend.trace import trace

VOCAB, BATCH, SEQ = 128, 4, 16


def loss(outputs, labels: torch.Tensor) -> torch.Tensor:
    """examples/llama3_8b.py's loss: mean next-token cross-entropy, the logits in fp32."""
    logits = outputs.logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten())


@functools.lru_cache(maxsize=None)
def tiny_llama3(attention: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], OpGraph]:
    """The model with its loss (inputs: tokens, labels), the inputs, and its traced graph."""
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
        intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=32, rope_theta=500000.0,
        use_cache=False, tie_word_embeddings=False, attn_implementation=attention,
    )
    model = with_loss(LlamaForCausalLM(config).eval(), loss, 1, 1)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    inputs = (tokens, torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator))
    return model, inputs, trace(model, inputs)
