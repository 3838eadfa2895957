"""Pieces of dims the mesh does not divide, at run time.

Such a dim is cut by one mesh axis into ``torch.chunk`` pieces (``sharding/spec.py``): every
piece but the last has ``ceil(n / p)`` elements, the last fewer. A collective over that axis
moves pieces of the largest size, as DTensor's ``Shard`` pads them: before it, this rank's piece
is zero-padded at its end (:func:`pad_for`); after it, the result is cut back to the pieces the
layout holds (:func:`trim_after`). Since only the last piece is short, every pad of a gathered
or exchanged dim lies at its end. A step knows its tensor's global shape (``Step.shape``); steps
of evenly cut tensors carry none and pass through unchanged.

The plan's local sizes (views, expands, a slice's end) are those of the largest piece; on a
rank holding a shorter one, :func:`piece_attrs` gives the sizes of its own.
"""

from __future__ import annotations

from typing import Any

import torch

from autoshard.frontend.graph import OpNode
from autoshard.problem.plan import NodePlacement
from autoshard.runtime.groups import MeshGroups
from autoshard.runtime.step_ops import Op
from autoshard.sharding.reshard import ALL_GATHER, ALL_TO_ALL, REDUCE_SCATTER
from autoshard.sharding.rules import load_rules
from autoshard.sharding.spec import piece_range, piece_size


def _uneven(op: Op, dim: int | None) -> bool:
    """True when the step's axis cuts ``dim`` of its tensor into pieces of different sizes."""
    return bool(op.step.shape) and dim is not None and op.step.shape[dim] % op.size != 0


def _resize(x: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    """``x`` cut at, or zero-padded to, ``length`` along ``dim`` (the end moves)."""
    have = x.shape[dim]
    if have >= length:
        return x.narrow(dim, 0, length)
    shape = list(x.shape)
    shape[dim] = length - have
    return torch.cat([x, x.new_zeros(shape)], dim)


def _own(op: Op, dim: int) -> int:
    """Elements of this rank's piece of ``dim`` when the step's axis alone cuts it."""
    return piece_range(op.step.shape[dim], op.size, op.coord)[1]


def slice_piece(x: torch.Tensor, op: Op) -> torch.Tensor | None:
    """This rank's piece of a whole dim cut unevenly by a slice step (None: an even cut)."""
    dim = op.step.dim
    if not _uneven(op, dim):
        return None
    start, length = piece_range(op.step.shape[dim], op.size, op.coord)
    return x.narrow(dim, start, length)


def pad_for(x: torch.Tensor, op: Op) -> torch.Tensor:
    """``x`` padded so the collective of ``op`` moves equal pieces (module doc)."""
    kind, step, n = op.step.kind, op.step, op.size
    if kind == ALL_GATHER and _uneven(op, step.dim):
        return _resize(x, step.dim, piece_size(step.shape[step.dim], n))
    if kind == REDUCE_SCATTER and _uneven(op, step.dim):
        return _resize(x, step.dim, n * piece_size(step.shape[step.dim], n))
    if kind == ALL_TO_ALL:
        if _uneven(op, step.dim):
            x = _resize(x, step.dim, piece_size(step.shape[step.dim], n))
        if _uneven(op, step.to_dim):
            x = _resize(x, step.to_dim, n * piece_size(step.shape[step.to_dim], n))
    return x


def trim_after(out: torch.Tensor, op: Op) -> torch.Tensor:
    """A finished collective's result without the padding :func:`pad_for` added."""
    kind, step = op.step.kind, op.step
    if kind in (ALL_GATHER, ALL_TO_ALL) and _uneven(op, step.dim):
        out = _resize(out, step.dim, step.shape[step.dim])
    if kind == REDUCE_SCATTER and _uneven(op, step.dim):
        out = _resize(out, step.dim, _own(op, step.dim))
    if kind == ALL_TO_ALL and _uneven(op, step.to_dim):
        out = _resize(out, step.to_dim, _own(op, step.to_dim))
    return out


def piece_attrs(node: OpNode, place: NodePlacement | None, groups: MeshGroups) -> dict[str, Any]:
    """Attribute overrides that give this rank's own piece of ``node``'s output where the plan
    cuts it unevenly: the sizes of a view or expand, the end of a prefix slice (empty: none needed)."""
    meta = node.tensor
    if place is None or place.out_spec is None or meta is None or place.out_spec.ndim != len(meta.shape):
        return {}
    mesh = groups.mesh.shape
    uneven = place.out_spec.uneven_dims(meta.shape, mesh)
    if not uneven:
        return {}
    piece = list(place.out_spec.piece_shape(meta.shape, groups.coords, mesh))
    rule = load_rules().get(node.op or "")
    if rule is None:
        return {}
    if rule.kind == "slice":
        dim = int(node.attrs.get("dim", 0)) % len(piece)
        if dim not in uneven:
            return {}
        return {"length": piece[dim]} if "length" in node.attrs else {"start": 0, "end": piece[dim]}
    attr = rule.options.get("local_size_attr")
    if attr is None or attr not in place.local_attrs:
        return {}
    if attr == "sizes":  # unflatten(dim, sizes): only the new dims' sizes
        count = len(node.attrs.get("sizes", ()))
        dim = int(node.attrs.get("dim", 0)) % (len(piece) - count + 1)
        return {attr: piece[dim: dim + count]}
    return {attr: piece}
