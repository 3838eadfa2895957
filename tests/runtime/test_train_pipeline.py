"""Pipeline x tensor parallelism trains like one device: a 4-layer torchtitan LLaMA on 2x2 gloo ranks.

Mesh axis 0 is a two-stage 1F1B pipeline (two layers and the embedding, two layers and the
head), two microbatches per step; each stage runs Megatron's tensor-parallel plan over axis 1.
Five AdamW steps must give the unsharded loop's losses, step 1 its gradients, and every rank
must send and receive exactly what its stage's plan charged: the point-to-point pieces and the
collectives, once per microbatch.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import torch

from autoshard.api import plan_model
from autoshard.cli.train import build_parser, prepare, train, training_steps
from autoshard.cli.pipeline import microbatch_inputs, write_plan
from autoshard.cli.train_pipeline import prepare_pipeline, train_pipeline
from autoshard.frontend.graph import NodeKind
from autoshard.frontend.load import load_model
from autoshard.frontend.trace import trace
from autoshard.pipeline.plans import PipelinePlan
from autoshard.pipeline.options import PipelineOption, options_for
from autoshard.pipeline.boundaries import boundary_of
from autoshard.pipeline.claim import search
from autoshard.pipeline.search import PipelineSearch
from autoshard.pipeline.stages import cut, stage_layouts
from autoshard.problem.baselines.megatron import megatron_choice
from autoshard.problem.readback import make_plan
from autoshard.runtime.checks import expected_collectives, same_collectives
from autoshard.runtime.placements import gather_full, local_of
from autoshard.runtime.pipeline import PipelineRunner, expected_transfers
from autoshard.sharding.layers import find_repeated_layers
from autoshard.sharding.mesh import parse_mesh

from .dist import run_ranks
from .test_train import TOLERANCE, _worst
from .test_train_context import MODEL

STEPS, MICROBATCHES, LR = 5, 2, 3e-3


def _engine(loaded, mesh) -> PipelineSearch:
    """The pipeline search of a loaded model file's training step on ``mesh`` (axis 0), generic device."""
    return PipelineSearch(lambda m: trace(loaded.model, microbatch_inputs(loaded.example_inputs, m)), mesh, 0,
                          dict(mode="training"), None)


def _stages(path: Path):
    path.write_text(MODEL)
    loaded = load_model(str(path))
    mesh = parse_mesh("2x2")
    engine = _engine(loaded, mesh)
    option = PipelineOption("1f1b", 2, MICROBATCHES, 1, (2, 2))
    stages = engine.stages(option)
    plans = []
    for d, stage in enumerate(stages):  # stage 1 receives in the layout stage 0 sends in
        sent = {stages[0].graph[n].tensor: spec for n, spec in stage_layouts(stages[0].graph, plans[0])[1].items()} \
            if d else {}
        mp = engine.stage_problem(option, stage, 2 - d, boundary=boundary_of(stage, sent))
        plans.append(make_plan(mp, megatron_choice(mp), model=f"stage{d}"))
    assert any(spec.used_axes for spec in plans[0].param_specs.values())  # tensor parallel, not replicated
    inputs = [n.name for n in engine.graph(MICROBATCHES) if n.kind == NodeKind.INPUT]
    return loaded, mesh, [s.graph for s in stages], plans, inputs


def _train(rank: int, world: int, loaded, mesh, graphs, plans, inputs) -> dict:
    runner = PipelineRunner(loaded.model, graphs, plans, mesh, 0, "1f1b", MICROBATCHES, inputs)
    params = [p for p in runner.module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR)
    losses, grads = [], {}
    for step in range(1, STEPS + 1):
        optimizer.zero_grad(set_to_none=True)
        runner.reset_log()
        loss = runner.step(loaded.step_batch(step))
        if step == 1:
            grads = {name: gather_full(local_of(p.grad), runner.module.param_specs[name], runner.groups).numpy()
                     for name, p in runner.module.named_parameters()}  # numpy: tensors do not outlive a fork
            transfers, collectives = runner.transfers(), runner.module.collectives()
        optimizer.step()
        if loss is not None:
            spec = runner.loss_spec
            losses.append(float(loss) if spec.is_replicated else float(gather_full(loss, spec, runner.groups)))
    return {"device": runner.device, "losses": losses, "grads": grads, "transfers": transfers,
            "collectives": collectives}


def _reference(loaded) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = loaded.model
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    losses, grads = [], {}
    for step in range(1, STEPS + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = model(*loaded.step_batch(step))
        loss.backward()
        if step == 1:
            grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, grads


def test_pipeline_with_tensor_parallel_follows_single_device_training(tmp_path: Path) -> None:
    loaded, mesh, graphs, plans, inputs = _stages(tmp_path / "titan_tiny.py")
    results = run_ranks(4, _train, loaded, mesh, graphs, plans, inputs, timeout=180)
    losses, grads = _reference(load_model(str(tmp_path / "titan_tiny.py")))
    seen = set()
    for result in results:
        d = result["device"]
        if d == 1:
            assert _worst(result["losses"], losses) <= TOLERANCE
        for name, grad in result["grads"].items():
            seen.add(name)
            assert torch.allclose(torch.from_numpy(grad), grads[name], rtol=1e-4, atol=1e-6), name
        assert result["transfers"] == expected_transfers(graphs[d], plans[d], MICROBATCHES, d == 0, d == 1)
        assert same_collectives(result["collectives"], expected_collectives(plans[d]) * MICROBATCHES)
    assert seen == set(grads)


EIGHT_LAYERS = MODEL.replace("Transformer(4, 32, 4, 2, 64, VOCAB, SEQ)", "Transformer(8, 32, 4, 2, 64, VOCAB, SEQ)")


def _train_file(rank: int, world: int, loaded, mesh, path: str, graph, inputs) -> list[float]:
    """Three steps of the pipeline the plan file at ``path`` describes, its stages cut from
    ``graph`` (the model traced at the file's microbatch size, once, before the ranks fork)."""
    pipeline = PipelinePlan.load(path)
    stages = cut(graph, find_repeated_layers(graph), pipeline.counts, mesh.shape[pipeline.axis])
    runner = PipelineRunner(loaded.model, [s.graph for s in stages], pipeline.device_plans(stages), mesh,
                            pipeline.axis, pipeline.schedule, pipeline.microbatches, inputs)
    optimizer = torch.optim.AdamW([p for p in runner.module.parameters() if p.requires_grad], lr=LR)
    losses = []
    for step in range(1, 4):
        optimizer.zero_grad(set_to_none=True)
        loss = runner.step(loaded.step_batch(step))
        optimizer.step()
        if loss is not None:
            losses.append(float(loss) if runner.loss_spec.is_replicated
                          else float(gather_full(loss, runner.loss_spec, runner.groups)))
    return losses


def test_a_searched_four_stage_pipeline_runs_from_its_plan_file(tmp_path: Path) -> None:
    """The search's plan for 8 layers on 4 stages (the middle devices share one plan, carried onto
    each device's own layers), saved and loaded, trains 3 steps like the unsharded model."""
    path = tmp_path / "titan_eight.py"
    path.write_text(EIGHT_LAYERS)
    loaded = load_model(str(path))
    mesh = parse_mesh("4x1")
    engine = _engine(loaded, mesh)
    result = search(engine, [o for o in options_for(8, 4, [4], ("1f1b",)) if o.counts == (2, 2, 2, 2)])
    best = result.best
    assert any(len(devices) > 1 for devices in best.groups.values())  # a shared plan is relabelled
    plan_file = tmp_path / "pipeline.json"
    write_plan(result, engine, str(plan_file))
    graph = trace(loaded.model, microbatch_inputs(loaded.example_inputs, PipelinePlan.load(plan_file).microbatches))
    inputs = [n.name for n in graph if n.kind == NodeKind.INPUT]
    results = run_ranks(4, _train_file, loaded, mesh, str(plan_file), graph, inputs, timeout=180)
    model = load_model(str(path)).model
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    reference = []
    for step in range(1, 4):
        optimizer.zero_grad(set_to_none=True)
        loss = model(*loaded.step_batch(step))
        loss.backward()
        optimizer.step()
        reference.append(float(loss.detach()))
    assert [r for r in results if r] == [results[-1]] and _worst(results[-1], reference) <= TOLERANCE


def run_pipelined(world: int, argv: list[str]) -> list[list[float]]:
    """autoshard.train's pipelined loop under ``argv`` on ``world`` forked ranks, each rank's losses:
    the plan and model are loaded, traced and checked once (``prepare_pipeline`` computes nothing
    per rank), then each rank trains."""
    return run_ranks(world, _train_pipelined, argv, prepare_pipeline(build_parser().parse_args(argv), world),
                     timeout=180)


def _train_pipelined(rank: int, world: int, argv: list[str], training) -> list[float]:
    return train_pipeline(build_parser().parse_args(argv), training, rank, io.StringIO())


def run_whole(world: int, argv: list[str]) -> list[list[float]]:
    """autoshard.train's loop under ``argv`` (a plan without a pipeline) on ``world`` forked ranks,
    prepared once as ``run_pipelined`` prepares."""
    return run_ranks(world, _train_whole, argv, prepare(build_parser().parse_args(argv), world, 0), timeout=180)


def _train_whole(rank: int, world: int, argv: list[str], training) -> list[float]:
    return train(build_parser().parse_args(argv), training, rank, io.StringIO())


def test_autoshard_train_runs_a_pipelined_plan_and_its_checkpoint_resumes_without_one(tmp_path: Path) -> None:
    """autoshard.train's loop on the searched PP 2 x TP 2 plan (clipping over both stages): the
    unsharded loop's losses; its step-2 checkpoint resumes on 2 ranks under a plan without a
    pipeline, and on 4 ranks under a 4-stage pipeline, each giving the pipelined run's steps 3 and 4."""
    path = tmp_path / "titan_tiny.py"
    path.write_text(MODEL)
    loaded = load_model(str(path))
    mesh = parse_mesh("2x2")
    engine = _engine(loaded, mesh)
    result = search(engine, options_for(4, 2, [2], ("1f1b",)))
    plan_file = tmp_path / "pipeline.json"
    write_plan(result, engine, str(plan_file))
    folder = tmp_path / "ckpt"
    common = [str(path), "--steps", "4", "--lr", "3e-3", "--checkpoint", str(folder), "--checkpoint-every", "2"]
    piped = run_pipelined(4, ["--plan", str(plan_file), *common])
    assert all(losses == piped[0] for losses in piped)
    model = load_model(str(path)).model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    reference = [loss for _, loss, _ in training_steps(model, optimizer, loaded, 1, 4, 1.0)]
    assert _worst(piped[0], reference) <= TOLERANCE
    shutil.rmtree(folder / "step_000004")
    whole = plan_model(loaded.model, loaded.example_inputs, "2", mode="training").plan
    whole.save(tmp_path / "whole.json")
    resumed = run_whole(2, ["--plan", str(tmp_path / "whole.json"), *common, "--resume"])
    assert _worst(resumed[0], piped[0][2:]) <= TOLERANCE
    shutil.rmtree(folder / "step_000004")  # the resumed run's
    deeper = parse_mesh("4x1")  # and under a pipeline of another degree, on another mesh
    engine4 = _engine(loaded, deeper)
    result4 = search(engine4, options_for(4, 4, [4], ("1f1b",)))
    four = tmp_path / "pipeline4.json"
    write_plan(result4, engine4, str(four))
    again = run_pipelined(4, ["--plan", str(four), *common, "--resume"])
    assert _worst(again[0], piped[0][2:]) <= TOLERANCE
