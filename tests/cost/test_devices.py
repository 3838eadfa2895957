"""Device presets: every figure sourced, fractions in range, the allocator's arithmetic inverse."""

from __future__ import annotations

import pytest

from autoshard.cost.devices import GENERIC, KERNEL_CLASSES, PRESETS, get_device
from autoshard.errors import AutoshardError

SOURCED = ("peak", "matmul", "attention", "memory", "intra", "inter", "allocator", "overlap")
GiB = 2**30


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_figure_has_a_source_and_a_plausible_value(name: str) -> None:
    device = PRESETS[name]
    assert all(device.sources.get(key) for key in SOURCED), sorted(device.sources)
    # the lowest sourced fraction: FlashAttention-2 on a B200 (Ampere's kernels on Blackwell), 14%
    assert all(0.1 < device.achieved[k] <= 1.0 for k in KERNEL_CLASSES)
    assert device.peak_flops["bf16"] > device.peak_flops["fp32"] > 0
    assert device.intra_bandwidth > device.inter_bandwidth > 0
    assert 0 <= device.allocator_headroom < 1 and device.overlap
    assert device.flops_per_second("bfloat16", "matmul") == pytest.approx(
        device.peak_flops["bf16"] * device.achieved["matmul"])
    assert not device.adamw_bytes or device.sources.get("adamw")
    assert all(0 < f <= 1 for _, f in (p for c in device.by_flops.values() for p in c))


@pytest.mark.parametrize("budget", [8 * GiB, 80 * GiB, 95 * GiB + 12345])
def test_live_limit_is_the_most_live_bytes_whose_reservation_fits(budget: int) -> None:
    device = PRESETS["h100"]
    live = device.live_limit(budget)
    assert device.device_bytes(live) <= budget
    assert device.device_bytes(live + 2**20) > budget


def test_generic_device_is_the_ideal_roofline() -> None:
    assert all(GENERIC.achieved[k] == 1.0 for k in KERNEL_CLASSES)
    assert GENERIC.live_limit(10**9) == 10**9 and not GENERIC.overlap
    with pytest.raises(AutoshardError, match="not a preset"):
        get_device("tpu")
