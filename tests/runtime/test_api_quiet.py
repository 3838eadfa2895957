"""What a Python API user sees: ``dir(autoshard)`` lists the API, and a parallelized model trained
with PyTorch's own tools prints no DTensor warnings about the mesh autoshard built."""

from __future__ import annotations

import logging

import torch

import autoshard
from tests.runtime.dist import run_ranks


def test_dir_lists_the_lazily_loaded_api() -> None:
    names = dir(autoshard)
    for name in ("plan_model", "parallelize", "Plan", "AutoshardError", "create_schedule"):
        assert name in names


def _model_and_inputs() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    return model, (torch.randn(8, 16),)


def _clip_and_step(rank: int, world: int, plan: autoshard.Plan) -> list[str]:
    """One step of the README's API recipe; the warnings torch's DTensor logged meanwhile."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("torch.distributed.tensor")
    logger.addHandler(Collect(logging.WARNING))
    model, inputs = _model_and_inputs()
    sharded = autoshard.parallelize(model, plan, example_inputs=inputs)
    optimizer = torch.optim.AdamW(sharded.parameters(), lr=1e-3)
    sharded(*inputs).sum().backward()
    torch.nn.utils.clip_grad_norm_(sharded.parameters(), 1.0)  # a norm partial over both mesh axes
    optimizer.step()
    return records


def test_clip_grad_norm_on_a_2d_mesh_logs_no_dtensor_warning() -> None:
    model, inputs = _model_and_inputs()
    plan = autoshard.plan_model(model, inputs, "2x2", mode="training", pins={"0.weight": "S01R"}).plan
    assert run_ranks(4, _clip_and_step, plan, timeout=120) == [[]] * 4
