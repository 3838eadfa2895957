"""Device presets: roofline, what kernels and collectives achieve of it, and allocator overheads.

The presets are data (specs/devices.toml, shipped in the package as ``autoshard.specs``), every
figure with its source; ``--device my_gpu.toml`` reads a preset of the same format from a file.
Both are checked against specs/device.schema.json. How the figures are used:

- compute (``cost/compute.py``): a kernel of class ``c`` runs at ``peak(dtype) * achieved[c]``
  flop/s and streams bytes at ``memory_bandwidth * achieved["memory"]``; where the preset has a
  ``by_flops`` curve for the class, a kernel of ``F`` local flops runs at the fraction the curve
  gives at ``F`` (interpolated in ``log F``, held at its ends) instead of ``achieved[c]``;
- the optimizer step: AdamW moves ``adamw_bytes`` bytes of HBM traffic per parameter element
  (fp32 state; scaled by the state's itemsize / 4) at the streaming bandwidth;
- collectives (``cost/communication.py``): the links' bandwidths are the bus bandwidths NCCL
  reaches (nccl-tests busBw), at which a collective moves its ring bytes;
- memory: the caching allocator reserves ``1 + allocator_headroom`` times the live bytes, and
  ``runtime_bytes`` (CUDA context, NCCL buffers) is never the allocator's: a plan fits a budget
  ``M`` when its live peak is at most ``live_limit(M)``;
- ``overlap``: parameter gathers and gradient reductions hide under compute (``problem/edges.py``).

``GENERIC`` (no ``--device``) is an ideal roofline: every fraction 1, no allocator overhead, no
overlap.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from autoshard import specs
from autoshard.errors import AutoshardError
from autoshard.sharding.mesh import NETWORK_BANDWIDTH, NETWORK_LATENCY, NVLINK_BANDWIDTH, NVLINK_LATENCY, Link

GiB = 2**30

DTYPE_CLASSES = ("fp32", "tf32", "bf16", "fp8")
"""Peak flop/s are given per class: fp32 (also fp64 and integers), tf32, bf16 (and fp16), fp8."""
KERNEL_CLASSES = ("matmul", "attention_forward", "attention_backward", "memory")
"""The kernel classes ``achieved`` gives a fraction of peak for (``memory``: of HBM bandwidth)."""


def dtype_class(dtype: str) -> str:
    """The peak-flops class of a tensor dtype name (``bfloat16`` -> ``bf16``).

    float32 matmuls count as fp32: PyTorch leaves TF32 off for matmuls by default.
    """
    if dtype in ("bfloat16", "float16"):
        return "bf16"
    if dtype.startswith("float8"):
        return "fp8"
    return "fp32"


def _ones(keys: tuple[str, ...]) -> dict[str, float]:
    return {k: 1.0 for k in keys}


@dataclass(frozen=True)
class Device:
    """One accelerator's roofline, capacity, links and achieved fractions (bytes, bytes/s, flop/s, s)."""

    name: str
    peak_flops: dict[str, float]
    memory_bandwidth: float
    memory: int | None
    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float
    inter_latency: float
    description: str = field(default="", compare=False)
    achieved: Mapping[str, float] = field(default_factory=lambda: _ones(KERNEL_CLASSES))
    allocator_headroom: float = 0.0
    runtime_bytes: int = 0
    overlap: bool = False
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    by_flops: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    adamw_bytes: float = 0.0

    @property
    def intra(self) -> Link:
        """(bandwidth, latency) of links inside a node."""
        return self.intra_bandwidth, self.intra_latency

    @property
    def inter(self) -> Link:
        """(bandwidth, latency) of links across nodes."""
        return self.inter_bandwidth, self.inter_latency

    def flops_per_second(self, dtype: str, kernel: str = "matmul", flops: float | None = None) -> float:
        """Flop/s a kernel of class ``kernel`` reaches on work in ``dtype`` (a tensor dtype name);
        ``flops``: the kernel's local flops, where the preset has a curve for its class."""
        peak = self.peak_flops.get(dtype_class(dtype)) or self.peak_flops["fp32"]
        curve = self.by_flops.get(kernel)
        if curve and flops:
            return peak * curve_fraction(curve, flops)
        return peak * self.achieved.get(kernel, 1.0)

    def optimizer_seconds(self, state_bytes: int) -> float:
        """Seconds of the AdamW step over parameters whose one optimizer slot holds ``state_bytes``."""
        return state_bytes / 4 * self.adamw_bytes / self.streaming_bandwidth

    @property
    def streaming_bandwidth(self) -> float:
        """HBM bytes/s a streaming (memory-bound) kernel reaches."""
        return self.memory_bandwidth * self.achieved["memory"]

    def device_bytes(self, live: int) -> int:
        """Device memory taken when ``live`` bytes are allocated: what the caching allocator reserves
        for them plus the runtime's own bytes."""
        return round(live * (1 + self.allocator_headroom)) + self.runtime_bytes

    def live_limit(self, budget: int) -> int:
        """The most live bytes a plan may hold so that its device bytes fit ``budget``."""
        return max(0, int((budget - self.runtime_bytes) / (1 + self.allocator_headroom)))

    def with_roofline(self, peak_flops: float | None, memory_bandwidth: float | None) -> "Device":
        """The same device with a flat peak (every dtype) and/or another memory bandwidth."""
        peaks = dict(self.peak_flops) if peak_flops is None else {c: peak_flops for c in DTYPE_CLASSES}
        bandwidth = self.memory_bandwidth if memory_bandwidth is None else memory_bandwidth
        return replace(self, peak_flops=peaks, memory_bandwidth=bandwidth)


def curve_fraction(curve: tuple[tuple[float, float], ...], flops: float) -> float:
    """The fraction ``curve`` (ascending ``(flops, fraction)`` points) gives at ``flops``: linear in
    ``log flops`` between points, the end value beyond them."""
    if flops <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if flops <= x1:
            return y0 + (y1 - y0) * (math.log(flops) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return curve[-1][1]


GENERIC = Device("generic", {c: 100e12 for c in DTYPE_CLASSES}, 2e12, None,
                 NVLINK_BANDWIDTH, NVLINK_LATENCY, NETWORK_BANDWIDTH, NETWORK_LATENCY,
                 "no preset: 100 Tflop/s in every dtype, 2 TB/s memory, 300 GB/s and 1 us inside a node, "
                 "100 GB/s and 5 us across nodes, no memory capacity, every kernel and collective at peak")
"""What applies without ``--device``: the round figures the cost model always used."""


def _preset(name: str, data: dict) -> Device:
    """One preset table (already checked against specs/device.schema.json) as a Device."""
    achieved = dict(data["achieved"])
    curves = {kernel: tuple((float(f), float(a)) for f, a in points)
              for kernel, points in data.get("by_flops", {}).items()}
    peaks = data["peak_flops"]
    summary = (f"{data['description']}: " + ", ".join(f"{c} {peaks[c] / 1e12:.4g}" for c in DTYPE_CLASSES)
               + f" Tflop/s (matmuls at {achieved['matmul']:.0%}), HBM {data['memory_bandwidth'] / 1e12:.3g} TB/s, "
               f"NCCL {data['intra']['bandwidth'] / 1e9:.0f} GB/s in a node, {data['inter']['bandwidth'] / 1e9:.0f} "
               f"GB/s across")
    return Device(name, {c: float(peaks[c]) for c in DTYPE_CLASSES}, data["memory_bandwidth"],
                  int(data["memory"] * GiB), data["intra"]["bandwidth"], data["intra"]["latency"],
                  data["inter"]["bandwidth"], data["inter"]["latency"], summary, achieved,
                  data["allocator"]["headroom"], int(data["allocator"]["runtime_gib"] * GiB), data["overlap"],
                  dict(data.get("sources", {})), curves, float(data.get("adamw", {}).get("bytes_per_parameter", 0.0)))


def _read_presets(path: Path, source: str, named_curves: Mapping[str, Device]) -> dict[str, Device]:
    """Every preset of the TOML file ``path`` by name. The file is checked against
    specs/device.schema.json, each ``by_flops`` curve for ascending flops, and a ``by_flops`` that
    names a preset (of this file, else of ``named_curves``) for that preset having curves; anything
    wrong is an AutoshardError naming ``source`` and the field."""
    try:
        with path.open("rb") as f:
            tables = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise AutoshardError(f"{source} is not TOML ({exc}): fix it (specs/README.md shows a preset)") from None
    except OSError as exc:
        raise AutoshardError(f"{source} cannot be read ({exc.strerror})") from None
    if wrong := specs.problem(tables, specs.DEVICE_SCHEMA):
        raise AutoshardError(f"{source} is malformed ({wrong}): specs/README.md shows a preset")
    for name, table in tables.items():
        curves = table.get("by_flops", {})
        if isinstance(curves, str):  # ``by_flops = "h100"``: that preset's curves
            if isinstance(tables.get(curves, {}).get("by_flops"), dict):
                table["by_flops"] = tables[curves]["by_flops"]
            elif curves in named_curves and named_curves[curves].by_flops:
                table["by_flops"] = dict(named_curves[curves].by_flops)
            else:
                raise AutoshardError(f"{source} is malformed ({name}.by_flops names {curves!r}, a preset without "
                                     f"curves): name one of {', '.join(_with_curves(tables, named_curves))}")
            continue
        for kernel, points in curves.items():
            if [f for f, _ in points] != sorted({f for f, _ in points}):
                raise AutoshardError(f"{source} is malformed ({name}.by_flops.{kernel}: the flops must ascend)")
    return {name: _preset(name, table) for name, table in tables.items()}


def _with_curves(tables: Mapping[str, dict], named_curves: Mapping[str, Device]) -> list[str]:
    """The presets, of a file's tables and of ``named_curves``, that have by_flops curves of their own."""
    own = {name for name, table in tables.items() if isinstance(table.get("by_flops"), dict)}
    return sorted(own | {name for name, device in named_curves.items() if device.by_flops})


def load_presets(path: Path = specs.DEVICES) -> dict[str, Device]:
    """Every preset in ``path`` by name (the shipped specs/devices.toml by default)."""
    return _read_presets(path, f"device presets {str(path)!r}", {})


def load_device_file(path: str | Path) -> Device:
    """The one preset of a user's TOML file (``--device my_gpu.toml``), in the format of
    specs/devices.toml; its ``by_flops`` may name a shipped preset, whose curves it then shares."""
    source = f"--device file {str(path)!r}"
    if not Path(path).is_file():
        raise AutoshardError(f"{source} does not exist: give a TOML file of one preset (specs/README.md), "
                             f"or one of the presets {', '.join(sorted(PRESETS))}")
    found = _read_presets(Path(path), source, PRESETS)
    if len(found) != 1:
        raise AutoshardError(f"{source} holds {len(found)} presets ({', '.join(found)}): give a file of one")
    return next(iter(found.values()))


PRESETS: dict[str, Device] = load_presets()


def get_device(name: str | None) -> Device:
    """The preset called ``name``, or the one of the file ``name`` when it ends in ``.toml``
    (None: the generic defaults)."""
    if name is None:
        return GENERIC
    if name.endswith(".toml"):
        return load_device_file(name)
    device = PRESETS.get(name.lower())
    if device is None:
        raise AutoshardError(f"--device {name!r} is not a preset: use one of {', '.join(sorted(PRESETS))}, "
                             "a preset file (my_gpu.toml, see specs/README.md), or give "
                             "--peak-flops/--memory-bandwidth/--bandwidth/--latency yourself")
    return device
