"""Logical device mesh: axis sizes plus an alpha-beta link model (latency, bandwidth) per axis.

Ranks are laid out row-major, the last axis varying fastest: on ``2x4`` ranks 0-3 share mesh
coordinate 0 on axis 0. The last axes are the ones inside a node (fast links), so the default
link parameters give every axis that fits inside ``gpus_per_node`` devices NVLink speed and the
outer axes the slower inter-node network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoshard.errors import AutoshardError

NVLINK_BANDWIDTH = 300e9  # bytes/s per device, inside a node
NVLINK_LATENCY = 1e-6  # s per collective call
NETWORK_BANDWIDTH = 100e9  # bytes/s per device, across nodes
NETWORK_LATENCY = 5e-6


@dataclass(frozen=True)
class Mesh:
    """An N-D device mesh with per-axis link parameters (bytes/s, seconds)."""

    shape: tuple[int, ...]
    bandwidth: tuple[float, ...]
    latency: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.shape or any(n < 1 for n in self.shape):
            raise AutoshardError(f"mesh {self.shape} is invalid: every axis needs at least 1 device")
        if len(self.bandwidth) != len(self.shape) or len(self.latency) != len(self.shape):
            raise AutoshardError(
                f"mesh {self.label} has {len(self.shape)} axes but {len(self.bandwidth)} bandwidths "
                f"and {len(self.latency)} latencies: give one value per axis"
            )
        if any(b <= 0 for b in self.bandwidth) or any(a < 0 for a in self.latency):
            raise AutoshardError("bandwidths must be > 0 and latencies >= 0: fix --bandwidth/--latency")

    @property
    def ndim(self) -> int:
        """Number of mesh axes."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of devices."""
        return math.prod(self.shape)

    @property
    def label(self) -> str:
        """The mesh as written on the command line, e.g. ``2x4``."""
        return "x".join(str(n) for n in self.shape)

    def axes_size(self, axes: tuple[int, ...] | frozenset[int]) -> int:
        """Number of devices spanned by the given mesh axes."""
        return math.prod(self.shape[a] for a in axes)

    def coords(self, rank: int) -> tuple[int, ...]:
        """Mesh coordinates of a rank (row-major, last axis fastest)."""
        out = []
        for n in reversed(self.shape):
            out.append(rank % n)
            rank //= n
        return tuple(reversed(out))

    def rank(self, coords: tuple[int, ...]) -> int:
        """Rank at the given mesh coordinates."""
        r = 0
        for c, n in zip(coords, self.shape):
            r = r * n + c
        return r

    def without_axis(self, axis: int) -> "Mesh":
        """The mesh of the other axes (a pipeline stage's, when ``axis`` carries the pipeline)."""
        keep = [a for a in range(self.ndim) if a != axis]
        return Mesh(tuple(self.shape[a] for a in keep), tuple(self.bandwidth[a] for a in keep),
                    tuple(self.latency[a] for a in keep))

    def axis_groups(self, axis: int) -> list[list[int]]:
        """The rank groups that communicate along one mesh axis (one group per other coordinate)."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for r in range(self.size):
            c = self.coords(r)
            groups.setdefault(c[:axis] + c[axis + 1 :], []).append(r)
        return list(groups.values())

    def to_json(self) -> dict:
        """Plain-data form for plan files."""
        return {"shape": list(self.shape), "bandwidth": list(self.bandwidth), "latency": list(self.latency)}

    @staticmethod
    def from_json(data: dict) -> "Mesh":
        """Inverse of :meth:`to_json`."""
        return Mesh(tuple(data["shape"]), tuple(data["bandwidth"]), tuple(data["latency"]))


Link = tuple[float, float]
"""(bandwidth in bytes/s per device, latency in seconds per collective) of one kind of link."""
NVLINK: Link = (NVLINK_BANDWIDTH, NVLINK_LATENCY)
NETWORK: Link = (NETWORK_BANDWIDTH, NETWORK_LATENCY)


def default_links(shape: tuple[int, ...], gpus_per_node: int = 8, intra: Link = NVLINK,
                  inter: Link = NETWORK) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-axis (bandwidth, latency): ``intra`` for inner axes that fit in one node, ``inter`` outside."""
    bandwidth: list[float] = []
    latency: list[float] = []
    inner = 1
    for n in reversed(shape):
        inner *= n
        link = intra if inner <= gpus_per_node else inter
        bandwidth.append(link[0])
        latency.append(link[1])
    return tuple(reversed(bandwidth)), tuple(reversed(latency))


def _parse_floats(text: str, what: str, ndim: int) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise AutoshardError(f"--{what} {text!r} is not a comma-separated list of numbers, e.g. 300e9,25e9") from None
    if len(values) == 1:
        values = values * ndim
    if len(values) != ndim:
        raise AutoshardError(f"--{what} {text!r} gives {len(values)} values for a {ndim}-axis mesh: give 1 or {ndim}")
    return values


def parse_mesh(
    text: str,
    bandwidth: str | None = None,
    latency: str | None = None,
    gpus_per_node: int = 8,
    intra: Link = NVLINK,
    inter: Link = NETWORK,
) -> Mesh:
    """Parse ``8``, ``2x4`` or ``2x2x2`` plus optional comma-separated per-axis link values;
    axes without them get ``intra`` links inside a node of ``gpus_per_node`` devices, ``inter`` outside."""
    parts = text.lower().replace("×", "x").split("x")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise AutoshardError(
            f"--mesh {text!r} is not a mesh: write the device count (8) or axis sizes (2x4), integers >= 1"
        ) from None
    if any(n < 1 for n in shape):
        raise AutoshardError(f"--mesh {text!r} has an axis with fewer than 1 device: every axis size must be >= 1")
    bw, lat = default_links(shape, gpus_per_node, intra, inter)
    if bandwidth is not None:
        bw = _parse_floats(bandwidth, "bandwidth", len(shape))
    if latency is not None:
        lat = _parse_floats(latency, "latency", len(shape))
    return Mesh(shape, bw, lat)
