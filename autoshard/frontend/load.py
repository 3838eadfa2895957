"""Load a user's model file: a Python file that says which module to shard and what it eats.

Convention: the file defines either

- module-level ``model`` (an ``nn.Module``) and ``example_inputs`` (a tensor or a tuple of
  tensors, passed positionally: ``model(*example_inputs)``), or
- a function ``build()`` returning ``(model, example_inputs)`` (used first when both exist;
  handy when construction is costly or needs a seed).

For training (``autoshard.solve --mode training``, a training plan under ``autoshard.run``,
``autoshard.train``) the file may also define:

- ``loss(outputs, *targets)`` returning a scalar tensor: the model is then traced together with
  its loss (``frontend.loss.with_loss``), so the plan shards the loss too; without it the model's
  own output must be the loss (a model that computes its loss in forward);
- ``example_targets``, the tensors (or tensor) passed to ``loss`` after the outputs when tracing;
- ``batch(step)`` returning step ``step``'s tensors in graph order: the model's inputs, then the
  loss's targets, with the example shapes. It must be a pure function of ``step`` (seed a local
  ``torch.Generator`` with it), so every rank builds the same batch and a resumed run sees the
  same data. Without it every step trains on the example inputs and targets.

The file runs as a fresh module with its own folder on ``sys.path`` (so it may import sibling
files). Ranks may build different random weights (rank 0's are broadcast), but plans and
examples are reproducible only if the file seeds. Every problem is reported as a one-line
``AutoshardError`` naming the file, what is wrong and how to fix it.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch

from autoshard.errors import AutoshardError
from autoshard.frontend.loss import with_loss

_CONVENTION = ("define `model` (an nn.Module) and `example_inputs` (a tensor or tuple of tensors), "
              "or `build()` returning both")
_SHORT_CONVENTION = "defines `model` and `example_inputs` (or `build()`)"


@dataclass
class LoadedModel:
    """A model ready to trace: ``model(*example_inputs)``; ``name`` is the file's stem.

    ``loss``, ``example_targets`` and ``batch`` are the file's training definitions (see module doc).
    """

    model: torch.nn.Module
    example_inputs: tuple[torch.Tensor, ...]
    name: str
    loss: Callable[..., torch.Tensor] | None = None
    example_targets: tuple[torch.Tensor, ...] = ()
    batch: Callable[[int], Any] | None = None

    def for_training(self) -> "LoadedModel":
        """The model a training plan is made for: with its loss when the file defines one."""
        if self.loss is None:
            return self
        _check_loss_arguments(self.name, self.loss, len(self.example_targets))
        model = with_loss(self.model, self.loss, len(self.example_inputs), len(self.example_targets))
        return LoadedModel(model, self.example_inputs + self.example_targets, self.name, None, (), self.batch)

    def step_batch(self, step: int) -> tuple[torch.Tensor, ...]:
        """Step ``step``'s graph inputs (``batch(step)``, else the examples), checked against the example shapes."""
        expected = self.example_inputs + self.example_targets
        if self.batch is None:
            return expected
        try:
            got = self.batch(step)
        except Exception as error:
            raise AutoshardError(f"batch({step}) in the {self.name} model file raised {describe_error(error)}; "
                                 "fix batch(step) so it returns the step's inputs and targets") from error
        got = (got,) if isinstance(got, torch.Tensor) else tuple(got) if isinstance(got, (tuple, list)) else None
        shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in got or ()]
        if got is None or shapes != [tuple(t.shape) for t in expected]:
            raise AutoshardError(f"batch({step}) in the {self.name} model file returned {shapes or 'no tensors'}, "
                                 f"not tensors of the example shapes {[tuple(t.shape) for t in expected]} "
                                 "(inputs, then targets)")
        return got


def _check_loss_arguments(name: str, loss: Callable[..., Any], targets: int) -> None:
    """Refuse a ``loss`` that cannot take the outputs and the ``targets`` example targets, naming the fix."""
    try:
        signature = inspect.signature(loss)
    except (TypeError, ValueError):
        return  # a builtin or C function: its call will tell
    try:
        signature.bind(None, *([None] * targets))
    except TypeError:
        params = list(signature.parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p.name for p in positional[1:] if p.default is p.empty]
        shown = f"loss({', '.join(p.name for p in params)})"
        if targets == 0:
            raise AutoshardError(f"the {name} model file defines {shown} but no `example_targets`: define "
                                 f"example_targets = the tensors passed to loss after the outputs "
                                 f"({', '.join(required) or 'one per argument after outputs'})") from None
        takes = f"{len(required)} target{'s' if len(required) != 1 else ''}"
        raise AutoshardError(f"the {name} model file's {shown} takes {takes} after the outputs, but example_targets "
                             f"holds {targets}: make example_targets match loss's arguments") from None


def load_model(path: str) -> LoadedModel:
    """Run the model file at ``path`` and return its model and example inputs (see module doc)."""
    file = Path(path)
    if not file.exists():
        raise AutoshardError(f"model file {path} does not exist; "
                             f"pass the path of a .py file that {_SHORT_CONVENTION}")
    if not file.is_file() or file.suffix != ".py":
        raise AutoshardError(f"model file {path} is not a .py file; pass a Python file that {_SHORT_CONVENTION}")
    module = _run_file(file)
    if callable(getattr(module, "build", None)):
        model, example_inputs = _call_build(file, module.build)
    elif hasattr(module, "model"):
        if not hasattr(module, "example_inputs"):
            raise AutoshardError(f"{path} defines `model` but not `example_inputs`; add example_inputs = "
                                 "(a tensor or tuple of tensors passed as model(*example_inputs))")
        model, example_inputs = module.model, module.example_inputs
    else:
        raise AutoshardError(f"{path} defines neither `model` nor `build()`; {_CONVENTION}")
    if not isinstance(model, torch.nn.Module):
        raise AutoshardError(f"{path}: `model` is a {type(model).__name__}, not a torch.nn.Module; "
                             "assign the module instance (e.g. model = MyNet()), not its class or output")
    loss = getattr(module, "loss", None)
    if loss is not None and not callable(loss):
        raise AutoshardError(f"{path}: `loss` is a {type(loss).__name__}, not a function; define "
                             "def loss(outputs, *targets) returning a scalar tensor")
    targets = getattr(module, "example_targets", ())
    targets = _as_input_tuple(file, targets, "example_targets") if targets != () else ()
    batch = getattr(module, "batch", None)
    if batch is not None and not callable(batch):
        raise AutoshardError(f"{path}: `batch` is a {type(batch).__name__}, not a function; define "
                             "def batch(step) returning the step's inputs (then targets)")
    return LoadedModel(model, _as_input_tuple(file, example_inputs), file.stem, loss, targets, batch)


def _run_file(file: Path) -> ModuleType:
    """Execute the file as a fresh module, reporting the exception and its line on failure."""
    name = f"autoshard_model_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise AutoshardError(f"cannot load {file} as a Python module; check the file name and permissions")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look classes up by module name
    folder = str(file.resolve().parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:
        line = _line_in(file, error)
        raise AutoshardError(f"{file}{line}: importing the model file raised {describe_error(error)}; "
                             f"fix it so that `python {file}` runs") from error
    finally:
        sys.path.remove(folder)
    return module


def _call_build(file: Path, build: Any) -> tuple[Any, Any]:
    """Call ``build()`` and check it returned a ``(model, example_inputs)`` pair."""
    try:
        result = build()
    except Exception as error:
        raise AutoshardError(f"{file}{_line_in(file, error)}: build() raised {describe_error(error)}; "
                             "fix build() so it returns (model, example_inputs)") from error
    if not (isinstance(result, tuple) and len(result) == 2):
        raise AutoshardError(f"{file}: build() returned a {type(result).__name__}, not (model, example_inputs); "
                             "return a 2-tuple")
    return result


def _as_input_tuple(file: Path, example_inputs: Any, what: str = "example_inputs") -> tuple[torch.Tensor, ...]:
    """A tensor becomes a 1-tuple; a tuple or list must hold only tensors."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (tuple, list)) and example_inputs:
        for index, item in enumerate(example_inputs):
            if not isinstance(item, torch.Tensor):
                raise AutoshardError(f"{file}: {what}[{index}] is a {type(item).__name__}, not a tensor; "
                                     "pass only tensors (bake other arguments into the model)")
        return tuple(example_inputs)
    passed = "passed as model(*example_inputs)" if what == "example_inputs" else "passed to loss after the outputs"
    raise AutoshardError(f"{file}: {what} is {_brief(example_inputs)}; use a tensor or a non-empty tuple of tensors "
                         f"{passed}")


def _brief(value: Any) -> str:
    if isinstance(value, (tuple, list)) and not value:
        return f"an empty {type(value).__name__}"
    return f"a {type(value).__name__}"


def describe_error(error: BaseException) -> str:
    """``ValueError: first line of the message``: an exception fit for a one-line error."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _line_in(file: Path, error: BaseException) -> str:
    """``:LINE`` of the innermost frame in ``file`` (or a syntax error's line), else empty."""
    target = file.resolve()
    if isinstance(error, SyntaxError) and error.lineno and Path(error.filename or "").resolve() == target:
        return f":{error.lineno}"
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if Path(frame.filename).resolve() == target]
    return f":{frames[-1].lineno}" if frames else ""
