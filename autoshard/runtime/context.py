"""Causal attention with its query rows split over devices (context parallelism, keys and values gathered).

A plan may split the query rows of a causal ``scaled_dot_product_attention`` over mesh axes
(``causal_rows`` in ops.toml) while every device holds all the keys and values (the edges into
it gather them). A device's rows ``[first, end)`` of the whole sequence see the keys up to their
own positions, so the keys from ``end`` on are hidden from all of them and are not read: the
device attends its rows to the keys ``[0, end)`` under a causal mask aligned to the bottom-right
corner of that ``rows x end`` block (row ``i`` sees the keys up to ``first + i``). Where the block
is square (the first rows) that is torch's ``is_causal``, which every backend runs without a mask.
Elsewhere torch's flash kernel runs it without a mask: ``aten._scaled_dot_product_flash_attention``
with ``is_causal`` aligns the mask bottom-right on a non-square block (what
``torch.nn.attention.bias.causal_lower_right`` dispatches to on CUDA; ``F.scaled_dot_product_attention``
refuses flash there, keeping its own top-left meaning). Where that kernel cannot run (CPU, fp32,
head dims it does not take) the mask is built from the rows' global positions. The rows, their
first position and the kept keys come from plain integer arithmetic, which torch.compile traces
without a graph break.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

from autoshard.frontend.graph import OpNode
from autoshard.problem.plan import NodePlacement
from autoshard.runtime.groups import MeshGroups
from autoshard.sharding.spec import piece_size

FLASH_HEAD_DIMS = 256
"""The largest head dim torch's flash kernel takes (a multiple of 8; ``sdp_utils``' flash checks)."""


def splits_causal_rows(node: OpNode, place: NodePlacement | None) -> bool:
    """True when ``node`` is causal attention whose query rows the plan splits."""
    return (node.op == "scaled_dot_product_attention" and bool(node.attrs.get("is_causal"))
            and place is not None and bool(place.in_specs[0].dims[-2]))


def causal_rows_attention(operands: Sequence[Any], node: OpNode, place: NodePlacement,
                          groups: MeshGroups) -> torch.Tensor:
    """This device's rows of causal attention over the keys and values up to its last row (module doc)."""
    query, key, value = operands[:3]
    spec, row_dim = place.in_specs[0], place.in_specs[0].ndim - 2
    rows, mesh = query.shape[-2], groups.mesh.shape
    pieces = 1
    for axis in spec.dims[row_dim]:  # a plain loop, which torch.compile traces without a break
        pieces *= mesh[axis]
    first = spec.chunk_index(row_dim, groups.coords, mesh) * piece_size(node.out.shape[-2], pieces)
    end = first + rows
    key, value = key[..., :end, :], value[..., :end, :]
    dropout, scale = float(node.attrs.get("dropout_p") or 0.0), node.attrs.get("scale")
    gqa = bool(node.attrs.get("enable_gqa"))
    if first == 0:
        return F.scaled_dot_product_attention(query, key, value, dropout_p=dropout, is_causal=True, scale=scale,
                                              enable_gqa=gqa)
    if flash_runs(query, key, value):
        if gqa and key.shape[-3] != query.shape[-3]:  # each key head serves a group of query heads
            key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
            value = value.repeat_interleave(query.shape[-3] // value.shape[-3], dim=-3)
        return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout, True, False,
                                                                  scale=scale)[0]
    positions = torch.arange(first, end, device=query.device)
    allowed = torch.arange(end, device=query.device)[None, :] <= positions[:, None]
    return F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, dropout_p=dropout, scale=scale,
                                          enable_gqa=gqa)


def flash_runs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether torch's flash kernel takes these operands: CUDA, half precision, some query rows, one
    head dim for queries, keys and values, a multiple of 8 up to ``FLASH_HEAD_DIMS``. Only tensor
    metadata is read, so torch.compile traces it without a break (``torch.backends.cuda``'s
    backend switches are not consulted: the kernel is called directly, as ``causal_lower_right`` does)."""
    head = query.shape[-1]
    return (query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and query.shape[-2] > 0
            and key.shape[-1] == value.shape[-1] == head and head % 8 == 0 and head <= FLASH_HEAD_DIMS)
