"""Load a user's model file: a Python file that says which module to shard and what it eats.

Convention: the file defines either

- module-level ``model`` (an ``nn.Module``) and ``example_inputs`` (a tensor or a tuple of
  tensors, passed positionally: ``model(*example_inputs)``), or
- a function ``build()`` returning ``(model, example_inputs)`` (used first when both exist;
  handy when construction is costly or needs a seed).

The file runs as a fresh module with its own folder on ``sys.path`` (so it may import sibling
files); the model should be deterministic (seed before constructing). Every problem is reported
as a one-line ``AutoshardError`` naming the file, what is wrong and how to fix it.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from autoshard.errors import AutoshardError

_CONVENTION = ("define `model` (an nn.Module) and `example_inputs` (a tensor or tuple of tensors), "
              "or `build()` returning both")
_SHORT_CONVENTION = "defines `model` and `example_inputs` (or `build()`)"


@dataclass
class LoadedModel:
    """A model ready to trace: ``model(*example_inputs)``; ``name`` is the file's stem."""

    model: torch.nn.Module
    example_inputs: tuple[torch.Tensor, ...]
    name: str


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
    return LoadedModel(model, _as_input_tuple(file, example_inputs), file.stem)


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


def _as_input_tuple(file: Path, example_inputs: Any) -> tuple[torch.Tensor, ...]:
    """A tensor becomes a 1-tuple; a tuple or list must hold only tensors."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (tuple, list)) and example_inputs:
        for index, item in enumerate(example_inputs):
            if not isinstance(item, torch.Tensor):
                raise AutoshardError(f"{file}: example_inputs[{index}] is a {type(item).__name__}, not a tensor; "
                                     "pass only tensors (bake other arguments into the model)")
        return tuple(example_inputs)
    raise AutoshardError(f"{file}: example_inputs is {_brief(example_inputs)}; "
                         "use a tensor or a non-empty tuple of tensors passed as model(*example_inputs)")


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
