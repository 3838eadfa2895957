"""A tensor that several recomputed layers read is kept by their checkpoints once.

Every layer of a causal LM reads the one causal mask; torch.utils.checkpoint holds that one
tensor until the last recomputation that reads it, whichever layers recompute. The model
charges it once, on its reader in the first layer (recomputed last in the backward), where it
used to charge it once per layer (LLaMA-8B at 131072 tokens: 32 copies of a 2 GiB mask).
"""

from __future__ import annotations

import torch
from torch import nn

from autoshard.cost.recompute import checkpoint_readers, layer_blocks
from autoshard.frontend.trace import trace
from autoshard.sharding.layers import find_repeated_layers


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(x)) * mask


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.sigmoid(x.sum(-1, keepdim=True))
        for layer in self.layers:
            x = layer(x, mask)
        return x


def test_a_tensor_every_layer_reads_is_checkpointed_once_by_the_first_layer() -> None:
    graph = trace(Stack(), (torch.randn(4, 8, requires_grad=True),))
    blocks = layer_blocks(graph, find_repeated_layers(graph))
    mask = next(n.name for n in graph if n.op == "sigmoid")
    readers = [name for name, operands in checkpoint_readers(graph, blocks).items()
               if any(graph[name].inputs[k] == mask for k in operands)]
    assert len({blocks.block_of[n.name] for n in graph if mask in n.inputs and n.name in blocks.block_of}) == 3
    assert len(readers) == 1 and blocks.block_of[readers[0]] == min(blocks.block_of.values())
    residual = [name for name, operands in checkpoint_readers(graph, blocks).items()
                if any(graph[graph[name].inputs[k]].op != "sigmoid" for k in operands)]
    assert len({blocks.block_of[n] for n in residual}) >= 2  # each layer still keeps its own input
