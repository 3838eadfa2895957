"""Hugging Face BERT encoder from a small config (2 layers, hidden 64, 4 heads, vocab 128), tokens [2, 16].

Built from a config, so nothing is downloaded; eager attention keeps it exportable.
"""

import torch
from transformers import BertConfig, BertModel


def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A deterministic BERT in eval mode and a batch of token ids."""
    torch.manual_seed(0)
    config = BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        vocab_size=128, max_position_embeddings=32, attn_implementation="eager",
    )
    model = BertModel(config).eval()
    return model, (torch.randint(0, config.vocab_size, (2, 16)),)
