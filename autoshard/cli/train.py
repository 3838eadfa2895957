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
``cli/train_pipeline.py``, with the same flags and checkpoints.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence, TextIO

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from autoshard.errors import AutoshardError
from autoshard.frontend.load import LoadedModel, load_model
from autoshard.frontend.loss import check_loss_output
from autoshard.frontend.trace import trace
from autoshard.frontend.graph import OpGraph
from autoshard.problem.plan import Plan
from autoshard.cli.process import refuse
from autoshard.cli.run import launch_env
from autoshard.cli.train_pipeline import is_pipeline_file, prepare_pipeline, train_pipeline
from autoshard.runtime.checks import (BACKEND_COLLECTIVES, check_backend, check_layouts, check_model,
                                      check_world)
from autoshard.runtime.executor import ParallelModule, gather_full, parallelize
from autoshard.runtime.groups import MeshGroups, broadcast_from_first

CHECKPOINT = re.compile(r"^step_(\d+)$")


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
    check_model(plan, graph)
    check_layouts(plan, graph)
    check_loss_output(graph, loaded.name, from_loss_function=defined.loss is not None)
    return Training(plan, loaded, graph, device)


def make_optimizer(module: torch.nn.Module, args: argparse.Namespace) -> torch.optim.AdamW:
    """AdamW over every trainable parameter, with the command's learning rate and weight decay."""
    return torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=args.lr,
                             weight_decay=args.weight_decay)


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


def latest_checkpoint(folder: Path) -> tuple[int, Path] | None:
    """The highest ``step_N`` checkpoint DCP finished writing (its ``.metadata`` exists), or None."""
    found = [(int(m[1]), p) for p in folder.glob("step_*") if (m := CHECKPOINT.match(p.name))
             and (p / ".metadata").is_file()] if folder.is_dir() else []
    return max(found) if found else None


def save_checkpoint(folder: Path, step: int, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Path:
    """Write ``folder/step_N`` with the parameters, AdamW's state by parameter name and the step (collective)."""
    model_state, optim_state = get_state_dict(module, optimizer)
    path = folder / f"step_{step:06d}"
    dcp.save({"model": model_state, "optimizer": optim_state, "step": step}, checkpoint_id=path)
    return path


def load_checkpoint(path: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer, part: bool = False) -> int:
    """Load a checkpoint into ``module`` and ``optimizer`` in their own layouts; returns its step (collective).
    ``part``: the module holds some of the model (a pipeline stage), read from the whole one's checkpoint.

    Refuses (AutoshardError, on every rank) a checkpoint of another model and one that cannot be read.
    """
    model_state, optim_state = get_state_dict(module, optimizer)
    shapes = {name: tuple(value.shape) for name, value in model_state.items()}
    check_checkpoint(path, shapes, list(optim_state["state"]), part)
    state = {"model": model_state, "optimizer": optim_state, "step": 0}
    try:
        dcp.load(state, checkpoint_id=path)
    except CheckpointException as error:
        cause, _ = next(iter(error.failures.values()))
        raise AutoshardError(f"checkpoint {path} cannot be loaded ({_first_line(cause)}): it is damaged or was "
                             "written by another program; delete it to resume from the one before") from None
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return int(state["step"])


def check_checkpoint(path: Path, shapes: dict[str, tuple[int, ...]], trained: list[str], part: bool = False) -> None:
    """Refuse a checkpoint whose saved model tensors (DCP metadata) are not ``shapes`` (name -> global shape;
    ``part``: among them), or that lacks the AdamW state of a parameter in ``trained``."""
    try:
        saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    except Exception as error:  # noqa: BLE001 - any failure to read the metadata means a damaged file
        raise AutoshardError(f"checkpoint {path} cannot be read ({_first_line(error)}): its .metadata is damaged; "
                             "delete it to resume from the one before") from None
    held = {key[len("model."):]: tuple(meta.size) for key, meta in saved.items()
            if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)}
    if held == shapes or part and all(held.get(name) == shape for name, shape in shapes.items()):
        if frozen := [n for n in trained if not any(key.startswith(f"optimizer.state.{n}.") for key in saved)]:
            raise AutoshardError(f"checkpoint {path} holds no AdamW state for {frozen[0]}, which this model trains "
                                 "(was it frozen then?): freeze it again, or train this model in a new --checkpoint "
                                 "folder")
        return
    differing = next((n for n in shapes if n in held and held[n] != shapes[n]), None)
    if differing is not None:
        what = f"its {differing} is {list(held[differing])}, this model's {list(shapes[differing])}"
    elif missing := [n for n in shapes if n not in held]:
        more = f" (nor {len(missing) - 1} more of this model's)" if len(missing) > 1 else ""
        what = f"it has no {missing[0]}{more}"
    else:
        extra = [n for n in held if n not in shapes]
        what = f"it has {extra[0]} {list(held[extra[0]])}, which this model lacks"
    raise AutoshardError(f"checkpoint {path} holds another model ({len(held)} parameters and buffers, this model "
                         f"{len(shapes)}; {what}): resume with the model file it was trained with, or train this "
                         "one in a new --checkpoint folder")


def _first_line(error: BaseException) -> str:
    """``Type: first sentence of the message``."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0].split('. ')[0]}" if lines else type(error).__name__


def use_flags(optimizer: torch.optim.Optimizer, args: argparse.Namespace) -> str:
    """Set the command's learning rate and weight decay on every parameter group (a loaded checkpoint
    brings back those it was trained with). Returns what the banner adds after ``AdamW lr X``: the
    weight decay if it changed, and the checkpoint's values replaced, e.g. ``" (the checkpoint was
    trained at lr 0.003)"``; ``""`` when none differed."""
    replaced = {}
    for key, label, value in (("lr", "lr", args.lr), ("weight_decay", "weight decay", args.weight_decay)):
        before = sorted({float(group[key]) for group in optimizer.param_groups})
        if before != [value]:
            replaced[label] = "/".join(f"{v:g}" for v in before)
        for group in optimizer.param_groups:
            group[key] = value
    if not replaced:
        return ""
    decay = f", weight decay {args.weight_decay:g}" if "weight decay" in replaced else ""
    was = ", ".join(f"{label} {values}" for label, values in replaced.items())
    return f"{decay} (the checkpoint was trained at {was})"


class Reporter:
    """Rank 0's view of training: a rich progress bar on a terminal, one plain line per step otherwise."""

    def __init__(self, out: TextIO, total: int, first: int, live: bool) -> None:
        self.out, self.live = out, live
        self.progress: Progress | None = None
        if live:
            self.progress = Progress(TextColumn("step"), MofNCompleteColumn(), BarColumn(),
                                     TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[seconds]}"),
                                     TimeRemainingColumn(), console=Console(file=out), transient=False)
            self.task = self.progress.add_task("train", total=total, completed=first - 1, loss="-", seconds="")

    def __enter__(self) -> "Reporter":
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def step(self, step: int, loss: float, seconds: float) -> None:
        """One finished step."""
        if self.progress is not None:
            self.progress.update(self.task, completed=step, loss=f"{loss:.4f}", seconds=f"{seconds:.2f} s/step")
        else:
            print(f"step {step} loss {loss:.4f} {seconds:.2f} s", file=self.out, flush=True)

    def note(self, text: str) -> None:
        """A line outside the per-step lines (checkpoints, resumes)."""
        if self.progress is not None:
            self.progress.console.print(text, highlight=False, markup=False)
        else:
            print(text, file=self.out, flush=True)


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
                         validate=False)  # prepare() checked it
    optimizer = make_optimizer(module, args)
    folder = Path(args.checkpoint) if args.checkpoint else None
    done, was = 0, ""
    resumed = latest_checkpoint(folder) if args.resume and folder is not None else None
    if args.resume and resumed is None:
        raise AutoshardError(f"--resume: no finished checkpoint in {folder}: train without --resume first")
    if resumed is not None:
        done = load_checkpoint(resumed[1], module, optimizer)
        was = use_flags(optimizer, args)
        if done >= args.steps:
            raise AutoshardError(f"the checkpoint {resumed[1]} is at step {done}; --steps {args.steps} leaves "
                                 "nothing to train: raise --steps")
    reporter = Reporter(out, args.steps, done + 1, out.isatty()) if rank == 0 else None
    losses = []
    with reporter if reporter is not None else nullcontext():
        if reporter is not None:
            reporter.note(f"autoshard.train: {plan.model or training.loaded.name} on mesh {plan.mesh.label} "
                          f"({plan.mesh.size} ranks, {args.backend}), steps {done + 1}-{args.steps}, "
                          f"AdamW lr {args.lr:g}{was}"
                          + (f", resumed from {resumed[1]}" if resumed is not None else ""))
        steps = training_steps(module, optimizer, loaded, done + 1, args.steps, args.max_grad_norm,
                               _whole_loss(module, groups), training.device)
        for step, loss, seconds in steps:
            losses.append(loss)
            if reporter is not None:
                reporter.step(step, loss, seconds)
            if folder is not None and (step % args.checkpoint_every == 0 or step == args.steps):
                path = save_checkpoint(folder, step, module, optimizer)
                if reporter is not None:
                    reporter.note(f"checkpoint {path}")
            if on_step is not None:
                on_step(step, loss)
    return losses


def _whole_loss(module: ParallelModule, groups: MeshGroups) -> Callable[[torch.Tensor], float]:
    """The loss value from this rank's piece: itself when replicated, else summed over the partial axes."""
    spec = module.output_specs[0]
    if spec.is_replicated:
        return float
    return lambda local: float(gather_full(local, spec, groups))


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
