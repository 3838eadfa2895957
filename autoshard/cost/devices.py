"""Device presets: peak flop/s per dtype, memory bandwidth and capacity, and link speeds.

Figures are the vendors' published dense (non-sparse) peaks for the SXM parts (NVIDIA A100,
H100 and H200 datasheets; the HGX B200 datasheet divided by its 8 GPUs). Link bandwidths are
per device and per direction: NVLink's bidirectional figure halved (A100 600 GB/s, H100/H200
900 GB/s, B200 1.8 TB/s), and one 200 Gb/s (A100, HDR InfiniBand) or 400 Gb/s (H100, H200, B200,
NDR / ConnectX-7) network port per GPU across nodes. Latencies are per collective call, the
order of nccl-tests' small-message all-reduce times (about 10 us inside a node, 25 us across);
calibrate with ``--latency``. Capacities are the nominal ones (the usable amount is ~2% less).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoshard.errors import AutoshardError
from autoshard.sharding.mesh import NETWORK_BANDWIDTH, NETWORK_LATENCY, NVLINK_BANDWIDTH, NVLINK_LATENCY, Link

GiB = 2**30

DTYPE_CLASSES = ("fp32", "tf32", "bf16", "fp8")
"""Peak flop/s are given per class: fp32 (also fp64 and integers), tf32, bf16 (and fp16), fp8."""


def dtype_class(dtype: str) -> str:
    """The peak-flops class of a tensor dtype name (``bfloat16`` -> ``bf16``).

    float32 matmuls count as fp32: PyTorch leaves TF32 off for matmuls by default.
    """
    if dtype in ("bfloat16", "float16"):
        return "bf16"
    if dtype.startswith("float8"):
        return "fp8"
    return "fp32"


@dataclass(frozen=True)
class Device:
    """One accelerator's roofline, capacity and links (bytes, bytes/s, flop/s, seconds)."""

    name: str
    peak_flops: dict[str, float]
    memory_bandwidth: float
    memory: int | None
    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float
    inter_latency: float
    description: str = field(default="", compare=False)

    @property
    def intra(self) -> Link:
        """(bandwidth, latency) of links inside a node."""
        return self.intra_bandwidth, self.intra_latency

    @property
    def inter(self) -> Link:
        """(bandwidth, latency) of links across nodes."""
        return self.inter_bandwidth, self.inter_latency

    def flops_per_second(self, dtype: str) -> float:
        """Peak flop/s for work in ``dtype`` (a tensor dtype name)."""
        cls = dtype_class(dtype)
        return self.peak_flops.get(cls) or self.peak_flops["fp32"]

    def with_roofline(self, peak_flops: float | None, memory_bandwidth: float | None) -> "Device":
        """The same device with a flat peak (every dtype) and/or another memory bandwidth."""
        peaks = dict(self.peak_flops) if peak_flops is None else {c: peak_flops for c in DTYPE_CLASSES}
        bandwidth = self.memory_bandwidth if memory_bandwidth is None else memory_bandwidth
        return Device(self.name, peaks, bandwidth, self.memory, self.intra_bandwidth, self.intra_latency,
                      self.inter_bandwidth, self.inter_latency, self.description)


def _flat(value: float) -> dict[str, float]:
    return {c: value for c in DTYPE_CLASSES}


GENERIC = Device("generic", _flat(100e12), 2e12, None, NVLINK_BANDWIDTH, NVLINK_LATENCY, NETWORK_BANDWIDTH,
                 NETWORK_LATENCY,
                 "no preset: 100 Tflop/s in every dtype, 2 TB/s memory, 300 GB/s and 1 us inside a node, "
                 "100 GB/s and 5 us across nodes, no memory capacity")
"""What applies without ``--device``: the round figures the cost model always used."""

PRESETS: dict[str, Device] = {
    "a100": Device("a100", {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp8": 312e12}, 2.039e12,
                   80 * GiB, 300e9, 10e-6, 25e9, 25e-6,
                   "NVIDIA A100 SXM 80GB: fp32 19.5, tf32 156, bf16 312 Tflop/s (no fp8: bf16 rate), "
                   "HBM2e 2.04 TB/s, NVLink 3 600 GB/s, HDR 200 Gb/s per GPU"),
    "h100": Device("h100", {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp8": 1978.9e12}, 3.35e12,
                   80 * GiB, 450e9, 10e-6, 50e9, 25e-6,
                   "NVIDIA H100 SXM 80GB: fp32 67, tf32 495, bf16 989, fp8 1979 Tflop/s, HBM3 3.35 TB/s, "
                   "NVLink 4 900 GB/s, NDR 400 Gb/s per GPU"),
    "h200": Device("h200", {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp8": 1978.9e12}, 4.8e12,
                   141 * GiB, 450e9, 10e-6, 50e9, 25e-6,
                   "NVIDIA H200 SXM 141GB: compute as H100, HBM3e 4.8 TB/s, NVLink 4 900 GB/s, "
                   "NDR 400 Gb/s per GPU"),
    "b200": Device("b200", {"fp32": 75e12, "tf32": 1125e12, "bf16": 2250e12, "fp8": 4500e12}, 8e12,
                   180 * GiB, 900e9, 10e-6, 50e9, 25e-6,
                   "NVIDIA B200 (HGX B200 / 8): fp32 75, tf32 1125, bf16 2250, fp8 4500 Tflop/s, "
                   "HBM3e 8 TB/s, NVLink 5 1.8 TB/s, 400 Gb/s per GPU"),
}


def get_device(name: str | None) -> Device:
    """The preset called ``name`` (None: the generic defaults)."""
    if name is None:
        return GENERIC
    device = PRESETS.get(name.lower())
    if device is None:
        raise AutoshardError(f"--device {name!r} is not a preset: use one of {', '.join(sorted(PRESETS))}, "
                             "or give --peak-flops/--memory-bandwidth/--bandwidth/--latency yourself")
    return device
