"""``autoshard.train`` with a pipelined plan (``autoshard.solve --pipeline --out``).

Every rank re-traces the model at the plan's microbatch size, cuts it as the plan says, carries
its group's stage plan onto its own layers (``PipelinePlan.device_plans``) and checks it, then
trains with :class:`~autoshard.runtime.pipeline.PipelineRunner`: each step runs the schedule over
``batch(step)``'s microbatches, clips the gradients' 2-norm over every stage (each stage's norm
squared, summed over the pipeline axis) and takes an AdamW step. Rank 0 reports the loss, which
the last stage sends it. Checkpoints hold every stage's parameters and AdamW state under the
model's own names, so a run resumes under another pipeline degree, another mesh or no pipeline
at all (each rank reads the tensors of its stage). Every schedule the search offers runs: an
interleaved device's plan is split over its stages (``pipeline/chunks.py``), and devices the plan
keeps gathered gather their parameters once per step (``runtime/kept.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch
import torch.distributed as dist

from autoshard.cli.pipeline import microbatch_inputs
from autoshard.cli.training import Reporter, checkpoint_if_due, make_optimizer, resume, whole_loss
from autoshard.errors import AutoshardError
from autoshard.frontend.graph import NodeKind, OpGraph
from autoshard.frontend.load import LoadedModel, load_model
from autoshard.frontend.trace import trace
from autoshard.pipeline.chunks import run_stages
from autoshard.pipeline.plans import PipelinePlan
from autoshard.pipeline.stages import cut
from autoshard.problem.plan import Plan
from autoshard.runtime.checks import check_backend, check_layouts, check_model
from autoshard.runtime.pipeline import PipelineRunner
from autoshard.sharding.layers import find_repeated_layers


@dataclass
class PipelineTraining:
    """What every rank checked before training a pipelined plan."""

    pipeline: PipelinePlan
    loaded: LoadedModel
    graphs: list[OpGraph]
    plans: list[Plan]
    inputs: list[str]
    kept: list[bool]


def is_pipeline_file(path: str) -> bool:
    """Whether the plan file holds a pipelined plan (unreadable files are left to the plan loader)."""
    try:
        return "pipeline" in json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError):
        return False


def prepare_pipeline(args: argparse.Namespace, world_size: int) -> PipelineTraining:
    """Load and check the pipelined plan and the model; raises AutoshardError, computes nothing."""
    pipeline = PipelinePlan.load(args.plan)
    if pipeline.mesh.size != world_size:
        raise AutoshardError(f"{args.plan} is for mesh {pipeline.mesh.label} ({pipeline.mesh.size} ranks) but "
                             f"{world_size} were launched: launch {pipeline.mesh.size}")
    if args.backend == "nccl":
        raise AutoshardError("pipelined plans run on gloo (CPU) here: use --backend gloo")
    loaded = load_model(args.model).for_training()
    graphs, plans, inputs = pipeline_stages(loaded, pipeline, args.model, args.plan)
    for graph, plan in zip(graphs, plans):
        check_backend(plan, args.backend)
    devices = pipeline.mesh.shape[pipeline.axis]
    return PipelineTraining(pipeline, loaded, graphs, plans, inputs, [pipeline.kept(d) for d in range(devices)])


def pipeline_stages(loaded: LoadedModel, pipeline: PipelinePlan, model: str,
                    plan: str) -> tuple[list[OpGraph], list[Plan], list[str]]:
    """Every stage's graph and checked plan (in stage order), traced at the plan's microbatch
    size, and the model's input names; raises AutoshardError naming what does not match."""
    if len(pipeline.counts) != pipeline.virtual * pipeline.mesh.shape[pipeline.axis]:
        raise AutoshardError(f"{plan} has {len(pipeline.counts)} stages, not {pipeline.virtual} per device on "
                             f"{pipeline.mesh.shape[pipeline.axis]} devices: re-create it with autoshard.solve --out")
    graph = trace(loaded.model, microbatch_inputs(loaded.example_inputs, pipeline.microbatches))
    repeated = find_repeated_layers(graph)
    if repeated is None:
        raise AutoshardError(f"{model} has no repeated layers to cut: {plan} is for another model")
    devices = cut(graph, repeated, pipeline.counts, pipeline.mesh.shape[pipeline.axis])
    graphs, plans = run_stages(graph, repeated, pipeline.counts, devices, pipeline.device_plans(devices))
    plans = [check_model(p, g) for g, p in zip(graphs, plans)]
    for g, p in zip(graphs, plans):
        check_layouts(p, g)
    return graphs, plans, [n.name for n in graph if n.kind == NodeKind.INPUT]


def train_pipeline(args: argparse.Namespace, training: PipelineTraining, rank: int,
                   out: TextIO = sys.stdout) -> list[float]:
    """The distributed part: build the stage, resume, train, checkpoint (process group initialized).
    Returns the losses of the steps this call trained (on every rank)."""
    pipeline, loaded = training.pipeline, training.loaded
    runner = PipelineRunner(loaded.model, training.graphs, training.plans, pipeline.mesh, pipeline.axis,
                            pipeline.schedule, pipeline.microbatches, training.inputs, training.kept)
    optimizer = make_optimizer(runner.module, args)
    done, was, resumed = resume(args, runner.module, optimizer, part=True)
    last = runner.first_rank_of(pipeline.mesh.shape[pipeline.axis] - 1)
    reporter = Reporter(out, args.steps, done + 1, out.isatty()) if rank == 0 else None
    losses = []
    with reporter if reporter is not None else nullcontext():
        if reporter is not None:
            reporter.note(f"autoshard.train: {loaded.name} pipelined ({pipeline.schedule}, "
                          f"{pipeline.microbatches} microbatches) on mesh {pipeline.mesh.label} over axis "
                          f"{pipeline.axis}, steps {done + 1}-{args.steps}, AdamW lr {args.lr:g}{was}"
                          + (f", resumed from {resumed}" if resumed is not None else ""))
        for step in range(done + 1, args.steps + 1):
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = runner.step(loaded.step_batch(step))
            if args.max_grad_norm > 0:
                clip_over_stages(runner, args.max_grad_norm)
            optimizer.step()
            value = torch.zeros((), dtype=torch.float64)
            if loss is not None:
                value = whole_loss(runner.loss_spec, runner.groups)(loss).to(torch.float64)
            dist.broadcast(value, src=last)
            losses.append(float(value))
            if reporter is not None:
                reporter.step(step, losses[-1], time.perf_counter() - start)
            checkpoint_if_due(args, step, runner.module, optimizer, reporter)
    return losses


def clip_over_stages(runner: PipelineRunner, max_norm: float) -> None:
    """Scale every stage's gradients so that the 2-norm over the whole model is at most ``max_norm``."""
    params = [p for p in runner.module.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else torch.zeros(())
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    squared = norm.detach().to(torch.float64) ** 2
    dist.all_reduce(squared, group=runner.pipe_group)
    if params:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, squared.sqrt().to(torch.float32))
