"""The torch.distributed process groups of a device mesh, as seen from one rank.

Every collective in a plan runs along one mesh axis, among the ranks that share all other
coordinates (``Mesh.axis_groups``). The groups are those of a ``torch.distributed`` ``DeviceMesh``
of the plan's shape, so the same mesh also places the DTensor parameters: DeviceMesh lays ranks
out as ``torch.arange(world).view(shape)``, row-major with the last axis fastest, which is our
``Mesh.coords``, and its per-axis groups list ranks in ascending order, so a rank's group rank
along an axis is its mesh coordinate there. Creating groups is collective: every rank must
call :meth:`MeshGroups.create` with the same mesh.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autoshard.errors import AutoshardError
from autoshard.sharding.mesh import Mesh, default_links


@dataclass(frozen=True)
class MeshGroups:
    """This rank's place on the mesh and, per mesh axis, the process group it talks to along it.

    ``groups[a]`` is None for an axis of size 1 (nothing to communicate). Inside a group the
    group rank equals the mesh coordinate on that axis, so concatenating gathered pieces in
    group order puts them in mesh order. ``device_mesh`` is the same mesh for DTensors and
    ``span`` the group of all its ranks (both None without torch.distributed).
    """

    mesh: Mesh
    rank: int
    coords: tuple[int, ...]
    groups: tuple[dist.ProcessGroup | None, ...]
    device_mesh: DeviceMesh | None = None
    span: dist.ProcessGroup | None = None

    @staticmethod
    def create(mesh: Mesh, device_type: str | None = None) -> "MeshGroups":
        """The groups of every axis of ``mesh`` over the initialized default process group.

        Collective: all ranks must call it with the same mesh. Rank ``r`` of the world is the
        mesh device ``r`` (row-major, last axis fastest). ``device_type`` defaults to ``cuda``
        under NCCL and ``cpu`` otherwise.
        """
        rank, device_mesh = _world_mesh(mesh, device_type, "MeshGroups.create")
        names = device_mesh.mesh_dim_names
        for count in range(2, mesh.ndim + 1):  # DTensor then reduces over several axes in one collective
            for axes in itertools.combinations(names, count):  # (clip_grad_norm_'s norm), not one per axis
                device_mesh[axes]._flatten()
        groups = tuple(device_mesh.get_group(axis) if n > 1 else None for axis, n in enumerate(mesh.shape))
        return MeshGroups(mesh, rank, mesh.coords(rank), groups, device_mesh, dist.group.WORLD)

    @staticmethod
    def stage(mesh: Mesh, axis: int, device_type: str | None = None) -> tuple["MeshGroups", int, dist.ProcessGroup]:
        """The groups of this rank's pipeline stage: the mesh without ``axis``, over the ranks that
        share this rank's coordinate on it (returned too), and the group along ``axis`` (the ranks
        that share its other coordinates). Collective, as :meth:`create`."""
        rank, full = _world_mesh(mesh, device_type, "MeshGroups.stage")
        names = full.mesh_dim_names
        inner_names = tuple(n for a, n in enumerate(names) if a != axis)
        sub = full[inner_names] if len(inner_names) > 1 else full[inner_names[0]]
        inner = mesh.without_axis(axis)
        coords = mesh.coords(rank)
        groups = tuple(sub.get_group(a) if n > 1 else None for a, n in enumerate(inner.shape))
        span = sub._flatten().get_group() if inner.ndim > 1 else sub.get_group()
        inner_coords = coords[:axis] + coords[axis + 1:]
        return (MeshGroups(inner, inner.rank(inner_coords), inner_coords, groups, sub, span), coords[axis],
                full[names[axis]].get_group())

    @staticmethod
    def from_group(group: dist.ProcessGroup | None = None, device_type: str | None = None) -> "MeshGroups":
        """A 1-D mesh over an existing group (default: the world); no new groups are created."""
        if not dist.is_initialized():
            raise AutoshardError("torch.distributed is not initialized: call init_process_group first")
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if rank < 0:
            raise AutoshardError("this rank is not a member of the given process group: pass a group it belongs to")
        span = group or dist.group.WORLD
        device_mesh = DeviceMesh.from_group(span, device_type or default_device_type())
        return MeshGroups(line_mesh(size), rank, (rank,), (span if size > 1 else None,), device_mesh, span)

    @staticmethod
    def single() -> "MeshGroups":
        """The trivial 1-device mesh: every step is local, no torch.distributed needed."""
        return MeshGroups(line_mesh(1), 0, (0,), (None,))

    def axis_size(self, axis: int) -> int:
        """Number of devices along mesh axis ``axis``."""
        return self.mesh.shape[axis]


def _world_mesh(mesh: Mesh, device_type: str | None, caller: str) -> tuple[int, DeviceMesh]:
    """This rank and a DeviceMesh of ``mesh``'s shape (axes named ``axis0`` ...) over the whole
    world, which must be initialized and as large as the mesh (collective)."""
    if not dist.is_initialized():
        raise AutoshardError(f"torch.distributed is not initialized: call init_process_group before {caller}")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != mesh.size:
        raise AutoshardError(f"mesh {mesh.label} has {mesh.size} devices but the world has {world} ranks: launch {mesh.size}")
    names = tuple(f"axis{axis}" for axis in range(mesh.ndim))
    return rank, init_device_mesh(device_type or default_device_type(), mesh.shape, mesh_dim_names=names)


def default_device_type() -> str:
    """The device type of the default process group's tensors: ``cuda`` under NCCL, else ``cpu``."""
    return "cuda" if dist.get_backend() == "nccl" else "cpu"


def line_mesh(size: int) -> Mesh:
    """A 1-D mesh of ``size`` devices with the default link parameters."""
    return Mesh((size,), *default_links((size,)))


def broadcast_from_first(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Rank 0's values of ``tensors`` on every rank, so that ranks drawing their own random inputs agree.

    Collective over the default group; every rank passes tensors of the same shapes and dtypes
    (sent as bytes: any dtype, bool included, on any backend).
    """
    result = []
    for tensor in tensors:
        data = tensor.detach().contiguous().clone().reshape(-1).view(torch.uint8)
        dist.broadcast(data, src=0)
        result.append(data.view(tensor.dtype).reshape(tensor.shape))
    return tuple(result)


def init_gloo(rank: int, world_size: int, port: int, host: str = "127.0.0.1", timeout_s: float = 60.0,
              listen_fd: int | None = None) -> None:
    """Join a CPU (gloo) process group whose TCP store rank 0 serves on ``host:port``; ``listen_fd``:
    a socket already listening there, which rank 0 serves on (no other process can take the port).

    The timeout bounds every collective, so a rank whose peers died fails instead of hanging.
    """
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, wait_for_workers=False, timeout=timeout,
                          master_listen_fd=listen_fd if rank == 0 else None)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)


def destroy_gloo() -> None:
    """Tear down the default process group (and all subgroups) if one is initialized."""
    if dist.is_initialized():
        dist.destroy_process_group()
