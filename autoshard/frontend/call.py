"""Run one traced node's original call on tensors of our choosing (e.g. local shards).

The tracer records, for every node, a ``NodeCall``: the original target (a torch function,
Tensor method, ATen overload, or attribute fetch for parameters and buffers) with its arguments,
where tensor operands are ``Operand`` markers in ``OpNode.inputs`` order and every ATen attribute
has a known slot. ``node_caller`` replays it with new operands and attributes overridden by ATen
schema name, which is how the distributed runtime runs an op on local shards (a ``view`` whose
global ``size`` must become the local one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from autoshard.frontend.schema import PYTHON_ENUMS, Slot
from autoshard.frontend.graph import NodeKind, OpGraph

NODE_CALLS_KEY = "autoshard.node_calls"
"""Key of the ``{node name: NodeCall}`` table in ``OpGraph.module.meta``."""


@dataclass(frozen=True)
class Operand:
    """Placeholder for the ``index``-th tensor operand (``OpNode.inputs[index]``)."""

    index: int


@dataclass
class NodeCall:
    """A node's original call with operand placeholders; ``slots`` locate attributes by ATen name.

    A slot is a positional index into ``args`` or a keyword of ``kwargs``; ``method`` calls
    ``getattr(args[0], target)(*args[1:], **kwargs)``; ``grad_enabled=False`` replays a call that
    was traced under ``torch.no_grad`` the same way; ``copy_first`` replays an in-place call
    (``h.masked_fill_(...)``, ``x += y``) on a copy of its first operand, so it computes a new tensor
    and leaves its operand, which other nodes may read, untouched (see ``frontend.functionalize``).
    """

    target: Callable[..., Any] | str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    slots: dict[str, Slot] = field(default_factory=dict)
    method: bool = False
    grad_enabled: bool = True
    copy_first: bool = False

    def __call__(self, operands: Sequence[Any], overrides: Mapping[str, Any]) -> Any:
        """Call the target with ``operands`` filled in and ``overrides`` put in their slots."""
        args = [_fill(a, operands) for a in self.args]
        kwargs = {k: _fill(v, operands) for k, v in self.kwargs.items()}
        if self.copy_first and isinstance(args[0], torch.Tensor):
            args[0] = args[0].clone()
        python = not isinstance(self.target, torch._ops.OpOverload)
        for name, value in overrides.items():
            slot = self.slots.get(name)
            if slot is None:
                passable = sorted(attr for attr, where in self.slots.items() if where is not None)
                raise KeyError(f"{self.target}: attribute {name!r} cannot be passed (passable: {passable})")
            if isinstance(slot, int):
                args[slot] = _python_form(name, args[slot], value, python)
            else:
                kwargs[slot] = _python_form(name, kwargs.get(slot), value, python)
        with torch.set_grad_enabled(self.grad_enabled and torch.is_grad_enabled()):
            if self.method:
                return getattr(args[0], _VIEWS.get(self.target, self.target))(*args[1:], **kwargs)
            return _VIEWS.get(self.target, self.target)(*args, **kwargs)


_VIEWS: dict[Any, Any] = {torch.ops.aten.view.default: torch.ops.aten.reshape.default, "view": "reshape"}
"""A traced ``view`` runs as ``reshape``: the same view wherever the trace's strides allow one, and a
copy where a sharded piece is laid out otherwise (a fused kernel's output on a local shape), where
``view`` would raise."""


def _fill(value: Any, operands: Sequence[Any]) -> Any:
    """``value`` with every ``Operand`` inside (plain tuples, lists and dicts, as a traced call holds
    them) replaced by its operand, lists (fx's immutable ones included) as plain lists; the runtime
    calls this for every node of every step, so it walks the containers itself, not through pytree."""
    if isinstance(value, Operand):
        return operands[value.index]
    if isinstance(value, torch.Size) or not isinstance(value, (tuple, list, dict)):
        return value
    if isinstance(value, dict):  # fx's immutable_dict included
        return {k: _fill(v, operands) for k, v in value.items()}
    filled = [_fill(v, operands) for v in value]
    if hasattr(value, "_fields"):  # a named tuple
        return type(value)(*filled)
    return tuple(filled) if isinstance(value, tuple) else filled


def _python_form(name: str, original: Any, value: Any, python: bool) -> Any:
    """ATen enum values go back to the string form when the original call used strings, or left the
    argument to its default in a Python-level call (``F.cross_entropy(x, t)`` takes ``reduction="sum"``)."""
    if name in PYTHON_ENUMS and (isinstance(original, str) or original is None and python):
        by_number = {number: text for text, number in PYTHON_ENUMS[name].items()}
        return by_number.get(value, value)
    return value


def node_caller(graph: OpGraph, name: str) -> Callable[[Sequence[torch.Tensor], Mapping[str, Any]], Any]:
    """The callable that runs node ``name``: ``caller(operands, overrides)``.

    ``operands`` follow ``OpNode.inputs``; ``overrides`` replace attributes by ATen schema name.
    Parameter and buffer nodes take no operands and return the traced module's live tensor.
    """
    calls: dict[str, NodeCall] = graph.module.meta[NODE_CALLS_KEY]
    if name not in calls:
        raise KeyError(f"node {name!r} is not callable (kind {graph[name].kind.value}): only ops, params, buffers")
    return calls[name]


def run_graph(graph: OpGraph, inputs: Sequence[torch.Tensor]) -> list[Any]:
    """Interpret the whole graph node by node with ``node_caller``; returns the flattened outputs.

    The single-device reference for the runtime: it must equal the model's own output leaves.
    """
    values: dict[str, Any] = {}
    user_inputs = iter(inputs)
    outputs: list[Any] = []
    for node in graph:
        if node.kind is NodeKind.INPUT:
            values[node.name] = next(user_inputs)
        elif node.kind is NodeKind.OUTPUT:
            outputs = [values[source] for source in node.inputs]
        else:
            values[node.name] = node_caller(graph, node.name)([values[source] for source in node.inputs], {})
    return outputs
