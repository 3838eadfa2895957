"""LLaMA-3-8B as published (32 layers, hidden 4096, GQA 32/8, MLP 14336, vocab 128256, bf16), on meta.

Built on the meta device from a config: no weights are allocated and nothing is downloaded, so
it is for solving only (``--mode training --device h100 --memory-budget 80GiB``), not for
``autoshard.run``. 8 sequences of 4096 tokens; the step ends in Hugging Face's own next-token
loss of the labels (``loss`` below). ``LLAMA_ATTENTION=eager`` selects eager attention (its
[8, 32, 4096, 4096] score matrices are then activations), else fused ``sdpa``.
``LLAMA_BATCH`` and ``LLAMA_SEQ`` change the batch (torchtitan's 8-GPU benchmark: 16 x 8192).
"""

import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BATCH, SEQ = int(os.environ.get("LLAMA_BATCH", 8)), int(os.environ.get("LLAMA_SEQ", 4096))


def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The model on meta in bf16 and a batch of token ids."""
    config = LlamaConfig(
        num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=128256, max_position_embeddings=max(SEQ, 8192), rope_theta=500000.0,
        use_cache=False, tie_word_embeddings=False,
        attn_implementation=os.environ.get("LLAMA_ATTENTION", "sdpa"),
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    return model, (torch.zeros(BATCH, SEQ, dtype=torch.long, device="meta"),)


example_targets = torch.zeros(BATCH, SEQ, dtype=torch.long, device="meta")


def loss(outputs, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (the logits in fp32, as Hugging Face's loss computes it)."""
    logits = outputs.logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten())
