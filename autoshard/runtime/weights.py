"""The whole parameter and buffer values a plan starts from: the model's, then rank 0's on every rank.

Model files need not seed their random generator: as DistributedDataParallel does, rank 0's
values are broadcast to every rank before anything is sharded, so all ranks cut their pieces
from the same tensors. The broadcast packs the values into one flat tensor per dtype (one
collective each, on the group spanning the mesh) and leaves the user's model untouched.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch import nn

from autoshard.frontend.call import node_caller
from autoshard.frontend.graph import NodeKind, OpGraph
from autoshard.runtime.groups import MeshGroups


def model_state(model: nn.Module, graph: OpGraph) -> dict[str, torch.Tensor]:
    """Whole parameter and buffer values by node name: the model's own, else the traced constant."""
    state = {}
    for node in graph:
        if node.kind in (NodeKind.PARAM, NodeKind.BUFFER):
            try:
                value = model.get_parameter(node.qualname) if node.kind == NodeKind.PARAM else model.get_buffer(node.qualname)
            except AttributeError:  # a constant lifted by torch.export belongs to the program
                value = node_caller(graph, node.name)([], {})
            state[node.name] = value.detach()
    return state


def transient_buffers(model: nn.Module, graph: OpGraph) -> frozenset[str]:
    """Dotted names of the graph's buffers that are not in ``model.state_dict()`` (non-persistent, or
    constants torch.export lifted), so the parallel module's state_dict has the model's keys."""
    persistent = set(model.state_dict(keep_vars=True))
    return frozenset(n.qualname for n in graph if n.kind == NodeKind.BUFFER and n.qualname not in persistent)


def broadcast_state(state: dict[str, torch.Tensor], groups: MeshGroups) -> dict[str, torch.Tensor]:
    """``state`` as the mesh's first rank holds it, on every rank (collective on ``groups.span``).

    Without a spanning group (one device) the state is returned unchanged.
    """
    if groups.span is None:
        return state
    by_dtype: dict[torch.dtype, list[str]] = defaultdict(list)
    for name, value in state.items():
        by_dtype[value.dtype].append(name)
    result: dict[str, torch.Tensor] = {}
    for dtype, names in by_dtype.items():
        flat = torch.cat([state[n].reshape(-1) for n in names])
        dist.broadcast(flat, group=groups.span, group_src=0)
        offset = 0
        for name in names:
            n = state[name].numel()
            result[name] = flat[offset:offset + n].view(state[name].shape)
            offset += n
    return {name: result[name] for name in state}
