"""Repeated layers cost their first copy only: identical parameters share their candidate lists,
so every later layer reuses the edge prices of the first (the build of a 126-layer model depends on it)."""

from __future__ import annotations

import torch
from torch import nn

from autoshard.api import build_model_problem
from autoshard.frontend.trace import trace


class Stack(nn.Module):
    """``layers`` identical MLP blocks with residuals, ending in a scalar loss."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 16))
                                    for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x.square().mean()


def _distinct(layers: int) -> tuple[int, int, int]:
    graph = trace(Stack(layers), (torch.randn(8, 16),))
    mp = build_model_problem(graph, "2x2", mode="training", memory_budget=1 << 20)
    params = [c for c in mp.candidates.values() if c.storage is not None]
    return mp.distinct_matrices, len({id(c.strategies) for c in params}), len(params)


def test_later_layers_add_no_edge_prices_and_share_their_parameters_lists() -> None:
    three, six = _distinct(3), _distinct(6)  # first, middle and last layers in both
    assert six[2] == 2 * three[2]  # twice the parameters ...
    assert six[:2] == three[:2]  # ... and not one more distinct matrix or parameter strategy list
