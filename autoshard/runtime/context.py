"""Causal attention with its query rows split over devices (context parallelism, keys and values gathered).

A plan may split the query rows of a causal ``scaled_dot_product_attention`` over mesh axes
(``causal_rows`` in ops.toml) while every device holds all the keys and values (the edges into
it gather them). Each device attends its rows to the keys up to each row's position in the
whole sequence. torch's ``is_causal`` aligns its mask to the top-left corner of a non-square
block, which is right only for the first rows, so the mask is built from the rows' global
positions instead.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

from autoshard.frontend.graph import OpNode
from autoshard.problem.plan import NodePlacement
from autoshard.runtime.groups import MeshGroups
from autoshard.sharding.spec import piece_size


def splits_causal_rows(node: OpNode, place: NodePlacement | None) -> bool:
    """True when ``node`` is causal attention whose query rows the plan splits."""
    return (node.op == "scaled_dot_product_attention" and bool(node.attrs.get("is_causal"))
            and place is not None and bool(place.in_specs[0].dims[-2]))


def causal_rows_attention(operands: Sequence[Any], node: OpNode, place: NodePlacement,
                          groups: MeshGroups) -> torch.Tensor:
    """This device's rows of causal attention over all keys and values (module doc)."""
    query, key, value = operands[:3]
    spec, row_dim = place.in_specs[0], place.in_specs[0].ndim - 2
    rows, mesh = query.shape[-2], groups.mesh.shape
    pieces = 1
    for axis in spec.dims[row_dim]:  # a plain loop, which torch.compile traces without a break
        pieces *= mesh[axis]
    first = spec.chunk_index(row_dim, groups.coords, mesh) * piece_size(node.out.shape[-2], pieces)
    positions = torch.arange(first, first + rows, device=query.device)
    allowed = torch.arange(key.shape[-2], device=query.device)[None, :] <= positions[:, None]
    return F.scaled_dot_product_attention(query, key, value, attn_mask=allowed,
                                          dropout_p=float(node.attrs.get("dropout_p") or 0.0),
                                          scale=node.attrs.get("scale"),
                                          enable_gqa=bool(node.attrs.get("enable_gqa")))
