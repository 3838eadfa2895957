"""Our layouts as DTensor placements: a TensorSpec on a mesh -> one placement per mesh axis; a
rank's piece of a whole tensor (:func:`distribute`), the whole from the pieces (:func:`gather_full`);
a dim the mesh does not divide is cut as ``torch.chunk`` and DTensor's ``Shard`` cut it.

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

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from autoshard.runtime.collectives import run_steps
from autoshard.runtime.groups import MeshGroups
from autoshard.sharding.reshard import reshard_steps
from autoshard.sharding.spec import TensorSpec, piece_range


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


def distribute(full: torch.Tensor, spec: TensorSpec, groups: MeshGroups) -> torch.Tensor:
    """This rank's piece of a tensor every rank holds whole (a view; ``spec`` must not be partial)."""
    if spec.partial:
        raise ValueError(f"cannot cut a whole tensor into the partial layout {spec}")
    shape = groups.mesh.shape
    for d, n in enumerate(full.shape):
        start, length = piece_range(n, spec.shard_factor(d, shape), spec.chunk_index(d, groups.coords, shape))
        full = full.narrow(d, start, length)
    return full


def gather_full(local: torch.Tensor, spec: TensorSpec, groups: MeshGroups,
                shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """The whole tensor on every rank from the local pieces of layout ``spec`` (collective, no autograd;
    a DTensor contributes its local piece). ``shape``, the whole's, is needed where the mesh cuts a
    dim unevenly (a DTensor knows it; else the pieces are taken as even)."""
    mesh = groups.mesh.shape
    if shape is None and isinstance(local, DTensor):
        shape = tuple(local.shape)
    local = local_of(local)
    if shape is None:
        shape = tuple(n * spec.shard_factor(d, mesh) for d, n in enumerate(local.shape))
    steps = reshard_steps(spec, TensorSpec.replicated(len(shape)), shape, local.element_size(), mesh)
    with torch.no_grad():
        return run_steps(local, steps, groups)


def local_of(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a DTensor (autograd-connected), or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def as_dtensor(local: torch.Tensor, spec: TensorSpec, groups: MeshGroups, shape: tuple[int, ...]) -> torch.Tensor:
    """``local`` as the DTensor of global ``shape`` laid out by ``spec`` on the groups' DeviceMesh.

    No communication: every rank passes its own piece. Without a DeviceMesh (one device, no
    torch.distributed) or with one rank in all, the local tensor is the whole tensor and is
    returned as is: a DTensor on a mesh of one device would only wrap every use.
    """
    if groups.device_mesh is None or dist.get_world_size() == 1:
        return local
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, groups.device_mesh, spec_placements(spec, groups.mesh.shape),
                              run_check=False, shape=torch.Size(shape), stride=stride)
