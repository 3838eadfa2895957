"""``torchrun ... -m autoshard.train model.py --plan plan.json --steps N``: train a model with a plan.

    python -m autoshard.solve examples/llama.py --mesh 2x2 --mode training --out plan.json
    torchrun --nproc_per_node=4 -m autoshard.train examples/llama.py --plan plan.json \\
        --steps 20 --lr 1e-3 --checkpoint ckpt --checkpoint-every 10
    torchrun --nproc_per_node=4 -m autoshard.train examples/llama.py --plan plan.json \\
        --steps 40 --checkpoint ckpt --resume

The model file follows the training convention of ``autoshard.frontend.load``: the graph is the
model with its ``loss(outputs, *targets)`` (or a model whose output is its loss), and step ``s``
(counted from 1) trains on ``batch(s)``, built whole and identically on every rank (without
``batch``, on rank 0's example inputs and targets); the plan must be a training plan of that
graph. Each step is one forward and backward through :func:`autoshard.parallelize` (the plan's
collectives only), ``clip_grad_norm_`` on the DTensor gradients (its norm all-reduce is the one
collective outside the plan, with AdamW's step communication-free), then ``torch.optim.AdamW``.
Rank 0 reports every step: a progress bar with loss and step time on a terminal, one line
``step 7 loss 2.3145 0.41 s`` per step otherwise.

Checkpoints (``--checkpoint DIR``, every ``--checkpoint-every`` steps and after the last) are
torch.distributed.checkpoint folders ``DIR/step_000010`` holding the DTensor parameters, the
AdamW state by parameter name and the step. ``--resume`` continues from the latest one, under
this plan or any other plan of the same model (DCP reshards on load), with the learning rate and
weight decay of this command line (the banner names the checkpoint's where they differ); with
the same flags it reproduces the uninterrupted run. A checkpoint of another model, or one that
cannot be read, is refused in one line before anything is written. The graph is traced in eval
mode, so dropout is off. A pipelined plan (``autoshard.solve --pipeline --out``) trains through
``cli/train_pipeline.py``, with the same flags and checkpoints. ``--compile`` runs the plan's
lowered program (one GraphModule per rank: the model's ops and the plan's collectives) under
``torch.compile`` (``ParallelModule.compile``; the losses equal the eager run's within 1e-4,
``tests/runtime/test_train_compile.py``). ``--float8 tensorwise|rowwise`` runs the linears torchao
converts as its Float8 training does (``runtime/float8.py``), on CUDA GPUs with float8 tensor
cores; elsewhere it is refused in one line.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence, TextIO

import torch
import torch.distributed as dist

from autoshard.cost.float8 import RECIPES as FLOAT8_RECIPES
from autoshard.errors import AutoshardError
from autoshard.frontend.load import LoadedModel, load_model
from autoshard.frontend.loss import check_loss_output
from autoshard.frontend.trace import trace
from autoshard.frontend.graph import OpGraph
from autoshard.problem.plan import Plan
from autoshard.cli.process import refuse
from autoshard.cli.run import launch_env
from autoshard.cli.training import Reporter, checkpoint_if_due, make_optimizer, resume, whole_loss
from autoshard.cli.train_pipeline import is_pipeline_file, prepare_pipeline, train_pipeline
from autoshard.runtime.checks import (BACKEND_COLLECTIVES, check_backend, check_layouts, check_model,
                                      check_world)
from autoshard.runtime.executor import parallelize
from autoshard.runtime.groups import MeshGroups, broadcast_from_first

def build_parser() -> argparse.ArgumentParser:
    """Every flag of the command, documented."""
    p = argparse.ArgumentParser(
        prog="torchrun --nproc_per_node=N -m autoshard.train",
        description="Train a model with a sharding plan: AdamW with gradient clipping, a loss curve, checkpoints "
                    "that resume under any plan of the same model, on any world size.",
    )
    p.add_argument("model", help="model file: `model`/`build()` and, for training, `loss`, `example_targets`, `batch`")
    p.add_argument("--plan", required=True, help="training plan written by autoshard.solve --mode training --out")
    p.add_argument("--steps", type=int, required=True, help="train until this step (counted from 1, across resumes)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (default 0.01)")
    p.add_argument("--max-grad-norm", type=float, default=1.0,
                   help="clip the gradients' total 2-norm to this (clip_grad_norm_); 0 turns clipping off (default 1)")
    p.add_argument("--checkpoint", metavar="DIR", help="folder for checkpoints (DIR/step_000010 ...)")
    p.add_argument("--checkpoint-every", type=int, default=100, metavar="K",
                   help="save every K steps, and after the last step (default 100)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint DIR")
    p.add_argument("--compile", action="store_true",
                   help="run the plan's program (the model's ops and the plan's collectives, one graph per rank) "
                        "under torch.compile (inductor; the first step compiles)")
    p.add_argument("--float8", choices=FLOAT8_RECIPES, default=None,
                   help="train the linears as torchao's Float8Linear with this scaling recipe (CUDA GPUs with "
                        "float8 tensor cores only; refused in one line elsewhere)")
    p.add_argument("--backend", choices=sorted(BACKEND_COLLECTIVES), default="gloo",
                   help="torch.distributed backend: gloo (CPU, default), nccl (one GPU per rank), mpi")
    return p


@dataclass
class Training:
    """What every rank checked before training: the plan, the model file's definitions and the graph."""

    plan: Plan
    loaded: LoadedModel
    graph: OpGraph
    device: torch.device


def check_args(args: argparse.Namespace) -> None:
    """Refuse inconsistent flags before loading anything."""
    if args.steps < 1 or args.checkpoint_every < 1:
        raise AutoshardError("--steps and --checkpoint-every must be at least 1")
    if args.resume and not args.checkpoint:
        raise AutoshardError("--resume needs --checkpoint DIR: the folder to resume from")
    if args.float8 is not None and (refusal := float8_refusal(args.backend)) is not None:
        raise AutoshardError(refusal)


def float8_refusal(backend: str) -> str | None:
    """Why ``--float8`` cannot train here, in one line (None: it can): torchao's Float8 GEMMs need
    CUDA float8 tensor cores (sm89+) and torchao (the runtime swaps them into the plan's program,
    ``runtime/float8.py``; ``autoshard.solve --float8`` prices them on any machine)."""
    if backend != "nccl" or not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        return ("--float8 runs torchao's Float8 GEMMs on CUDA GPUs with float8 tensor cores (H100 and later): "
                "train with --backend nccl on such GPUs, or drop --float8 (autoshard.solve --float8 prices it)")
    if importlib.util.find_spec("torchao") is None:
        return "--float8 needs torchao: pip install 'autoshard[float8]', or drop --float8"
    return None


def prepare(args: argparse.Namespace, world_size: int, local_rank: int) -> Training:
    """Load and check flags, plan and model, cheapest checks first; raises AutoshardError, computes nothing."""
    check_args(args)
    plan = Plan.load(args.plan)
    if plan.mode != "training":
        raise AutoshardError(f"{args.plan} is an {plan.mode} plan: re-solve with autoshard.solve --mode training")
    check_world(plan, world_size)
    check_backend(plan, args.backend)
    device = torch.device("cuda", local_rank) if args.backend == "nccl" else torch.device("cpu")
    defined = load_model(args.model)
    loaded = defined.for_training()
    loaded.model.to(device)
    graph = trace(loaded.model, tuple(t.to(device) for t in loaded.example_inputs))
    plan = check_model(plan, graph)
    check_layouts(plan, graph)
    check_loss_output(graph, loaded.name, from_loss_function=defined.loss is not None)
    return Training(plan, loaded, graph, device)


def training_steps(module: torch.nn.Module, optimizer: torch.optim.Optimizer, loaded: LoadedModel, first: int,
                   last: int, max_grad_norm: float, loss_value: Callable[[torch.Tensor], float] = float,
                   device: torch.device | None = None) -> Iterator[tuple[int, float, float]]:
    """Train steps ``first..last`` on ``batch(step)``; yields (step, loss, seconds) after each.

    The same loop trains a :class:`ParallelModule` and, for reference, the unsharded model.
    ``loss_value`` turns the module's (local) loss into the whole loss.
    """
    for step in range(first, last + 1):
        start = time.perf_counter()
        inputs = tuple(t.to(device) if device is not None else t for t in loaded.step_batch(step))
        optimizer.zero_grad(set_to_none=True)
        loss = module(*inputs)
        loss.backward()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(module.parameters(), max_grad_norm)
        optimizer.step()
        value = loss_value(loss.detach())  # reading the value waits for the device
        yield step, value, time.perf_counter() - start


def train(args: argparse.Namespace, training: Training, rank: int, out: TextIO = sys.stdout,
          on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """The distributed part (process group initialized): parallelize, resume, train, checkpoint.

    Returns the losses of the steps this call trained; ``on_step(step, loss)`` runs after each
    step and its checkpoint on every rank.
    """
    plan = training.plan
    loaded = training.loaded
    if loaded.batch is None:  # every step trains on the examples: rank 0's, whether or not the file seeds
        loaded = replace(loaded, example_inputs=broadcast_from_first(loaded.example_inputs),
                         example_targets=broadcast_from_first(loaded.example_targets))
    groups = MeshGroups.create(plan.mesh)
    module = parallelize(training.loaded.model, plan, groups, graph=training.graph,
                         validate=False, float8=args.float8)  # prepare() checked it
    optimizer = make_optimizer(module, args)
    done, was, resumed = resume(args, module, optimizer)
    reporter = Reporter(out, args.steps, done + 1, out.isatty()) if rank == 0 else None
    losses = []
    with reporter if reporter is not None else nullcontext():
        if reporter is not None:
            reporter.note(f"autoshard.train: {plan.model or training.loaded.name} on mesh {plan.mesh.label} "
                          f"({plan.mesh.size} ranks, {args.backend}), steps {done + 1}-{args.steps}, "
                          f"AdamW lr {args.lr:g}{was}"
                          + (f", resumed from {resumed}" if resumed is not None else ""))
        loss_of = whole_loss(module.output_specs[0], groups)
        if args.compile:
            module.compile()
        steps = training_steps(module, optimizer, loaded, done + 1, args.steps, args.max_grad_norm,
                               lambda local: float(loss_of(local)), training.device)
        for step, loss, seconds in steps:
            losses.append(loss)
            if reporter is not None:
                reporter.step(step, loss, seconds)
            checkpoint_if_due(args, step, module, optimizer, reporter)
            if on_step is not None:
                on_step(step, loss)
    return losses


def quiet_dtensor_hints() -> None:
    """Silence DTensor's performance hint that a redistribution over several mesh axes runs as one
    collective per axis (logged by every rank). MeshGroups flattens the axes so that
    clip_grad_norm_'s norm is one all-reduce; DTensor still logs the hint where axes cannot be
    merged (uneven shapes, axes out of order). It is not about the plan, and stderr stays for errors."""
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point under torchrun; user errors print one line from rank 0 and exit 2 (``process.refuse``)."""
    args = build_parser().parse_args(argv)
    rank = 0
    try:
        rank, world_size, local_rank = launch_env(os.environ, "autoshard.train model.py --plan plan.json --steps N")
        check_args(args)
        training = prepare_pipeline(args, world_size) if is_pipeline_file(args.plan) else \
            prepare(args, world_size, local_rank)
    except AutoshardError as error:
        return refuse("autoshard.train", error, rank)
    if isinstance(training, Training) and training.device.type == "cuda":
        torch.cuda.set_device(training.device)
    dist.init_process_group(args.backend)
    quiet_dtensor_hints()
    try:
        if isinstance(training, Training):
            train(args, training, rank)
        else:
            train_pipeline(args, training, rank)
        return 0
    except AutoshardError as error:
        return refuse("autoshard.train", error, rank)
    finally:
        dist.destroy_process_group()
