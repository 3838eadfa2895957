"""A model and its loss as one module, so the loss is part of the graph a training plan shards.

``with_loss(model, loss, n_inputs, n_targets)`` returns the model itself under a subclass whose
``forward(*inputs, *targets)`` is ``loss(model.forward(*inputs), *targets)``. It is a shallow
copy of the model (the same parameter and submodule dictionaries), so every parameter keeps its
dotted name (``fc1.weight``, not ``model.fc1.weight``) and checkpoints of the model with and
without its loss share keys. The forward is written out with named positional arguments (the
model's own argument names, then the loss's), because torch.fx cannot trace ``*args``; the
names become the graph's input nodes (``--pin input_ids=S0R`` pins the tokens).
"""

from __future__ import annotations

import copy
import inspect
from typing import Callable

import torch
from torch import nn

from autoshard.errors import AutoshardError
from autoshard.frontend.graph import NodeKind, OpGraph


def _argument_names(function: Callable, skip: int, count: int, fallback: str, taken: set[str]) -> list[str]:
    """``count`` names for the positional arguments of ``function`` after the first ``skip``."""
    try:
        params = list(inspect.signature(function).parameters.values())[skip:]
    except (TypeError, ValueError):
        params = []
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = []
    for k in range(count):
        name = params[k].name if k < len(params) and params[k].kind in positional else ""
        if not name.isidentifier() or name.startswith("_") or name in taken:
            name = f"{fallback}{k}"
            while name in taken:
                name += "_"
        taken.add(name)
        names.append(name)
    return names


_NAME = "_autoshard_name"
"""Class attribute of a model-with-loss class: the name messages use (``ResMLP with its loss``)."""


def model_name(model: nn.Module) -> str:
    """The model's class name for messages; a model wrapped by :func:`with_loss` reads ``Net with its loss``."""
    return getattr(type(model), _NAME, type(model).__name__)


def includes_loss(model: nn.Module) -> bool:
    """Whether ``model`` is a model with its loss made by :func:`with_loss`."""
    return hasattr(type(model), _NAME)


def with_loss(model: nn.Module, loss: Callable[..., torch.Tensor], n_inputs: int, n_targets: int) -> nn.Module:
    """``model`` whose forward takes ``n_inputs`` inputs and ``n_targets`` targets and returns the loss."""
    if not callable(loss):
        raise AutoshardError(f"`loss` is a {type(loss).__name__}, not a function: define "
                             "def loss(outputs, *targets) returning a scalar tensor")
    cls = type(model)
    taken = {"self"}
    inputs = _argument_names(cls.forward, 1, n_inputs, "input", taken)
    targets = _argument_names(loss, 1, n_targets, "target", taken)
    source = (f"def forward(self, {', '.join(inputs + targets)}):\n"
              f"    return _loss(_forward(self, {', '.join(inputs)}), {', '.join(targets)})\n")
    namespace: dict = {"_loss": loss, "_forward": cls.forward}
    exec(compile(source, f"<{cls.__name__} with its loss>", "exec"), namespace)
    subclass = type(f"{cls.__name__}WithLoss", (cls,), {"forward": namespace["forward"],
                                                          "__module__": cls.__module__,
                                                          _NAME: f"{cls.__name__} with its loss"})
    wrapped = copy.copy(model)
    wrapped.__class__ = subclass
    return wrapped


def check_loss_output(graph: OpGraph, name: str, from_loss_function: bool = True) -> None:
    """Refuse a graph to be trained whose output is not one floating-point scalar: backward needs a
    scalar to start from. ``from_loss_function``: the output is the model file's ``loss`` (traced
    with :func:`with_loss`), else the model's own output."""
    output = next(node for node in graph if node.kind is NodeKind.OUTPUT)
    metas = [graph[source].tensor for source in output.inputs]
    if len(metas) == 1 and metas[0] is not None and metas[0].shape == () and metas[0].is_float:
        return
    if not from_loss_function:
        shapes = ", ".join(str(list(m.shape)) if m is not None else "?" for m in metas)
        raise AutoshardError(f"the {name} model's output is {shapes}, not a scalar loss: define "
                             "loss(outputs, *targets) and example_targets in the model file (or return the loss from "
                             "forward)")
    got = ", ".join("a non-tensor" if meta is None else f"{meta.dtype} {list(meta.shape)}" for meta in metas)
    raise AutoshardError(f"loss in the {name} model file returns {got or 'no tensor'}, not a floating-point scalar: "
                         "reduce it to one (e.g. .mean() or .sum())")
