"""``python -m autoshard.run model.py --plan plan.json`` under torchrun: run a plan once and check it.

    python -m autoshard.solve examples/mlp.py --mesh 2 --mode training --out plan.json
    torchrun --nproc_per_node=2 -m autoshard.run examples/mlp.py --plan plan.json

Every rank loads the plan and the model (a model file need not seed its random generator: rank
0's parameters, example inputs and targets are broadcast to the others before sharding, as DDP
does for parameters) and refuses, before any computation, with one line on stderr (from rank 0)
and exit status 2: a world size other than the plan mesh's, a plan needing a collective the
backend cannot run, a plan made for another model, a plan whose recorded layouts and reshard
steps do not fit together on this model (a hand-edited file). Then one forward runs with
every planned collective, and for a training plan one backward of ``loss = sum(output * R)``
(R a fixed random tensor, the same on every rank), computed on the local pieces. Rank 0 gathers
the outputs and parameter gradients, compares them with the unsharded model in float64 and
prints the largest absolute and relative errors, then every rank's parameter bytes and the
bytes each kind of collective moved. Exit status 1 when a relative error exceeds the tolerance,
the executed collectives differ from the plan's list, or ranks gathered different values. A
plan that shards nothing says so: its check only shows that every replica runs the model.

A pipelined plan (``autoshard.solve --pipeline --out``) runs one step of its schedule instead,
checked against the unsharded model's microbatches (``cli/run_pipeline.py``).

The model is re-traced with the frontend the plan records. A refusal is our only output on
stderr (no traceback); torchrun then prints its own ChildFailedError report for the non-zero
exit, which a worker cannot suppress, and shows our line as that report's ``traceback :``
(written to the error file torchrun names in ``TORCHELASTIC_ERROR_FILE``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

from autoshard.errors import AutoshardError
from autoshard.frontend.load import load_model
from autoshard.frontend.trace import trace
from autoshard.frontend.graph import OpGraph
from autoshard.problem.plan import Plan
from autoshard.cli.process import refuse
from autoshard.cli.run_pipeline import PipelinedRun, check_pipelined, prepare_pipelined
from autoshard.cli.train_pipeline import is_pipeline_file
from autoshard.runtime.checks import (BACKEND_COLLECTIVES, check_backend, check_layouts, check_model,
                                      check_world, expected_collectives, relative_errors, same_collectives)
from autoshard.runtime.executor import ParallelModule, parallelize
from autoshard.runtime.placements import distribute, gather_full, local_of
from autoshard.runtime.collectives import FORWARD
from autoshard.runtime.groups import MeshGroups, broadcast_from_first
from autoshard.cost.units import format_bytes

LOSS_SEED = 0


def build_parser() -> argparse.ArgumentParser:
    """Every flag of the command, documented."""
    p = argparse.ArgumentParser(
        prog="torchrun --nproc_per_node=N -m autoshard.run",
        description="Run one forward and backward of a sharding plan on torch.distributed and check outputs, "
                    "gradients and collectives against the unsharded model.",
    )
    p.add_argument("model", help="model file (defines `model` and `example_inputs`, or `build()` returning both)")
    p.add_argument("--plan", required=True, help="plan file written by python -m autoshard.solve --out")
    p.add_argument("--backend", choices=sorted(BACKEND_COLLECTIVES), default="gloo",
                   help="torch.distributed backend: gloo (CPU, default), nccl (one GPU per rank), mpi")
    p.add_argument("--tolerance", type=float, default=1e-5,
                   help="largest relative error accepted, per tensor max |got - want| / (|want| + s), s the larger "
                        "of the tensor's largest entry and 1e-3 of the largest output (or gradient): "
                        "torch.testing.assert_close with rtol = tolerance, atol = tolerance * s; default 1e-5")
    p.add_argument("--collectives", action="store_true", help="also list every collective rank 0 executed")
    return p


@dataclass
class Prepared:
    """What every rank checked before computing: the plan, the model, its inputs and its graph."""

    plan: Plan
    model: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    graph: OpGraph
    device: torch.device


def launch_env(environ: Mapping[str, str], command: str = "autoshard.run model.py --plan plan.json"
               ) -> tuple[int, int, int]:
    """(rank, world size, local rank) from the variables torchrun sets; ``command`` is the module to launch
    with its required arguments, for the hint."""
    try:
        return int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ.get("LOCAL_RANK", environ["RANK"]))
    except (KeyError, ValueError):
        raise AutoshardError(f"RANK and WORLD_SIZE are not set: launch with torchrun --nproc_per_node=N "
                             f"-m {command}") from None


def prepare(args: argparse.Namespace, world_size: int, local_rank: int,
            collectives: Mapping[str, frozenset[str]] = BACKEND_COLLECTIVES) -> Prepared:
    """Load and check plan and model, cheapest checks first; raises AutoshardError, computes nothing."""
    plan = Plan.load(args.plan)
    check_world(plan, world_size)
    check_backend(plan, args.backend, collectives)
    device = torch.device("cuda", local_rank) if args.backend == "nccl" else torch.device("cpu")
    loaded = load_model(args.model)
    if plan.mode == "training":  # the graph a training plan was made for includes the file's loss
        loaded = loaded.for_training()
    model = loaded.model.to(device).eval()
    inputs = tuple(t.to(device) for t in loaded.example_inputs)
    graph = trace(model, inputs, plan.frontend or "auto")
    plan = check_model(plan, graph)
    check_layouts(plan, graph)
    return Prepared(plan, model, inputs, graph, device)


def _loss_weights(outputs: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor | None]:
    """The fixed random R of each float output (None for others), identical on every rank."""
    gen = torch.Generator().manual_seed(LOSS_SEED)
    return [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(device) if o.is_floating_point() else None
            for o in outputs]


def _reference(prep: Prepared, training: bool) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Outputs and gradients of the unsharded model's trainable parameters under the same loss (a frozen
    parameter has none to compare)."""
    with torch.set_grad_enabled(training):
        outputs = pytree.tree_leaves(prep.model(*prep.inputs))
    if training:
        weights = _loss_weights(outputs, prep.device)
        sum((o * w).sum() for o, w in zip(outputs, weights) if w is not None).backward()
    grads = {name: p.grad if p.grad is not None else torch.zeros_like(p)
             for name, p in prep.model.named_parameters() if p.requires_grad}
    return outputs, grads


def _sharded_step(prep: Prepared, parallel: ParallelModule, groups: MeshGroups, training: bool
                  ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """One forward (and backward) on local pieces; returns whole outputs and the trainable parameters'
    gradients (collective)."""
    local = parallel(*prep.inputs)
    local = list(local) if isinstance(local, tuple) else [local]
    specs = parallel.output_specs
    outputs = [gather_full(o.detach(), s, groups) for o, s in zip(local, specs)]
    grads: dict[str, torch.Tensor] = {}
    if training:
        weights = _loss_weights(outputs, prep.device)
        loss = sum((o * distribute(w, s, groups)).sum() for o, w, s in zip(local, weights, specs) if w is not None)
        loss.backward()
        for name, p in ((n, p) for n, p in parallel.named_parameters() if p.requires_grad):
            grad = local_of(p.grad) if p.grad is not None else torch.zeros_like(local_of(p))
            grads[name] = gather_full(grad, parallel.param_specs[name], groups)
    return outputs, grads


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def _summary(parallel: ParallelModule, model: torch.nn.Module, plan: Plan,
             gathered: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """This rank's parameter bytes, bytes sent per collective kind, whether its log is the plan's, and
    digests of the whole tensors it gathered (every rank must gather the same)."""
    executed = parallel.collectives()
    calls: Counter[str] = Counter(c.kind for c in executed)
    sent: Counter[str] = Counter()
    for c in executed:
        sent[c.kind] += c.sent_bytes
    full = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    return {"param_bytes": parallel.parameter_bytes(), "full_bytes": full, "calls": dict(calls), "sent": dict(sent),
            "matches_plan": same_collectives(executed, expected_collectives(plan)), "count": len(executed),
            "collectives": executed, "digests": {label: _digest(t) for label, t in gathered.items()}}


def _check_numerics(prep: Prepared, outputs: list[torch.Tensor], grads: dict[str, torch.Tensor],
                    tolerance: float) -> bool:
    """Rank 0: print each output's and gradient's error against the unsharded model; True if all fit."""
    ref_outputs, ref_grads = _reference(prep, prep.plan.mode == "training")
    rows = relative_errors({f"output {k}": o for k, o in enumerate(outputs)},
                           {f"output {k}": o for k, o in enumerate(ref_outputs)})
    if grads:
        rows |= relative_errors({f"grad {n}": g for n, g in grads.items()}, {f"grad {n}": g for n, g in ref_grads.items()})
    shapes = {f"output {k}": list(o.shape) for k, o in enumerate(ref_outputs)}
    shapes |= {f"grad {n}": list(g.shape) for n, g in ref_grads.items()}
    for label, (abs_err, rel_err) in rows.items():
        print(f"  {label} {shapes.get(label, '')}: max abs err {abs_err:.3g}, max rel err {rel_err:.3g}")
    worst = max(rel for _, rel in rows.values())
    ok = worst <= tolerance
    print(f"  largest relative error {worst:.3g} (tolerance {tolerance:g}): {'ok' if ok else 'FAILED'}")
    return ok


def _check_ranks(plan: Plan, summaries: list[dict[str, Any]], list_all: bool) -> bool:
    """Rank 0: print every rank's memory and traffic; True if all ran the plan's collectives and agree."""
    nothing = "nothing (replicated plan)" if plan.shards_nothing() else "nothing"
    for rank, s in enumerate(summaries):
        traffic = ", ".join(f"{kind} {s['calls'][kind]}x {format_bytes(s['sent'][kind])}" for kind in sorted(s["sent"]))
        print(f"  rank {rank}: parameters {format_bytes(s['param_bytes'])} of {format_bytes(s['full_bytes'])} "
              f"unsharded; sent {traffic or nothing}")
    first = summaries[0]["digests"]
    differing = sorted({label for s in summaries for label, d in s["digests"].items() if d != first[label]})
    if differing:
        print(f"  FAILED: ranks gathered different values for {', '.join(differing)}")
    off_plan = [rank for rank, s in enumerate(summaries) if not s["matches_plan"]]
    verdict = "equal to the plan's list" if not off_plan else f"DIFFERENT from the plan's list on ranks {off_plan}"
    print(f"  collectives: {summaries[0]['count']} executed per rank, {len(expected_collectives(plan))} planned, "
          f"{verdict}")
    if list_all:
        for c in sorted(summaries[0]["collectives"], key=lambda c: c.phase != FORWARD):
            print(f"    {c.phase:8} {c.kind:14} axis {c.axis} {format_bytes(c.sent_bytes):>10}  {c.edge}")
    return not differing and not off_plan


def _execute(prep: Prepared, args: argparse.Namespace, rank: int) -> bool:
    """The distributed part: parallelize, run, gather, report on rank 0; every rank gets the verdict."""
    prep.inputs = broadcast_from_first(prep.inputs)
    groups = MeshGroups.create(prep.plan.mesh)
    parallel = parallelize(prep.model, prep.plan, groups, graph=prep.graph, validate=False)  # prepare() checked it
    training = prep.plan.mode == "training"
    outputs, grads = _sharded_step(prep, parallel, groups, training)
    summaries: list[Any] = [None] * dist.get_world_size()
    gathered = {f"output {k}": o for k, o in enumerate(outputs)} | {f"grad {n}": g for n, g in grads.items()}
    dist.all_gather_object(summaries, _summary(parallel, prep.model, prep.plan, gathered))
    verdict: list[Any] = [None]
    if rank == 0:
        plan = prep.plan
        print(f"autoshard.run: {plan.model or args.model} on mesh {plan.mesh.label} ({plan.mode} plan, "
              f"{plan.mesh.size} ranks, {args.backend}, traced with torch.{prep.graph.frontend})")
        if plan.shards_nothing():
            print("  the plan is all replicated (the model was too small to be worth sharding at its costs): "
                  "every rank runs the whole model, so this checks replicas, not sharding")
        numerics_ok = _check_numerics(prep, outputs, grads, args.tolerance)
        verdict[0] = _check_ranks(plan, summaries, args.collectives) and numerics_ok
    dist.broadcast_object_list(verdict, src=0)
    return bool(verdict[0])


def _run_pipelined(run: PipelinedRun, args: argparse.Namespace, rank: int) -> int:
    """The distributed part for a pipelined plan (``cli/run_pipeline.py``): 0 when it checks, else 1."""
    dist.init_process_group(args.backend)
    try:
        return 0 if check_pipelined(run, args, rank) else 1
    finally:
        dist.destroy_process_group()


def main(argv: Sequence[str] | None = None,
         collectives: Mapping[str, frozenset[str]] = BACKEND_COLLECTIVES) -> int:
    """Entry point; ``collectives`` is the per-backend table the plan is checked against."""
    args = build_parser().parse_args(argv)
    rank = 0
    try:
        rank, world_size, local_rank = launch_env(os.environ)
        if is_pipeline_file(args.plan):
            return _run_pipelined(prepare_pipelined(args, world_size), args, rank)
        prep = prepare(args, world_size, local_rank, collectives)
    except AutoshardError as error:
        return refuse("autoshard.run", error, rank)
    if prep.device.type == "cuda":
        torch.cuda.set_device(prep.device)
    dist.init_process_group(args.backend)
    try:
        return 0 if _execute(prep, args, rank) else 1
    except AutoshardError as error:
        return refuse("autoshard.run", error, rank)
    finally:
        dist.destroy_process_group()
