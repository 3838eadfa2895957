"""Seed example: two-layer MLP on x [8, 1024, 1024] fp32 (fc1 1024->4096, GELU, fc2 4096->1024)."""

import torch
from torch import nn


class MLP(nn.Module):
    """fc1 -> GELU -> fc2, the module names the seed plan refers to."""

    def __init__(self, hidden: int = 1024, inner: int = 4096) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, inner)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def build() -> tuple[MLP, tuple[torch.Tensor]]:
    """The seed model and its input x [8, 1024, 1024]."""
    torch.manual_seed(0)
    return MLP(), (torch.randn(8, 1024, 1024),)
