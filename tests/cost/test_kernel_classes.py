"""Compute time per kernel class: GEMMs, fused attention (causal halves the counted flops), streaming ops."""

from __future__ import annotations

import math

import pytest

from autoshard.cost.compute import op_times
from autoshard.cost.devices import PRESETS, curve_fraction
from autoshard.frontend.graph import OpWork

H100 = PRESETS["h100"]
WORK = OpWork(flops=4 * 10**12, backward_flops=8 * 10**12)


def test_a_matmul_runs_at_the_achieved_gemm_rate() -> None:
    times = op_times(WORK, 2, [1000, 1000], [True, True], 1000, "bfloat16", H100, "linear")
    rate = H100.flops_per_second("bfloat16", "matmul", 2e12)  # each product is one device's 2 Tflop
    assert rate == pytest.approx(H100.peak_flops["bf16"] * curve_fraction(H100.by_flops["matmul"], 2e12))
    assert times.forward == pytest.approx(2e12 / rate)
    assert times.backward == pytest.approx(4e12 / rate)


def test_a_product_sharded_small_runs_below_the_large_products_rate() -> None:
    large = op_times(WORK, 1, [1, 1], [True, True], 1, "bfloat16", H100, "linear")
    small = op_times(WORK, 1000, [1, 1], [True, True], 1, "bfloat16", H100, "linear")  # 4 Gflop each
    assert small.forward * 1000 > 4 * large.forward


@pytest.mark.parametrize("flops", [1e6, 3e8, 1.07e9, 5e10, 8.8e12, 1e15])
def test_the_matmul_curve_interpolates_in_log_flops_and_holds_at_its_ends(flops: float) -> None:
    curve = ((1e9, 0.1), (1e11, 0.5), (1e13, 0.7))
    expected = 0.1 if flops <= 1e9 else 0.7 if flops >= 1e13 else (
        0.1 + 0.4 * math.log10(flops / 1e9) / 2 if flops <= 1e11 else 0.5 + 0.2 * math.log10(flops / 1e11) / 2)
    assert curve_fraction(curve, flops) == pytest.approx(expected)


def test_causal_attention_runs_half_the_counted_flops_at_the_attention_rates() -> None:
    full = op_times(WORK, 1, [1, 1, 1], [True] * 3, 1, "bfloat16", H100, "scaled_dot_product_attention")
    causal = op_times(WORK, 1, [1, 1, 1], [True] * 3, 1, "bfloat16", H100, "scaled_dot_product_attention", True)
    for flops, times in ((4e12, full), (2e12, causal)):  # the rate is the curve's at the computed forward flops
        forward_rate = H100.flops_per_second("bfloat16", "attention_forward", flops)
        backward_rate = H100.flops_per_second("bfloat16", "attention_backward", flops)
        assert forward_rate == pytest.approx(H100.peak_flops["bf16"] * curve_fraction(
            H100.by_flops["attention_forward"], flops))
        assert times.forward == pytest.approx(flops / forward_rate)
        assert times.backward == pytest.approx(2 * flops / backward_rate)
    assert causal.forward < full.forward / 2 * 1.1
    linear_causal = op_times(WORK, 1, [1, 1], [True] * 2, 1, "bfloat16", H100, "linear", True)
    assert linear_causal == op_times(WORK, 1, [1, 1], [True] * 2, 1, "bfloat16", H100, "linear")


def test_an_elementwise_op_streams_at_the_achieved_bandwidth() -> None:
    nbytes = 3 * 2**30
    times = op_times(OpWork(), 1, [nbytes, nbytes], [True, False], nbytes, "bfloat16", H100, "add")
    streaming = H100.memory_bandwidth * H100.achieved["memory"]
    assert times.forward == pytest.approx(3 * nbytes / streaming)
    assert times.backward == pytest.approx(4 * nbytes / streaming)  # grad out, both operands, one grad
