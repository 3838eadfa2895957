"""Split causal attention rows (context parallelism): the busiest device's work, and memory against MemTracker."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autoshard.api import build_model_problem
from autoshard.cost.compute import causal_split_load
from autoshard.frontend.trace import trace
from autoshard.problem.readback import make_plan
from autoshard.runtime.measure import measure_peak
from tests.cost.test_memory import TOLERANCE, WithLoss
from tests.runtime.dist import run_ranks
from tests.runtime.plans import CausalAttention, context_parallel_choice


@pytest.mark.parametrize("parts", [1, 2, 4, 8])
def test_the_last_block_of_causal_rows_does_two_minus_one_over_parts_of_a_share(parts: int) -> None:
    rows = 4096
    work = [sum(i + 1 for i in range(c * rows // parts, (c + 1) * rows // parts)) for c in range(parts)]
    assert max(work) / (sum(work) / parts) == pytest.approx(causal_split_load(parts), rel=1e-3)


def test_split_rows_are_charged_their_imbalance_and_their_gathered_key_gradients() -> None:
    model = CausalAttention(64, 4)
    graph = trace(model, (torch.randn(2, 2048, 64),))  # attention bound by its flops, not its bytes
    mp = build_model_problem(graph, "4", mode="training")
    attention = mp.candidates[next(n for n in mp.names if mp.candidates[n].node.attrs.get("is_causal"))]
    gathered = next(item for item in attention.items if item.what == "gathered gradients")
    keys = 2 * 2048 * 64 * 4  # the keys (or values) of both sequences in fp32
    for k, s in enumerate(attention.strategies):
        split = s.in_specs[0].dims[-2]
        assert gathered.usage[k] == (2 * keys // s.in_specs[1].shard_factor(1, (4,)) if split else 0)
    rows = next(k for k, s in enumerate(attention.strategies) if s.in_specs[0].dims[2] and len(s.assignment) == 1)
    heads = next(k for k, s in enumerate(attention.strategies) if s.in_specs[0].dims[1] and len(s.assignment) == 1)
    assert attention.costs[rows] / attention.costs[heads] == pytest.approx(causal_split_load(4), rel=1e-6)


@pytest.mark.parametrize("mesh", ["2", "4"])
def test_a_context_parallel_step_is_predicted_within_the_tolerance(mesh: str) -> None:
    """Split rows: the gathered keys and values are their edges' reshard copies, kept for backward,
    their gradients held in attention's backward; the producers' pieces die after their reads."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        model, inputs = WithLoss(CausalAttention(64, 4)), (torch.randn(4, 512, 64),)
    graph = trace(model, inputs)
    mp = build_model_problem(graph, mesh, mode="training")
    choice = context_parallel_choice(mp)
    plan = make_plan(mp, choice)
    assert any(place.in_specs[0].dims[-2] for name, place in plan.nodes.items() if graph[name].attrs.get("is_causal"))
    # the last device holds the last rows, which read every key: the busiest, as priced (rank 0
    # reads only the keys up to its own rows)
    last = plan.mesh.size - 1
    measured = run_ranks(1, lambda rank, world: measure_peak(model, inputs, plan, graph, mode, rank=last).total,
                         connect=False)[0]
    predicted = mp.problem.peak_usage(choice)
    assert abs(predicted / measured - 1) <= TOLERANCE, (predicted, measured)
