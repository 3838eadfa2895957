"""Turn a shape-propagated torch.fx graph (from either frontend) into OpGraph nodes and NodeCalls.

Both frontends hand this module fx nodes whose ``meta["val"]`` holds a (fake) tensor, a tuple of
them, or a plain Python value. Nodes that carry no tensor (``x.size(0)``, ``aten._assert_*``) are
not graph nodes: their values fold into the attributes of the nodes that use them.
"""

from __future__ import annotations

import operator
from dataclasses import replace
from typing import Any, Callable, Iterable

import torch
import torch.fx
from torch.fx.node import _get_qualified_name
from torch.utils import _pytree as pytree

from autoshard.frontend.call import NodeCall, Operand
from autoshard.frontend.functionalize import DIFFERENTIABLE, OUT_OF_PLACE
from autoshard.frontend.schema import bind_call
from autoshard.frontend.graph import NodeKind, OpNode, TensorMeta


def _carries_tensor(value: Any) -> bool:
    """True for a tensor or a tuple/list holding at least one tensor (an op's result)."""
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and any(isinstance(item, torch.Tensor) for item in value)


def _tensor_meta(value: Any) -> TensorMeta | tuple[TensorMeta | None, ...] | None:
    """Shape and dtype of a tensor result; tuples of results as tuples (None for non-tensors)."""
    if isinstance(value, torch.Tensor):
        return TensorMeta(tuple(int(d) for d in value.shape), _dtype_name(value.dtype), value.dtype.itemsize)
    if isinstance(value, (tuple, list)):
        return tuple(_tensor_meta(item) if isinstance(item, torch.Tensor) else None for item in value)
    return None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _plain(value: Any) -> Any:
    """An attribute value as plain data: dtypes, devices, layouts as names; int lists as lists."""
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return str(value).removeprefix("torch.")
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, (list, tuple, torch.Size)):
        return [_plain(item) for item in value]
    return value


def _module_path(node: torch.fx.Node) -> str | None:
    """Innermost module path from ``meta["nn_module_stack"]`` ("" for the root), if recorded."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    return next(reversed(stack.values()))[0]


def _target_name(node: torch.fx.Node) -> str:
    """Readable call target: ``aten.linear.default``, ``torch.nn.functional.gelu``, ``Tensor.view``."""
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    target = node.target
    if isinstance(target, str):
        return target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
        return str(target)
    name = getattr(target, "__name__", "")
    if getattr(torch.nn.functional, name, None) is target:
        return f"torch.nn.functional.{name}"
    if getattr(torch, name, None) is target:
        return f"torch.{name}"
    if getattr(operator, name, None) is target:
        return f"operator.{name}"
    return _get_qualified_name(target)


class GraphConverter:
    """Accumulates OpNodes and NodeCalls while the frontends walk their fx graphs."""

    def __init__(self) -> None:
        self.nodes: dict[str, OpNode] = {}
        self.calls: dict[str, NodeCall] = {}
        self.producer: dict[torch.fx.Node, str] = {}
        self.constant: dict[torch.fx.Node, Any] = {}

    def add_input(self, node: torch.fx.Node, qualname: str) -> None:
        """A user input (placeholder)."""
        self._add(node, OpNode(node.name, NodeKind.INPUT, qualname, out=_tensor_meta(node.meta["val"]),
                               qualname=qualname))

    def add_state(self, node: torch.fx.Node, qualname: str, is_param: bool, fetch: NodeCall) -> None:
        """A parameter or buffer/constant; ``fetch`` returns its live tensor.

        A parameter requires grad as the live one does: a frozen one (``requires_grad=False``) gets
        no gradient, so nothing on its path is differentiated, stored or optimised for it.
        """
        kind = NodeKind.PARAM if is_param else NodeKind.BUFFER
        owner = qualname.rpartition(".")[0]
        requires_grad = is_param and bool(fetch([], {}).requires_grad)
        self._add(node, OpNode(node.name, kind, qualname, out=_tensor_meta(node.meta["val"]), module=owner,
                               qualname=qualname, requires_grad=requires_grad))
        self.calls[node.name] = fetch

    def add_call(self, node: torch.fx.Node, name: str | None = None, grad_enabled: bool = True) -> None:
        """A call_function/call_method node; non-tensor ones only record their value for folding."""
        value = node.meta.get("val")
        if not _carries_tensor(value):
            self.constant[node] = value
            return
        name = name or node.name
        op, inputs, attrs, call = self._normalise(node)
        out = _tensor_meta(value)
        module = _module_path(node)
        if module is None:
            module = self.nodes[inputs[0]].module if op == "getitem" else ""
        requires_grad = grad_enabled and _any_float(out) and any(self.nodes[i].requires_grad for i in inputs)
        self._add(node, OpNode(name, NodeKind.OP, _target_name(node), op=op, inputs=tuple(inputs), attrs=attrs,
                               out=out, module=module, requires_grad=requires_grad))
        self.calls[name] = replace(call, grad_enabled=grad_enabled, copy_first=bool(node.meta.get(OUT_OF_PLACE)))

    def add_output(self, results: Iterable[Any]) -> None:
        """The graph output: every tensor it returns, flattened."""
        sources = [self.producer[leaf] for leaf in pytree.tree_leaves(list(results))
                   if isinstance(leaf, torch.fx.Node) and leaf in self.producer]
        out = tuple(self.nodes[source].tensor for source in sources)
        self.nodes["output"] = OpNode("output", NodeKind.OUTPUT, "output", inputs=tuple(sources), out=out)

    def alias(self, node: torch.fx.Node, source: torch.fx.Node) -> None:
        """Make ``node`` stand for ``source``: a tied weight, or a higher-order op's inputs and outputs."""
        if not isinstance(source, torch.fx.Node):
            self.constant[node] = source
        elif source in self.producer:
            self.producer[node] = self.producer[source]
        else:
            self.constant[node] = self.constant[source]

    def _add(self, node: torch.fx.Node, op_node: OpNode) -> None:
        if op_node.name in self.nodes:
            raise ValueError(f"duplicate node name {op_node.name!r}")
        self.nodes[op_node.name] = op_node
        self.producer[node] = op_node.name

    def _is_tensor(self, value: Any) -> bool:
        return isinstance(value, torch.fx.Node) and value in self.producer

    def _normalise(self, node: torch.fx.Node) -> tuple[str | None, list[str], dict[str, Any], NodeCall]:
        """ATen op name, operand producers, attributes and the replayable call of one node."""
        args, kwargs = self._fold(tuple(node.args)), self._fold(dict(node.kwargs))
        operands: list[str] = []
        marker = self._marker(operands)
        method = node.op == "call_method"
        if node.target in (operator.getitem, getattr) and self._is_tensor(args[0]):
            named = self._element(node.target, args, marker)
            if named is not None:
                return named[0], operands, named[1], named[2]
        bound = bind_call(node.op, node.target, args, kwargs, self._is_tensor)
        if bound is None:
            call_args, call_kwargs = pytree.tree_map(marker, args), pytree.tree_map(marker, kwargs)
            return None, operands, {}, NodeCall(node.target, call_args, call_kwargs, method=method)
        call_args, call_kwargs = list(bound.args), dict(bound.kwargs)
        attrs: dict[str, Any] = {}
        for name, value in bound.values.items():
            slot = bound.slots[name]
            if any(self._is_tensor(leaf) for leaf in pytree.tree_leaves(value)):
                marked = pytree.tree_map(marker, value)
                if isinstance(slot, int):
                    call_args[slot] = marked
                else:
                    call_kwargs[slot] = marked
                if name in bound.optional_tensor_lists:
                    attrs[name] = [item.index if isinstance(item, Operand) else None for item in marked]
            else:
                attrs[name] = _plain(value)
        call_args = pytree.tree_map(marker, tuple(call_args))  # tensors in Python-only arguments
        call_kwargs = pytree.tree_map(marker, call_kwargs)
        target = DIFFERENTIABLE.get(node.target, node.target)
        call = NodeCall(target, call_args, call_kwargs, slots=dict(bound.slots), method=method)
        return bound.op, operands, attrs, call

    def _element(self, target: Any, args: tuple[Any, ...], marker: Callable[[Any], Any]
                 ) -> tuple[str, dict[str, Any], NodeCall] | None:
        """``result[1]`` / ``result.values`` of a multi-output op, ``x[:, 0, None]``, ``x.T``; else None.

        An element of a tuple result is a ``getitem`` by position, however it was spelled. Basic
        tensor indexing (ints, slices, None, Ellipsis) is ``tensor_getitem``, its index as plain
        data: ints, None, "..." and [start, stop, step] lists. Indexing with tensors is not named.
        """
        source, key = args[0].meta.get("val"), args[1]
        if isinstance(source, tuple) and target is getattr:
            if not isinstance(key, str) or not hasattr(source, key):
                return None
            key = next(k for k, item in enumerate(source) if item is getattr(source, key))
        if not isinstance(source, torch.Tensor):
            return "getitem", {"index": key}, NodeCall(operator.getitem, (marker(args[0]), key), slots={"index": 1})
        if target is getattr:
            op = _TENSOR_ATTRIBUTES.get(key)
            return None if op is None else (op, {}, NodeCall(getattr, (marker(args[0]), key)))
        index = _basic_index(key, self.constant)
        if index is None:
            return None
        return "tensor_getitem", {"index": index}, NodeCall(operator.getitem, (marker(args[0]), _index_object(index)))

    def _marker(self, operands: list[str]) -> Callable[[Any], Any]:
        """Replaces tensor-carrying fx nodes by Operand markers, appending their producers."""
        def mark(value: Any) -> Any:
            if not self._is_tensor(value):
                return value
            operands.append(self.producer[value])
            return Operand(len(operands) - 1)
        return mark

    def _fold(self, value: Any) -> Any:
        """Replace non-tensor fx nodes (sizes, dtypes, submodules) by their concrete values."""
        def fold(leaf: Any) -> Any:
            return self.constant[leaf] if isinstance(leaf, torch.fx.Node) and leaf not in self.producer else leaf
        return pytree.tree_map(fold, value)


# Tensor attributes that compute an op: named by the ATen op torch.export records for them.
_TENSOR_ATTRIBUTES = {"T": "numpy_T", "mT": "mT", "data": "detach"}


def _basic_index(key: Any, constants: dict[torch.fx.Node, Any]) -> list[Any] | None:
    """A basic index (``x[:, :16, None, ...]``) as plain data, or None when it holds anything else."""
    def bound(value: Any) -> Any:
        return constants.get(value, value) if isinstance(value, torch.fx.Node) else value

    index: list[Any] = []
    for item in key if isinstance(key, tuple) else (key,):
        if item is Ellipsis:
            index.append("...")
        elif isinstance(item, slice):
            bounds = [bound(item.start), bound(item.stop), bound(item.step)]
            if not all(b is None or type(b) is int for b in bounds):
                return None
            index.append(bounds)
        elif item is None or type(item) is int:
            index.append(item)
        else:
            return None
    return index


def _index_object(index: list[Any]) -> tuple[Any, ...]:
    """The Python index a plain basic index stands for."""
    return tuple(Ellipsis if item == "..." else slice(*item) if isinstance(item, list) else item for item in index)


def _any_float(out: TensorMeta | tuple[TensorMeta | None, ...] | None) -> bool:
    items = out if isinstance(out, tuple) else (out,)
    return any(item is not None and item.is_float for item in items)
