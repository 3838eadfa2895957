"""A buffer every layer reads is one node (so the layers repeat), and ``x.float()`` is a sharded cast."""

from __future__ import annotations

import torch

from autoshard.api import build_model_problem
from autoshard.frontend.graph import NodeKind
from autoshard.frontend.trace import trace
from autoshard.sharding.layers import find_repeated_layers


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x + (self.fc(x).float() * scale).half().to(x.dtype)


class Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(3))
        self.register_buffer("scale", torch.ones(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, self.scale)
        return x


def test_a_buffer_read_in_every_layer_is_one_node_and_the_layers_repeat() -> None:
    graph = trace(Stack(), (torch.randn(8, 16),), "fx")
    assert [n.target for n in graph if n.kind == NodeKind.BUFFER] == ["scale"]
    layers = find_repeated_layers(graph)
    assert layers is not None and layers.count == 3


def test_dtype_methods_are_named_casts_that_shard_and_replay() -> None:
    model, x = Stack(), torch.randn(8, 16)
    graph = trace(model, (x,), "fx")
    casts = [n for n in graph if n.op in ("float", "half")]
    assert len(casts) == 6 and {c.tensor.dtype for c in casts} == {"float32", "float16"}
    mp = build_model_problem(graph, "2")
    assert not mp.warnings and all(len(mp.candidates[c.name].strategies) > 1 for c in casts)
    torch.testing.assert_close(graph.module(x), model(x))
