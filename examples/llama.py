"""Hugging Face LLaMA LM from a small config (2 layers, hidden 64, 4 heads, vocab 128), tokens [2, 16].

Built from a config, so nothing is downloaded; eager attention and no KV cache keep it exportable.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A deterministic LLaMA in eval mode and a batch of token ids."""
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=128, vocab_size=128, max_position_embeddings=32,
        use_cache=False, attn_implementation="eager",
    )
    model = LlamaForCausalLM(config).eval()
    return model, (torch.randint(0, config.vocab_size, (2, 16)),)
