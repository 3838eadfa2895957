"""Our layouts as DTensor placements: a TensorSpec on a mesh -> one placement per mesh axis.

A :class:`~autoshard.sharding.spec.TensorSpec` says, per tensor dim, which mesh axes cut it,
major first: the device at coordinates ``c`` holds piece ``sum_i c[a_i] * prod_{j>i} n[a_j]`` of
a dim cut by axes ``(a_1, ..., a_k)``. DTensor says, per mesh axis, ``Shard(d)``, ``Replicate()``
or ``Partial()``, and applies the shards in mesh-axis order (axis 0 outermost). The two agree
exactly when every dim's axes are listed in ascending order:

- ``R``  -> ``Replicate()`` on every axis; ``S01R`` (dim 0 cut by axis 0, then axis 1) ->
  ``(Shard(0), Shard(0))``; ``RS1`` -> ``(Replicate(), Shard(1))``; ``P1`` -> ``Partial()`` on axis 1.
- A dim cut by axes out of ascending order (``S10R``: axis 1 major, axis 0 minor) has no form in
  DTensor's public placements: ``(Shard(0), Shard(0))`` would put the piece ``c0 * n1 + c1`` where
  our layout has ``c1 * n0 + c0``. PyTorch represents exactly this "right-to-left" sharding (FSDP2
  over tensor parallelism) with ``_StridedShard(d, split_factor)``: axis ``a`` of such a dim
  becomes ``_StridedShard(d, split_factor=s)`` where ``s`` is the number of pieces the more major
  axes with a larger mesh index (which DTensor applies after ``a``) cut the dim into. This is
  the placement FSDP2 itself produces; every axis order on 2x2, 2x4 and 2x2x2 meshes is checked
  against our own slicing (``tests/runtime/test_dtensor_params.py``), and
  torch.distributed.checkpoint saves and reloads it into any other layout.
"""

from __future__ import annotations

import math

from torch.distributed.tensor import Partial, Placement, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from autoshard.sharding.spec import TensorSpec


def spec_placements(spec: TensorSpec, mesh_shape: tuple[int, ...]) -> tuple[Placement, ...]:
    """The DTensor placements (one per mesh axis) holding the same local piece as ``spec`` does."""
    placements: list[Placement] = [Replicate()] * len(mesh_shape)
    for axis in spec.partial:
        placements[axis] = Partial()
    for dim, axes in enumerate(spec.dims):
        for position, axis in enumerate(axes):
            split = math.prod(mesh_shape[a] for a in axes[:position] if a > axis)
            placements[axis] = Shard(dim) if split == 1 else _StridedShard(dim, split_factor=split)
    return tuple(placements)

