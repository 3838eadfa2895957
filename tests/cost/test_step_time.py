"""The predicted step of a LLaMA-3-8B-shaped model lies near the analytic compute floor."""

from __future__ import annotations

from autoshard.api import build_model_problem, default_solve_options, solve_model_problem
from autoshard.frontend.trace import trace
from benchmarks.models import llama3_8b


def analytic_floor(layers: int, devices: int, peak: float, batch: int = 8, seq: int = 4096) -> float:
    """6 flops per matmul weight per token, plus 12 b s^2 d per layer (attention), over all devices."""
    hidden, kv, mlp, vocab = 4096, 1024, 14336, 128256
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * mlp
    weights = layers * per_layer + hidden * vocab
    flops = 6 * weights * batch * seq + 12 * batch * seq * seq * hidden * layers
    return flops / devices / peak


def test_llama3_8b_training_step_is_within_1_6x_of_the_compute_floor():
    model, inputs = llama3_8b(layers=2)
    graph = trace(model, inputs)
    mp = build_model_problem(graph, 8, mode="training", peak_flops=1e14, memory_bandwidth=2e12)
    solution = solve_model_problem(mp, default_solve_options(mp)).solution
    seconds = solution.cost / mp.cost_model.ticks_per_unit
    ratio = seconds / analytic_floor(2, 8, 1e14)
    assert 1.0 <= ratio <= 1.6, ratio
