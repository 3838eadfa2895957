"""GPT-style benchmark models built on the meta device (no weights allocated, nothing downloaded)."""

from __future__ import annotations

import torch


def gpt2(layers: int, hidden: int = 1024, heads: int = 16, seq: int = 512, batch: int = 8,
         vocab: int = 50304) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A Hugging Face GPT-2 trunk of ``layers`` blocks (GPT-2 medium widths) and a token batch, on meta."""
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=seq, vocab_size=vocab,
                        attn_implementation="eager", use_cache=False, bos_token_id=0, eos_token_id=0)
    with torch.device("meta"):
        model = GPT2Model(config).eval()
    return model, (torch.zeros(batch, seq, dtype=torch.long, device="meta"),)
