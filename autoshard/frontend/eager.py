"""Tell a forward that fails on its example inputs from a model the tracers cannot handle.

When tracing fails, the model is run once eagerly (no grad, eval mode, as traced) on the example
inputs. If that run fails too, the fault is the user's forward (a shape mismatch, a ``raise`` of
theirs), and the error names the exception, the ATen op and its operands' dtypes and shapes when
an op raised, and the innermost line of the user's code; tracing is not mentioned. Shape
propagation does not check dtypes, so a traced graph whose matmul or convolution reads operands of
different dtypes (inputs in float64 or int64 against float32 weights) gets the same eager run.
Torch's fake-tensor logger prints a traceback per failed op while tracing; it is silenced for the
duration only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from autoshard.errors import AutoshardError
from autoshard.frontend.load import describe_error
from autoshard.frontend.loss import includes_loss, model_name
from autoshard.frontend.graph import NodeKind, OpGraph

_NOT_USERS = tuple(str(Path(module.__file__).resolve().parent) + os.sep for module in (torch, contextlib))
"""Frames under these folders (torch, the standard library) are not the user's code."""
_OURS = str(Path(__file__).resolve().parent.parent) + os.sep


@contextlib.contextmanager
def quiet_fake_tensor_logs() -> Iterator[None]:
    """Silence ``torch._subclasses.fake_tensor``'s per-op tracebacks while tracing; restore the logger after."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    disabled = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = disabled


class _FailingOp(TorchDispatchMode):
    """Remembers the ATen op that raised, with its tensor operands' shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.failed: str | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        try:
            return func(*args, **(kwargs or {}))
        except Exception:
            if self.failed is None:
                shapes = [f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"
                          for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
                self.failed = f"aten.{func.overloadpacket.__name__} on {', '.join(shapes) or 'no tensors'}"
            raise


def raise_if_forward_fails(model: torch.nn.Module, example_inputs: tuple[torch.Tensor, ...]) -> None:
    """Run ``model(*example_inputs)`` eagerly; if it raises, raise one line saying that forward fails
    on its example inputs (what, which op on which shapes, where); return when it runs. A model traced
    with its loss (``frontend.loss.with_loss``) names the loss and example targets too."""
    recorder = _FailingOp()
    try:
        with torch.no_grad(), recorder:
            model(*example_inputs)
    except Exception as error:  # the user's forward, whatever it raises
        details = [d for d in (recorder.failed, _user_line(error)) if d]
        where = f" ({'; '.join(details)})" if details else ""
        raise AutoshardError(f"forward of {model_name(model)} fails on its example inputs (run eagerly, not traced): "
                             f"{describe_error(error)}{where}; fix {_what_runs(model)}") from error


def _what_runs(model: torch.nn.Module) -> str:
    """The call that must run, with or without the model file's loss."""
    if includes_loss(model):
        return ("the model, its loss or the example inputs and targets so that "
                "loss(model(*example_inputs), *example_targets) runs")
    return "the model or its example inputs so that model(*example_inputs) runs"


_SAME_DTYPE_OPS = frozenset({
    "linear", "matmul", "bmm", "mm", "addmm", "baddbmm", "einsum", "outer", "dot", "mv",
    "scaled_dot_product_attention", "conv1d", "conv2d", "conv3d", "convolution",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
})
"""Ops whose CPU and CUDA kernels refuse operands of different dtypes (meta kernels do not check)."""


def mixed_dtypes(graph: OpGraph) -> bool:
    """Whether an op of ``_SAME_DTYPE_OPS`` reads operands of different dtypes, or integers: shape
    propagation accepts that, torch's real kernels do not (outside autocast)."""
    for node in graph:
        if node.kind is NodeKind.OP and node.op in _SAME_DTYPE_OPS:
            operands = node.inputs[:3] if node.op == "scaled_dot_product_attention" else node.inputs  # not the mask
            metas = [graph[source].tensor for source in operands]
            dtypes = {meta.dtype for meta in metas if meta is not None}
            if len(dtypes) > 1 or any(meta is not None and not meta.is_float for meta in metas):
                return True
    return False


def _user_line(error: BaseException) -> str:
    """``at net.py:12 in forward``: the innermost frame outside torch, the standard library and autoshard."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = str(Path(frame.filename).resolve()) if not frame.filename.startswith("<") else ""
        if path and not path.startswith(_NOT_USERS + (_OURS,)):
            return f"at {Path(path).name}:{frame.lineno} in {frame.name}"
    return ""
