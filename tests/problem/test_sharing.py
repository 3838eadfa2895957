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


def _arrays(mp) -> list:
    p = mp.problem
    return [list(map(list, p.node_costs)), list(p.edges), [m.tolist() for m in p.edge_costs],
            [list(u) for u in p.node_usages], list(p.intervals)]


def test_problems_built_after_others_equal_those_built_alone() -> None:
    """Reshard prices, copies' ties and op candidates are shared by every build in the process, keyed
    by all they depend on: a build after builds on another device, batch and mode equals it alone."""
    from autoshard.problem import candidates, edges, reshard_copies

    def clear() -> None:
        for cache in (edges._PRICES, reshard_copies._TIES, candidates._OPS):
            cache.clear()

    def build(device: str, batch: int, mode: str = "training"):
        graph = trace(Stack(3), (torch.randn(batch, 16),))
        return build_model_problem(graph, "2x2", mode=mode, memory_budget=1 << 20, device=device)

    clear()
    alone = _arrays(build("h100", 8))
    clear()
    build("a100", 8)  # the same keys but for the device: its prices must not be reused
    build("h100", 4)
    build("h100", 8, "inference")
    assert _arrays(build("h100", 8)) == alone
