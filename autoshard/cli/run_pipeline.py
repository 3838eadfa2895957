"""``autoshard.run`` with a pipelined plan: one training step of the schedule, checked against the unsharded model.

Every rank loads the pipelined plan and the model, traces and cuts it as the plan says and checks
each stage's plan (``cli/train_pipeline.pipeline_stages``); rank 0's parameters and example batch
are broadcast to every rank (a model file need not seed its generator). One step of the plan's
schedule then runs with :class:`~autoshard.runtime.pipeline.PipelineRunner` (interleaved and
kept-gathered devices included): the loss is the mean of the microbatches' losses, as in
training. The unsharded model runs the same microbatches with the same mean; each rank gathers
its stages' parameter gradients whole and compares them (and, on the last stage, the loss) in
float64 with ``relative_errors``, and checks its point-to-point messages against what its stages'
plans charge (``expected_transfers``). Rank 0 prints every row and the verdict.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from autoshard.cli.train_pipeline import pipeline_stages
from autoshard.errors import AutoshardError
from autoshard.frontend.graph import OpGraph
from autoshard.frontend.load import load_model
from autoshard.pipeline.plans import PipelinePlan
from autoshard.problem.plan import Plan
from autoshard.runtime.checks import relative_errors
from autoshard.runtime.groups import broadcast_from_first
from autoshard.runtime.pipeline import PipelineRunner, expected_transfers
from autoshard.runtime.placements import gather_full, local_of


@dataclass
class PipelinedRun:
    """What every rank checked before computing: the plan, the model (in eval mode), each stage's
    graph and plan in stage order, and the model's input names."""

    pipeline: PipelinePlan
    model: torch.nn.Module
    example_inputs: tuple[torch.Tensor, ...]
    graphs: list[OpGraph]
    plans: list[Plan]
    inputs: list[str]


def prepare_pipelined(args: argparse.Namespace, world_size: int) -> PipelinedRun:
    """Load and check the pipelined plan and the model; raises AutoshardError, computes nothing."""
    pipeline = PipelinePlan.load(args.plan)
    if pipeline.mesh.size != world_size:
        raise AutoshardError(f"{args.plan} is for mesh {pipeline.mesh.label} ({pipeline.mesh.size} ranks) but "
                             f"{world_size} were launched: launch {pipeline.mesh.size}")
    if args.backend != "gloo":
        raise AutoshardError("pipelined plans run on gloo (CPU) here: use --backend gloo")
    loaded = load_model(args.model).for_training()
    loaded.model.eval()
    graphs, plans, inputs = pipeline_stages(loaded, pipeline, args.model, args.plan)
    return PipelinedRun(pipeline, loaded.model, tuple(loaded.example_inputs), graphs, plans, inputs)


def check_pipelined(run: PipelinedRun, args: argparse.Namespace, rank: int) -> bool:
    """Run one pipelined step and compare it with the unsharded model (process group initialized);
    every rank returns the verdict."""
    pipeline, model = run.pipeline, run.model
    world_size = dist.get_world_size()
    with torch.no_grad():
        for value in (*model.parameters(), *model.buffers()):
            value.copy_(broadcast_from_first([value])[0])
    batch = broadcast_from_first(run.example_inputs)
    devices = pipeline.mesh.shape[pipeline.axis]
    runner = PipelineRunner(model, run.graphs, run.plans, pipeline.mesh, pipeline.axis, pipeline.schedule,
                            pipeline.microbatches, run.inputs, [pipeline.kept(d) for d in range(devices)])
    loss = runner.step(batch)
    got = {f"grad {name}": gather_full(local_of(p.grad), runner.module.param_specs[name], runner.groups)
           for name, p in runner.module.named_parameters() if p.requires_grad and p.grad is not None}
    want_loss, want_grads = _reference(model, batch, pipeline.microbatches)
    want = {f"grad {name}": want_grads[name] for name, p in runner.module.named_parameters() if p.requires_grad}
    if loss is not None:
        whole = loss if runner.loss_spec.is_replicated else gather_full(loss, runner.loss_spec, runner.groups)
        got["loss"], want["loss"] = whole.reshape(()), want_loss
    planned = sorted((t for s in runner.stage_ids for t in expected_transfers(
        runner.graphs[s], runner.plans[s], pipeline.microbatches, s == 0, s == runner.last_stage)),
        key=lambda t: (t.direction, t.name, t.phase, t.nbytes))
    mine = {"device": runner.device, "rows": relative_errors(got, want), "transfers": runner.transfers() == planned}
    every: list[Any] = [None] * world_size
    dist.all_gather_object(every, mine)
    return _report(args, pipeline, every) if rank == 0 else _verdict(args, every)


def _reference(model: torch.nn.Module, batch: tuple[torch.Tensor, ...], microbatches: int
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The unsharded model's mean microbatch loss and its parameters' gradients."""
    model.zero_grad(set_to_none=True)
    total = None
    for k in range(microbatches):
        piece = tuple(t.chunk(microbatches)[k] for t in batch)
        loss = model(*piece) / microbatches
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    grads = {name: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
             for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return total, grads


def _verdict(args: argparse.Namespace, every: list[dict[str, Any]]) -> bool:
    """True when every rank's rows are within the tolerance and its messages are its plans'."""
    return all(r["transfers"] and all(rel <= args.tolerance for _, rel in r["rows"].values()) for r in every)


def _report(args: argparse.Namespace, pipeline: PipelinePlan, every: list[dict[str, Any]]) -> bool:
    """Rank 0: each pipeline device's worst rows and the verdict."""
    kept = ", ".join(str(d) for d in range(pipeline.mesh.shape[pipeline.axis]) if pipeline.kept(d)) or "none"
    print(f"autoshard.run: pipelined plan ({pipeline.schedule}, {len(pipeline.counts)} stages on "
          f"{pipeline.mesh.shape[pipeline.axis]} devices, {pipeline.microbatches} microbatches, parameters kept "
          f"gathered on devices {kept}) on mesh {pipeline.mesh.label}, one step against the unsharded model")
    worst = 0.0
    for rank, result in enumerate(every):
        rows = result["rows"]
        label = max(rows, key=lambda k: rows[k][1])
        worst = max(worst, rows[label][1])
        where = "equal to" if result["transfers"] else "DIFFERENT from"
        print(f"  rank {rank} (pipeline device {result['device']}): {len(rows)} tensors, largest relative error "
              f"{rows[label][1]:.3g} ({label}); point-to-point messages {where} its plans'")
    ok = _verdict(args, every)
    print(f"  largest relative error {worst:.3g} (tolerance {args.tolerance:g}): {'ok' if ok else 'FAILED'}")
    return ok
