"""Interleaved 1F1B with every stage's parameters kept gathered trains like one device.

The structure of the option the search picks for LLaMA-3.1-405B (benchmarks/pipeline.py) on a
4-layer torchtitan LLaMA over 2x2 gloo ranks: mesh axis 0 a two-device pipeline of four stages
(one layer each, two per device), two microbatches, every stage FSDP-sharded over axis 1 as
torchtitan shards it and kept gathered over the step. Five AdamW steps through autoshard.train's
loop must give the unsharded loop's losses; each device must gather each FSDP-stored parameter
once per step (not once per microbatch); the step-3 checkpoint resumes on two ranks without a
pipeline and gives the pipelined run's steps 4 and 5.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import torch

from autoshard.api import plan_model
from autoshard.cli.train import build_parser, training_steps
from autoshard.cli.train_pipeline import prepare_pipeline, train_pipeline
from autoshard.frontend.load import load_model
from autoshard.pipeline.options import PipelineOption
from autoshard.pipeline.plans import PipelinePlan
from autoshard.problem.baselines.torchtitan import torchtitan_choice
from autoshard.runtime.pipeline import PipelineRunner
from autoshard.sharding.mesh import parse_mesh

from .dist import run_ranks
from .test_train import TOLERANCE, _worst
from .test_train_context import MODEL
from .test_train_pipeline import _engine, run_whole

OPTION = PipelineOption("interleaved-1f1b", 2, 2, 2, (1, 1, 1, 1))


def _plan_file(tmp_path: Path) -> tuple[Path, PipelinePlan]:
    """torchtitan's recipe (FSDP over the stage axis, kept gathered) on OPTION, written to a file."""
    path = tmp_path / "titan_tiny.py"
    path.write_text(MODEL)
    loaded = load_model(str(path))
    mesh = parse_mesh("2x2")
    engine = _engine(loaded, mesh)
    searched = engine.evaluate(OPTION, bounded=True, recipe=torchtitan_choice)
    pipeline = PipelinePlan(mesh, 0, OPTION.schedule, OPTION.microbatches, OPTION.virtual, OPTION.counts,
                            searched.step, searched.bound, False, engine.group_plans(searched))
    plan_file = tmp_path / "interleaved.json"
    pipeline.save(plan_file)
    return path, pipeline


def _train(rank: int, world: int, argv: list[str], training) -> dict:
    """autoshard.train's pipelined loop on ``training`` (prepared before the ranks fork), and how
    many gathers each step's kept parameters ran."""
    gathers: list[int] = []
    real_step = PipelineRunner.step

    def counted(runner: PipelineRunner, inputs):
        for stage in runner.kept:
            stage.log.records.clear()
        loss = real_step(runner, inputs)
        gathers.append(sum(1 for stage in runner.kept for r in stage.log.records if r.kind == "all_gather"))
        gathered = sum(1 for stage in runner.kept for edge in stage.moved.values()
                       for s in edge.steps if s.kind == "all_gather")
        gathers.append(gathered)
        return loss

    PipelineRunner.step = counted
    losses = train_pipeline(build_parser().parse_args(argv), training, rank, io.StringIO())
    return {"losses": losses, "gathers": gathers}


def test_interleaved_kept_gathered_trains_like_one_device_and_resumes_without_a_pipeline(tmp_path: Path) -> None:
    path, pipeline = _plan_file(tmp_path)
    assert all(kept for _, _, kept in pipeline.groups)
    assert all(any(spec.used_axes for spec in plan.param_specs.values()) for _, plan, _ in pipeline.groups)  # FSDP
    folder = tmp_path / "ckpt"
    common = [str(path), "--steps", "5", "--lr", "3e-3", "--checkpoint", str(folder), "--checkpoint-every", "3"]
    argv = ["--plan", str(tmp_path / "interleaved.json"), *common]
    piped = run_ranks(4, _train, argv, prepare_pipeline(build_parser().parse_args(argv), 4), timeout=180)
    loaded = load_model(str(path))
    model = load_model(str(path)).model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    reference = [loss for _, loss, _ in training_steps(model, optimizer, loaded, 1, 5, 1.0)]
    assert all(result["losses"] == piped[0]["losses"] for result in piped)
    assert _worst(piped[0]["losses"], reference) <= TOLERANCE
    for result in piped:  # per step: the gathers run, then those the kept edges hold: one each
        ran, held = result["gathers"][0::2], result["gathers"][1::2]
        assert held[0] > 0 and ran == held
    shutil.rmtree(folder / "step_000005")
    whole = plan_model(loaded.model, loaded.example_inputs, "2", mode="training").plan
    whole.save(tmp_path / "whole.json")
    resumed = run_whole(2, ["--plan", str(tmp_path / "whole.json"), *common, "--resume"])
    assert _worst(resumed[0], piped[0]["losses"][3:]) <= TOLERANCE
