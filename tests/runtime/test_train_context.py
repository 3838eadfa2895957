"""Context parallelism x FSDP trains like one device: a 4-layer torchtitan LLaMA on 2x2 gloo ranks.

Mesh axis 0 splits the batch and stores every parameter split over it (FSDP, gathered for use);
axis 1 splits the sequence, every causal attention's query rows included (the keys and values
gathered). Five AdamW steps must give the unsharded loop's losses within 1e-4 relative.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from autoshard.api import build_model_problem
from autoshard.cli.train import Training, quiet_dtensor_hints, train
from autoshard.frontend.load import load_model
from autoshard.frontend.trace import trace
from autoshard.problem.baselines.torchtitan import fsdp_storage
from autoshard.problem.readback import make_plan

from .dist import run_ranks
from .plans import context_parallel_choice
from .test_train import TOLERANCE, _args, _worst, make_optimizer, training_steps

STEPS = 5
MODEL = """import torch

from benchmarks.titan_llama import Transformer

SEQ, VOCAB = 16, 64
torch.manual_seed(0)
model = Transformer(4, 32, 4, 2, 64, VOCAB, SEQ)


def batch(step):
    starts = torch.randint(0, VOCAB, (4, 1), generator=torch.Generator().manual_seed(step))
    tokens = (starts + torch.arange(SEQ + 1)) % VOCAB
    return tokens[:, :-1], tokens[:, 1:]


example_inputs = batch(0)
"""


def _training(path: Path) -> Training:
    path.write_text(MODEL)
    loaded = load_model(str(path))
    graph = trace(loaded.model, loaded.example_inputs)
    mp = build_model_problem(graph, "2x2", mode="training")
    choice = fsdp_storage(mp, context_parallel_choice(mp), 0)
    plan = make_plan(mp, choice, model=path.stem)
    rows = [name for name, place in plan.nodes.items() if graph[name].attrs.get("is_causal")]
    assert len(rows) == 4 and all(plan.nodes[name].in_specs[0].dims[-2] == (1,) for name in rows)
    stored = [spec for name, spec in plan.param_specs.items() if spec.dims and 0 in spec.used_axes]
    assert len(stored) > 20  # FSDP: every matrix stored split over axis 0
    return Training(plan, loaded, graph, torch.device("cpu"))


def _train(rank: int, world: int, training: Training) -> list[float]:
    quiet_dtensor_hints()
    return train(_args("--steps", str(STEPS)), training, rank, io.StringIO())


def test_context_parallel_with_fsdp_follows_single_device_training(tmp_path: Path) -> None:
    training = _training(tmp_path / "titan_tiny.py")
    model = load_model(str(tmp_path / "titan_tiny.py")).model
    optimizer = make_optimizer(model, _args("--steps", str(STEPS)))
    reference = [loss for _, loss, _ in training_steps(model, optimizer, training.loaded, 1, STEPS, 1.0)]
    for losses in run_ranks(4, _train, training, timeout=180):
        assert _worst(losses, reference) <= TOLERANCE
