"""Hugging Face LLaMA LM from a small config (2 layers, hidden 64, 4 heads, vocab 128), tokens [2, 16].

Built from a config, so nothing is downloaded; eager attention and no KV cache keep it exportable.
For training (``--mode training``, ``autoshard.train``) the file also defines the next-token loss
and one batch of tokens per step: counting sequences (each token one more than the last, modulo
the vocabulary) from random starts, which the model learns within a few dozen steps. The targets
are the tokens shifted by one, taken from a sequence one token longer, so no label is the
ignore index -100 and every token counts.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, BATCH, SEQ = 128, 2, 16


def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A deterministic LLaMA in eval mode and a batch of token ids."""
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=32,
        use_cache=False, attn_implementation="eager",
    )
    model = LlamaForCausalLM(config).eval()
    return model, (torch.randint(0, config.vocab_size, (BATCH, SEQ)),)


def loss(outputs, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position (labels hold no -100)."""
    return torch.nn.functional.cross_entropy(outputs.logits.flatten(0, 1), labels.flatten())


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s tokens and their next tokens, the same on every rank."""
    starts = torch.randint(0, VOCAB, (BATCH, 1), generator=torch.Generator().manual_seed(step))
    tokens = (starts + torch.arange(SEQ + 1)) % VOCAB
    return tokens[:, :-1], tokens[:, 1:]


example_targets = batch(0)[1]
