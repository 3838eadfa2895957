"""Hugging Face GPT-2 LM from a small config (2 layers, hidden 64, 4 heads, vocab 128), tokens [2, 16].

Built from a config, so nothing is downloaded; eager attention and no KV cache keep it exportable.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A deterministic GPT-2 in eval mode and a batch of token ids."""
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32,
        bos_token_id=0, eos_token_id=0, use_cache=False, attn_implementation="eager",
    )
    model = GPT2LMHeadModel(config).eval()
    return model, (torch.randint(0, config.vocab_size, (2, 16)),)
