"""Hugging Face Mixtral (mixture of experts) from a small config: 2 layers, hidden 64, 8 experts of
MLP 128 with top-2 routing, GQA 4/2, vocab 128; tokens [4, 16].

Built from a config, so nothing is downloaded. Each layer's experts module becomes one
``moe_experts`` node whose layouts include expert parallelism (experts split over a mesh axis,
tokens sent to them by all-to-all): ``--expert-parallel 0`` pins it, otherwise the solver weighs
it against running every expert on each device's tokens. For training the file defines the
next-token loss and a batch per step (counting sequences, as in examples/llama.py).
"""

import torch
from transformers import MixtralConfig, MixtralForCausalLM

VOCAB, BATCH, SEQ = 128, 4, 16


def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A deterministic Mixtral in eval mode and a batch of token ids."""
    torch.manual_seed(0)
    config = MixtralConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, num_local_experts=8, num_experts_per_tok=2, vocab_size=VOCAB,
        max_position_embeddings=32, use_cache=False, attn_implementation="eager",
    )
    model = MixtralForCausalLM(config).eval()
    return model, (torch.randint(0, config.vocab_size, (BATCH, SEQ)),)


def loss(outputs, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position (the router's auxiliary loss is off)."""
    return torch.nn.functional.cross_entropy(outputs.logits.flatten(0, 1), labels.flatten())


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s tokens and their next tokens, the same on every rank."""
    starts = torch.randint(0, VOCAB, (BATCH, 1), generator=torch.Generator().manual_seed(step))
    tokens = (starts + torch.arange(SEQ + 1)) % VOCAB
    return tokens[:, :-1], tokens[:, 1:]


example_targets = batch(0)[1]
