"""A traced node's call as program nodes: the traced target itself on local operands.

The tracer records every op's call (``frontend.call.NodeCall``: its target, arguments with
operand markers, attribute slots). The program spells it as one ``call_function`` (or
``call_method``) node of that target, the operands filled in and the plan's local attributes
(``NodePlacement.local_attrs``, a reshaped ``size``) put in their slots, as
``NodeCall.__call__`` does at run time. A call the program cannot spell (an argument that is no
constant fx writes, a call traced under ``no_grad``) returns None, and the lowering names a
:class:`~autoshard.runtime.graph.calls.Call` instead.

The most frequent aten ops (``torch.ops.aten.<name>.<overload>``, what ``torch.export`` traces)
are spelled as their generated Python bindings (``_BINDINGS``: ``torch.matmul``, ``F.linear``,
``Tensor.to`` ...): the same kernels on the same arguments, whose omitted trailing arguments
default alike, but parsed directly, where an ``OpOverload`` call goes through the boxed operator
path, 1-2 microseconds more per op (a small model's step runs dozens). The table is explicit:
bindings and schemas differ elsewhere (``cross_entropy_loss``'s binding reads ``reduction=Mean``
as no reduction; ``Tensor.to`` takes ``memory_format`` only by keyword and no ``layout``), and a
call with keyword arguments keeps its ``OpOverload``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.fx as fx
from torch.fx.node import _get_qualified_name

from autoshard.frontend.call import _VIEWS, NodeCall, _fill, _python_form

_aten = torch.ops.aten
_LOGICAL = {_aten.__and__.Tensor: _aten.logical_and.default, _aten.bitwise_and.Tensor: _aten.logical_and.default,
            _aten.__or__.Tensor: _aten.logical_or.default, _aten.bitwise_or.Tensor: _aten.logical_or.default,
            _aten.__xor__.Tensor: _aten.logical_xor.default, _aten.bitwise_xor.Tensor: _aten.logical_xor.default}
"""Bitwise ops on booleans as the logical ops they equal: inductor's CPU vector code widens one
boolean operand of a bitwise op to int64 and then fails on the mixed mask (torch 2.13), which
LLaMA's causal mask meets once its rows are split."""

_BINDINGS: dict[Any, tuple[str, Any, int]] = {
    op: (kind, binding, most) for op, kind, binding, most in (
        (_aten.linear.default, "call_function", torch.nn.functional.linear, 3),
        (_aten.matmul.default, "call_function", torch.matmul, 2),
        (_aten.transpose.int, "call_function", torch.transpose, 3),
        (_aten.reshape.default, "call_function", torch.reshape, 2),
        (_aten.unsqueeze.default, "call_function", torch.unsqueeze, 2),
        (_aten.flatten.using_ints, "call_function", torch.flatten, 3),
        (_aten.chunk.default, "call_function", torch.chunk, 3),
        (_aten.cat.default, "call_function", torch.cat, 2),
        (_aten.add.Tensor, "call_function", torch.add, 2),
        (_aten.sub.Tensor, "call_function", torch.sub, 2),
        (_aten.mul.Tensor, "call_function", torch.mul, 2),
        (_aten.div.Tensor, "call_function", torch.div, 2),
        (_aten.pow.Tensor_Scalar, "call_function", torch.pow, 2),
        (_aten.neg.default, "call_function", torch.neg, 1),
        (_aten.rsqrt.default, "call_function", torch.rsqrt, 1),
        (_aten.silu.default, "call_function", torch._C._nn.silu, 1),
        (_aten.softmax.int, "call_function", torch.softmax, 3),
        (_aten.mean.default, "call_function", torch.mean, 1),
        (_aten.mean.dim, "call_function", torch.mean, 3),
        (_aten.layer_norm.default, "call_function", torch.layer_norm, 6),
        (_aten.embedding.default, "call_function", torch.embedding, 5),
        (_aten.scaled_dot_product_attention.default, "call_function", torch.nn.functional.scaled_dot_product_attention,
         6),
        (_aten.to.dtype, "call_method", "to", 4),
        (_aten.expand.default, "call_method", "expand", 2),
        (_aten.contiguous.default, "call_method", "contiguous", 1),
    )}
"""aten op -> (node kind, Python binding, the most positional arguments it takes alike) (module doc)."""

_CONSTANTS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format, slice,
              type(Ellipsis))


def _spellable(value: Any) -> bool:
    """True when fx writes ``value`` (after the operands are filled in) as a constant or a node."""
    if isinstance(value, (fx.Node, *_CONSTANTS)):
        return True
    if isinstance(value, (tuple, list)) and not hasattr(value, "_fields"):
        return all(_spellable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _spellable(v) for k, v in value.items())
    return False


def _named(target: Any) -> bool:
    """True when fx can name ``target`` in the program's code."""
    try:
        _get_qualified_name(target)
    except Exception:  # noqa: BLE001 - fx raises what the object gives it
        return False
    return True


def emit_call(g: fx.Graph, call: NodeCall, operands: Sequence[fx.Node], overrides: Mapping[str, Any],
              name: str, boolean: bool = False) -> fx.Node | None:
    """``call`` on ``operands`` with ``overrides`` as a node of ``g`` named ``name`` (None: not
    spellable); ``boolean``: the traced output is a boolean tensor (``_LOGICAL``)."""
    if not call.grad_enabled:
        return None
    args = [_fill(a, list(operands)) for a in call.args]
    kwargs = {k: _fill(v, list(operands)) for k, v in call.kwargs.items()}
    python = not isinstance(call.target, torch._ops.OpOverload)
    for attr, value in overrides.items():
        slot = call.slots.get(attr)
        if slot is None:
            return None  # NodeCall raises the error that names the passable attributes
        if isinstance(slot, int):
            args[slot] = _python_form(attr, args[slot], value, python)
        else:
            kwargs[slot] = _python_form(attr, kwargs.get(slot), value, python)
    if not _spellable(args) or not _spellable(kwargs):
        return None
    if call.copy_first and isinstance(args[0], fx.Node):  # an in-place call runs on a copy (frontend.functionalize)
        args[0] = g.call_method("clone", (args[0],))
    target = _VIEWS.get(call.target, call.target)
    if boolean and not kwargs and target in _LOGICAL:
        target = _LOGICAL[target]
    if call.method:
        if not isinstance(target, str):
            return None
        return g.create_node("call_method", target, tuple(args), kwargs, name=name)
    kind, binding, most = _BINDINGS.get(target, (None, None, 0))
    if binding is not None and not kwargs and len(args) <= most and (kind == "call_function" or
                                                                    isinstance(args[0], fx.Node)):
        return g.create_node(kind, binding, tuple(args), {}, name=name)
    if not _named(target):
        return None
    return g.create_node("call_function", target, tuple(args), kwargs, name=name)
