"""The AdamW step is charged to each parameter's stored layout: its local elements times the
preset's measured traffic, so sharded optimizer state (ZeRO, FSDP) steps faster."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autoshard.api import build_model_problem
from autoshard.cost.devices import PRESETS
from autoshard.frontend.trace import trace

H100 = PRESETS["h100"]


def weight_candidate(mode: str, device: str | None, precision: str = "bf16-mixed"):  # noqa: ANN201
    model = nn.Sequential(nn.Linear(1024, 4096, bias=False), nn.ReLU(), nn.Linear(4096, 1024, bias=False))
    mp = build_model_problem(trace(model, (torch.randn(64, 1024),)), "4", mode=mode, device=device,
                             precision=precision)
    return next(c for c in mp.candidates.values() if c.node.target.endswith("0.weight")), mp


def test_each_layout_pays_the_adamw_step_over_its_local_piece() -> None:
    candidate, mp = weight_candidate("training", "h100")
    for strategy, ticks in zip(candidate.strategies, candidate.costs):
        shards = 4 if strategy.out_spec.used_axes else 1  # one mesh axis of 4
        elements = 1024 * 4096 // shards
        expected = elements * H100.adamw_bytes / H100.streaming_bandwidth  # fp32 state under bf16-mixed
        assert ticks / mp.cost_model.ticks_per_unit == pytest.approx(expected, rel=1e-3, abs=2e-9)
    assert min(candidate.costs) < max(candidate.costs)


@pytest.mark.parametrize("mode, device", [("inference", "h100"), ("training", None)])
def test_no_optimizer_step_without_training_or_a_measured_device(mode: str, device: str | None) -> None:
    candidate, _ = weight_candidate(mode, device)
    assert set(candidate.costs) == {0}
