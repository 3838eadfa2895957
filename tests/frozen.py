"""Small pure-torch models for frozen parameters and in-place slice fills (issue 37).

- ``frozen_linears``: two Linears, the first frozen (``fc1.requires_grad_(False)``);
- :class:`FrozenEmbedding`: a frozen token embedding and a frozen positional table, as Whisper's
  encoder has, under a trainable head;
- :class:`LoRAMLP`: LoRA adapters on frozen Linear bases;
- :class:`SliceFills`: DeepSeek-V3's attention key, assembled with ``key[..., :n].copy_(k)`` and
  ``key[..., n:] = k_rot`` (torch.export: ``aten.copy`` and ``slice_scatter``).
"""

from __future__ import annotations

import torch
from torch import nn


class TwoLinears(nn.Module):
    """fc1 -> relu -> fc2."""

    def __init__(self, hidden: int = 16, inner: int = 32) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, inner), nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def frozen_linears(frozen: bool = True) -> TwoLinears:
    """TwoLinears (seeded), fc1 frozen unless ``frozen`` is False."""
    torch.manual_seed(0)
    model = TwoLinears()
    model.fc1.requires_grad_(not frozen)
    return model


class FrozenEmbedding(nn.Module):
    """Frozen token and positional embeddings summed, then a trainable Linear head."""

    def __init__(self, vocab: int = 64, seq: int = 8, hidden: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden).requires_grad_(False)
        self.positions = nn.Parameter(torch.randn(seq, hidden), requires_grad=False)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids) + self.positions)


class LoRALinear(nn.Module):
    """A frozen Linear plus the trainable low-rank update ``x A^T B^T``."""

    def __init__(self, n_in: int, n_out: int, rank: int = 4) -> None:
        super().__init__()
        self.base = nn.Linear(n_in, n_out).requires_grad_(False)
        self.lora_a = nn.Parameter(torch.randn(rank, n_in) / n_in**0.5)
        self.lora_b = nn.Parameter(torch.randn(n_out, rank) / rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.t()) @ self.lora_b.t()


class LoRAMLP(nn.Module):
    """Two LoRA Linears around a GELU."""

    def __init__(self, hidden: int = 16, inner: int = 32) -> None:
        super().__init__()
        self.up, self.down = LoRALinear(hidden, inner), LoRALinear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


class SliceFills(nn.Module):
    """A key built in slices in place, as DeepSeek-V3's attention builds it, then a Linear."""

    def __init__(self, hidden: int = 16, half: int = 8) -> None:
        super().__init__()
        self.half = half
        self.nope, self.rope = nn.Linear(hidden, half), nn.Linear(hidden, half)
        self.out = nn.Linear(2 * half, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = x.new_zeros(*x.shape[:-1], 2 * self.half)
        key[..., :self.half].copy_(self.nope(x))
        key[..., self.half:] = self.rope(x)
        return self.out(key)


def inputs(model: nn.Module) -> tuple[torch.Tensor, ...]:
    """Seeded example inputs of the right kind: token ids [4, 8] for FrozenEmbedding, else x [8, 8, 16]."""
    generator = torch.Generator().manual_seed(1)
    if isinstance(model, FrozenEmbedding):
        return (torch.randint(0, 64, (4, 8), generator=generator),)
    return (torch.randn(8, 8, 16, generator=generator),)
