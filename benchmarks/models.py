"""Benchmark models built on the meta device (no weights allocated, nothing downloaded).

Each builder returns ``(model, example_inputs)`` like a model file's ``build()``. The LLM shapes
are the published ones (LLaMA-3-8B, a LLaMA-3-70B-shaped model, GPT-2 XL, Mixtral-8x7B), in
bf16 where the published models train in bf16. ``layers`` shrinks a model for quick runs.
"""

from __future__ import annotations

import torch


def _tokens(batch: int, seq: int) -> torch.Tensor:
    return torch.zeros(batch, seq, dtype=torch.long, device="meta")


class CausalLMLoss(torch.nn.Module):
    """A causal LM whose step ends in Hugging Face's own loss of (input_ids, labels)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=labels).loss


def gpt2(layers: int, hidden: int = 1024, heads: int = 16, seq: int = 512, batch: int = 8,
         vocab: int = 50304) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A Hugging Face GPT-2 trunk of ``layers`` blocks (GPT-2 medium widths) and a token batch, on meta."""
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=seq, vocab_size=vocab,
                        attn_implementation="eager", use_cache=False, bos_token_id=0, eos_token_id=0)
    with torch.device("meta"):
        model = GPT2Model(config).eval()
    return model, (_tokens(batch, seq),)


def gpt2_xl(layers: int = 48, seq: int = 1024, batch: int = 8,
            attention: str = "sdpa") -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """GPT-2 XL (48 layers, hidden 1600, 25 heads, vocab 50257) as a causal LM, fp32, on meta."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=layers, n_embd=1600, n_head=25, n_positions=seq, vocab_size=50257,
                        attn_implementation=attention, use_cache=False, bos_token_id=0, eos_token_id=0)
    with torch.device("meta"):
        model = GPT2LMHeadModel(config).eval()
    return model, (_tokens(batch, seq),)


def llama(layers: int, hidden: int, heads: int, kv_heads: int, mlp: int, vocab: int = 128256,
          seq: int = 4096, batch: int = 8, attention: str = "sdpa",
          dtype: torch.dtype = torch.bfloat16) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A LLaMA-3-style causal LM (RMSNorm, rotary, GQA, SwiGLU) of the given shape, on meta."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, intermediate_size=mlp, vocab_size=vocab,
                         max_position_embeddings=max(seq, 8192), rope_theta=500000.0, use_cache=False,
                         attn_implementation=attention, tie_word_embeddings=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(dtype).eval()
    return model, (_tokens(batch, seq),)


def llama3_8b(layers: int = 32, seq: int = 4096, batch: int = 8,
              attention: str = "sdpa") -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """LLaMA-3-8B as published: 32 layers, hidden 4096, GQA 32/8, MLP 14336, vocab 128256, bf16."""
    return llama(layers, 4096, 32, 8, 14336, seq=seq, batch=batch, attention=attention)


def llama3_70b(layers: int = 80, seq: int = 4096, batch: int = 8,
               attention: str = "sdpa") -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A LLaMA-3-70B-shaped model: 80 layers, hidden 8192, GQA 64/8, MLP 28672, vocab 128256, bf16."""
    return llama(layers, 8192, 64, 8, 28672, seq=seq, batch=batch, attention=attention)


def mixtral_8x7b(layers: int = 32, seq: int = 4096, batch: int = 8,
                 attention: str = "sdpa") -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Mixtral-8x7B as published: 32 layers, hidden 4096, 8 experts top-2 of MLP 14336, GQA 32/8,
    vocab 32000, bf16."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(num_hidden_layers=layers, hidden_size=4096, num_attention_heads=32,
                           num_key_value_heads=8, intermediate_size=14336, num_local_experts=8,
                           num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=max(seq, 8192),
                           use_cache=False, attn_implementation=attention, tie_word_embeddings=False)
    with torch.device("meta"):
        model = MixtralForCausalLM(config).to(torch.bfloat16).eval()
    return model, (_tokens(batch, seq),)


BUILDERS = {"gpt2-xl": gpt2_xl, "llama3-8b": llama3_8b, "llama3-70b": llama3_70b, "mixtral-8x7b": mixtral_8x7b}
"""The named LLM builders benchmarks accept (``--model llama3-8b``)."""
