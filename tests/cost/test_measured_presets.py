"""The h100 preset's measured figures are those of the measurement file they cite, recomputed here."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from autoshard.cost.devices import PRESETS

MEASURED = json.loads((Path(__file__).parents[2] / "benchmarks" / "data" / "h100_sxm_measured.json").read_text())
H100 = PRESETS["h100"]
PEAK = H100.peak_flops["bf16"]


def test_the_matmul_curve_is_the_median_of_each_power_of_two_of_flops() -> None:
    grid = MEASURED["gemm"][:6**3]  # gpu_kernels.py writes the 6-size cube first, then LLaMA's shapes
    assert {r["m"] for r in grid} == {512, 1024, 2048, 4096, 8192, 16384}
    by_size: dict[int, list[float]] = {}
    for r in grid:
        by_size.setdefault(round(math.log2(2 * r["m"] * r["n"] * r["k"])), []).append(r["tflops"] * 1e12 / PEAK)
    expected = [(2.0**k, statistics.median(v)) for k, v in sorted(by_size.items())]
    assert len(H100.by_flops["matmul"]) == len(expected)
    for (flops, fraction), (want_flops, want) in zip(H100.by_flops["matmul"], expected):
        assert flops == pytest.approx(want_flops, rel=5e-3) and fraction == pytest.approx(want, abs=1e-3)


def test_the_scalar_fractions_are_the_measured_large_products_attention_and_streaming() -> None:
    large = [r["tflops"] for r in MEASURED["gemm"] if 2 * r["m"] * r["n"] * r["k"] >= 1e12]
    assert H100.achieved["matmul"] == pytest.approx(statistics.median(large) * 1e12 / PEAK, abs=1e-3)
    flash = next(r for r in MEASURED["attention"] if r["seq"] == 8192 and r["head_dim"] == 128)
    assert H100.achieved["attention_forward"] == pytest.approx(flash["forward_tflops"] * 1e12 / PEAK, abs=1e-3)
    torch_counted = flash["backward_tflops"] * 2 / 2.5  # torch counts the backward at twice the forward's flops
    assert H100.achieved["attention_backward"] == pytest.approx(torch_counted * 1e12 / PEAK, abs=1e-3)
    largest_add = max((r for r in MEASURED["streaming"] if r["kernel"] == "add"), key=lambda r: r["bytes"])
    assert H100.streaming_bandwidth == pytest.approx(largest_add["gbps"] * 1e9, rel=1e-3)


def test_the_allocator_and_optimizer_figures_are_the_measured_ones() -> None:
    run = MEASURED["allocator"]
    assert H100.allocator_headroom == pytest.approx(run["peak_reserved"] / run["peak_allocated"] - 1, abs=1e-3)
    outside = run["outside_allocator"] + MEASURED["nccl"]["one_rank_bytes"]
    assert H100.runtime_bytes == pytest.approx(outside, rel=0.01)
    foreach = next(r for r in MEASURED["adamw"] if r["implementation"] == "foreach")
    assert H100.optimizer_seconds(4 * foreach["parameters"]) == pytest.approx(foreach["seconds"], rel=1e-3)


@pytest.mark.parametrize("kind", ["forward", "backward"])
def test_the_attention_curves_are_the_flash_kernel_at_head_dim_128(kind: str) -> None:
    runs = [r for r in MEASURED["attention"] if r["head_dim"] == 128]
    expected = [(2 * r["batch"] * r["heads"] * r["seq"] ** 2 * 128,  # causal: half of torch's 4 b h s^2 d
                 r[f"{kind}_tflops"] * (0.8 if kind == "backward" else 1.0) * 1e12 / PEAK) for r in runs]
    curve = H100.by_flops[f"attention_{kind}"]
    assert len(curve) == len(expected)
    for (flops, fraction), (want_flops, want) in zip(curve, expected):
        assert flops == pytest.approx(want_flops, rel=5e-3) and fraction == pytest.approx(want, abs=1e-3)


def test_the_other_hopper_presets_take_the_h100_curves_by_name() -> None:
    assert PRESETS["h100-hbm2e"].by_flops == PRESETS["h200"].by_flops == H100.by_flops
