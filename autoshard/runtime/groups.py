"""The torch.distributed process groups of a device mesh, as seen from one rank.

Every collective in a plan runs along one mesh axis, among the ranks that share all other
coordinates (``Mesh.axis_groups``). ``torch.distributed.new_group`` is itself collective: every
rank must create every group, in the same order, even the groups it is not a member of, so
:meth:`MeshGroups.create` walks all axes and all their groups identically on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from autoshard.errors import AutoshardError
from autoshard.sharding.mesh import Mesh, default_links


@dataclass(frozen=True)
class MeshGroups:
    """This rank's place on the mesh and, per mesh axis, the process group it talks to along it.

    ``groups[a]`` is None for an axis of size 1 (nothing to communicate). Inside a group the
    group rank equals the mesh coordinate on that axis, so concatenating gathered pieces in
    group order puts them in mesh order.
    """

    mesh: Mesh
    rank: int
    coords: tuple[int, ...]
    groups: tuple[dist.ProcessGroup | None, ...]

    @staticmethod
    def create(mesh: Mesh) -> "MeshGroups":
        """Build the groups of every axis of ``mesh`` over the initialized default process group.

        Collective: all ranks must call it with the same mesh. Rank ``r`` of the world is the
        mesh device ``r`` (row-major, last axis fastest).
        """
        if not dist.is_initialized():
            raise AutoshardError("torch.distributed is not initialized: call init_process_group before MeshGroups.create")
        world, rank = dist.get_world_size(), dist.get_rank()
        if world != mesh.size:
            raise AutoshardError(f"mesh {mesh.label} has {mesh.size} devices but the world has {world} ranks: launch {mesh.size}")
        mine: list[dist.ProcessGroup | None] = []
        for axis in range(mesh.ndim):
            axis_group: dist.ProcessGroup | None = None
            for ranks in mesh.axis_groups(axis):
                if len(ranks) == 1:
                    continue
                group = dist.group.WORLD if len(ranks) == world else dist.new_group(ranks)
                if rank in ranks:
                    axis_group = group
            mine.append(axis_group)
        return MeshGroups(mesh, rank, mesh.coords(rank), tuple(mine))

    @staticmethod
    def from_group(group: dist.ProcessGroup | None = None) -> "MeshGroups":
        """A 1-D mesh over an existing group (default: the world); no new groups are created."""
        if not dist.is_initialized():
            raise AutoshardError("torch.distributed is not initialized: call init_process_group first")
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if rank < 0:
            raise AutoshardError("this rank is not a member of the given process group: pass a group it belongs to")
        return MeshGroups(line_mesh(size), rank, (rank,), ((group or dist.group.WORLD) if size > 1 else None,))

    @staticmethod
    def single() -> "MeshGroups":
        """The trivial 1-device mesh: every step is local, no torch.distributed needed."""
        return MeshGroups(line_mesh(1), 0, (0,), (None,))

    def axis_size(self, axis: int) -> int:
        """Number of devices along mesh axis ``axis``."""
        return self.mesh.shape[axis]


def line_mesh(size: int) -> Mesh:
    """A 1-D mesh of ``size`` devices with the default link parameters."""
    return Mesh((size,), *default_links((size,)))


def init_gloo(rank: int, world_size: int, port: int, host: str = "127.0.0.1", timeout_s: float = 60.0) -> None:
    """Join a CPU (gloo) process group whose TCP store rank 0 serves on ``host:port``.

    The timeout bounds every collective, so a rank whose peers died fails instead of hanging.
    """
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{host}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def destroy_gloo() -> None:
    """Tear down the default process group (and all subgroups) if one is initialized."""
    if dist.is_initialized():
        dist.destroy_process_group()
