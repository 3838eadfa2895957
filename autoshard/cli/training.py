"""What both training loops of ``autoshard.train`` share (``cli/train.py``, ``cli/train_pipeline.py``):
AdamW, the DCP checkpoints that resume under any plan, and rank 0's report of each step."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Callable, TextIO

import torch
import torch.distributed.checkpoint as dcp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from autoshard.errors import AutoshardError
from autoshard.runtime.placements import gather_full
from autoshard.runtime.groups import MeshGroups
from autoshard.sharding.spec import TensorSpec

CHECKPOINT = re.compile(r"^step_(\d+)$")
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
"""AdamW's state and hyperparameters keyed by parameter name (``optimizer.param_groups.<name>.lr``),
so every pipeline stage saves and reads its own parameters' entries, not one rank's group list."""


def make_optimizer(module: torch.nn.Module, args: argparse.Namespace) -> torch.optim.AdamW:
    """AdamW over every trainable parameter, with the command's learning rate and weight decay."""
    return torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=args.lr,
                             weight_decay=args.weight_decay)


def latest_checkpoint(folder: Path) -> tuple[int, Path] | None:
    """The highest ``step_N`` checkpoint DCP finished writing (its ``.metadata`` exists), or None."""
    found = [(int(m[1]), p) for p in folder.glob("step_*") if (m := CHECKPOINT.match(p.name))
             and (p / ".metadata").is_file()] if folder.is_dir() else []
    return max(found) if found else None


def save_checkpoint(folder: Path, step: int, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Path:
    """Write ``folder/step_N`` with the parameters, AdamW's state by parameter name and the step (collective)."""
    model_state, optim_state = get_state_dict(module, optimizer, options=FLAT)
    path = folder / f"step_{step:06d}"
    dcp.save({"model": model_state, "optimizer": optim_state, "step": step}, checkpoint_id=path)
    return path


def load_checkpoint(path: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer, part: bool = False) -> int:
    """Load a checkpoint into ``module`` and ``optimizer`` in their own layouts; returns its step (collective).
    ``part``: the module holds some of the model (a pipeline stage), read from the whole one's checkpoint.

    Refuses (AutoshardError, on every rank) a checkpoint of another model and one that cannot be read.
    """
    model_state, optim_state = get_state_dict(module, optimizer, options=FLAT)
    shapes = {name: tuple(value.shape) for name, value in model_state.items()}
    trained = list(dict.fromkeys(key[len("state."):key.rindex(".")] for key in optim_state if key.startswith("state.")))
    check_checkpoint(path, shapes, trained, part)
    state = {"model": model_state, "optimizer": optim_state, "step": 0}
    try:
        dcp.load(state, checkpoint_id=path)
    except CheckpointException as error:
        cause, _ = next(iter(error.failures.values()))
        raise AutoshardError(f"checkpoint {path} cannot be loaded ({_first_line(cause)}): it is damaged or was "
                             "written by another program; delete it to resume from the one before") from None
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=FLAT)
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


def resume(args: argparse.Namespace, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
           part: bool = False) -> tuple[int, str, Path | None]:
    """With ``--resume``, the latest checkpoint of ``--checkpoint`` loaded into ``module`` and
    ``optimizer`` (``part``: a pipeline stage's share of the model): (its step, what the banner adds
    about the flags, its path); (0, "", None) without ``--resume`` (collective)."""
    folder = Path(args.checkpoint) if args.checkpoint else None
    resumed = latest_checkpoint(folder) if args.resume and folder is not None else None
    if args.resume and resumed is None:
        raise AutoshardError(f"--resume: no finished checkpoint in {folder}: train without --resume first")
    if resumed is None:
        return 0, "", None
    done = load_checkpoint(resumed[1], module, optimizer, part)
    was = use_flags(optimizer, args)
    if done >= args.steps:
        raise AutoshardError(f"the checkpoint {resumed[1]} is at step {done}; --steps {args.steps} leaves "
                             "nothing to train: raise --steps")
    return done, was, resumed[1]


def checkpoint_if_due(args: argparse.Namespace, step: int, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                      reporter: Reporter | None) -> None:
    """Save ``step``'s checkpoint when ``--checkpoint-every`` says so, and after the last step
    (collective); rank 0's reporter names it."""
    if args.checkpoint and (step % args.checkpoint_every == 0 or step == args.steps):
        path = save_checkpoint(Path(args.checkpoint), step, module, optimizer)
        if reporter is not None:
            reporter.note(f"checkpoint {path}")


def whole_loss(spec: TensorSpec, groups: MeshGroups) -> Callable[[torch.Tensor], torch.Tensor]:
    """The whole loss from this rank's piece of layout ``spec``: the piece itself when replicated,
    else summed over the partial axes (collective then)."""
    if spec.is_replicated:
        return lambda local: local.detach()
    return lambda local: gather_full(local.detach(), spec, groups)
