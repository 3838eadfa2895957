"""A pipeline stage's memory with microbatches in flight, against MemTracker on its real schedule.

The stage's own plan runs its device's actions of a two-stage pipeline (4 microbatches; the
first device holds 2 under 1F1B and 4 under GPipe, the last 1) with gradients accumulating:
the prediction (one microbatch's profile plus the boundary state of the others for the whole
step) is within 10% of the measured peak (measured: 0.96, 0.94 and 1.04 of it).
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autoshard.api import StageOptions, build_model_problem
from autoshard.frontend.graph import NodeKind
from autoshard.frontend.trace import trace
from autoshard.pipeline.schedules import device_orders, peak_in_flight
from autoshard.pipeline.stages import cut
from autoshard.problem.readback import make_plan
from autoshard.runtime.measure import measure_stage_peak
from autoshard.sharding.layers import find_repeated_layers
from tests.pipeline.models import Transformer
from tests.cost.test_memory import TOLERANCE
from tests.runtime.dist import run_ranks

MICROBATCHES, BATCH, SEQ = 4, 8, 128


def _measured(model, graph, plan, feeds, order, mode) -> int:
    """In a forked process: the fake process group must not outlive it here."""
    return run_ranks(1, lambda rank, world: measure_stage_peak(model, graph, plan, feeds, order, mode).total,
                     connect=False)[0]


@pytest.mark.parametrize("schedule,device", [("1f1b", 0), ("1f1b", 1), ("gpipe", 0)])
def test_a_stage_holding_microbatches_in_flight_is_predicted_within_ten_percent(schedule: str, device: int) -> None:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        model = Transformer(4, 256, 4, 2, 512, 1024, SEQ)
        tokens = torch.zeros(BATCH // MICROBATCHES, SEQ, dtype=torch.long)
    graph = trace(model, (tokens, tokens.clone()))
    stage = cut(graph, find_repeated_layers(graph), (2, 2), 2)[device]
    order = device_orders(schedule, 2, MICROBATCHES)[device]
    held = peak_in_flight(order)
    mp = build_model_problem(stage.graph, "1", mode="training",
                             stage=StageOptions(MICROBATCHES, Fraction(held), (1e11, 1e-5)))
    choice = mp.complete([0] * len(mp.names))
    plan = make_plan(mp, choice)
    with mode:
        feeds = [[torch.zeros(n.tensor.shape, dtype=torch.long) if n.tensor.dtype == "int64"
                  else torch.zeros(n.tensor.shape, requires_grad=n.requires_grad)
                  for n in stage.graph if n.kind == NodeKind.INPUT] for _ in range(MICROBATCHES)]
    predicted, measured = mp.problem.peak_usage(choice), _measured(model, stage.graph, plan, feeds, order, mode)
    assert abs(predicted / measured - 1) <= TOLERANCE, (predicted, measured)
