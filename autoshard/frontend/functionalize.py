"""Make a traced graph say what the model computes when it mutates tensors in place.

torch.fx records ``h.masked_fill_(mask, 0.0)`` as a node nobody reads: the later readers of
``h`` still point at the node that produced ``h`` before the mutation, so a plan built on that
graph computes with the unmasked value. Two repairs, one per frontend:

- fx: :func:`functionalize_fx` rewrites each in-place call ``m`` mutating node ``a`` into an
  out-of-place one (``m`` is replayed on a copy of ``a``: ``OUT_OF_PLACE`` in ``node.meta``) and
  points every reader of ``a`` after ``m`` at ``m``. That is exact when no other tensor that
  shares ``a``'s storage (a view of it, or the base it views) is read after ``m``; storage
  sharing is read off the fake tensors of the shape propagation. Anything else (a mutation seen
  through a view, of a parameter or buffer, ``out=``) is refused with :class:`MutationError`,
  naming the op and the fix; under ``--frontend auto`` that falls back to torch.export.
- export: torch.export's training IR keeps in-place ATen ops (``aten.masked_fill_``,
  ``aten.zero_`` on a ``select`` view); :func:`has_mutations` finds them and the caller runs
  ``ExportedProgram.run_decompositions({})``, torch's own functionalisation (views written
  through become ``select_scatter``/``slice_scatter``), only for such programs. Its functional
  ops that autograd cannot differentiate (``aten.copy``, from ``key[..., :n].copy_(k)`` or
  ``x[:, 0] = y``) replay as the equivalents in :data:`DIFFERENTIABLE`.

In-place Python operators (``h += 1``) are recorded as ``operator.iadd`` nodes by the fx tracer
(:class:`InPlaceProxy`): plain torch.fx would record ``h = h + 1`` and lose the mutation that
another alias of ``h`` sees.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any, Callable, Iterator

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

OUT_OF_PLACE = "autoshard.out_of_place"
"""``node.meta`` key: replay this in-place call on a copy of its first operand."""

INPLACE_OPERATORS: dict[Callable[..., Any], Callable[..., Any]] = {
    operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
    operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv, operator.imod: operator.mod,
    operator.ipow: operator.pow, operator.iand: operator.and_, operator.ior: operator.or_,
    operator.ixor: operator.xor, operator.ilshift: operator.lshift, operator.irshift: operator.rshift,
    operator.imatmul: operator.matmul,
}
"""In-place Python operators and the operators they compute."""

# Methods that end in "_" but change no tensor value.
_NOT_MUTATING = frozenset({"requires_grad_", "retain_grad", "share_memory_"})


class MutationError(ValueError):
    """An in-place call the fx graph cannot express exactly; the message names the op and the fix."""


class InPlaceProxy(torch.fx.Proxy):
    """A torch.fx Proxy that records ``x += y`` as ``operator.iadd(x, y)`` instead of ``x = x + y``,
    and refuses ``x[i] = y``, which torch.fx cannot record, with a :class:`MutationError`."""

    def __setitem__(self, index: Any, value: Any) -> None:
        raise MutationError(f"item assignment x[...] = ... (x the result of node {self.node.name}) writes into a tensor "
                            "in place, which "
                            "torch.fx cannot record; use --frontend export (it functionalises the write) or build "
                            "the tensor without assigning into it (torch.cat, torch.where)")


def _inplace_method(function: Callable[..., Any]) -> Callable[[torch.fx.Proxy, Any], torch.fx.Proxy]:
    def method(self: torch.fx.Proxy, other: Any) -> torch.fx.Proxy:
        return self.tracer.create_proxy("call_function", function, (self, other), {})
    return method


for _function in INPLACE_OPERATORS:
    setattr(InPlaceProxy, f"__{_function.__name__}__", _inplace_method(_function))


def _copy(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``aten.copy``: a new tensor of ``self``'s shape, dtype and device holding ``src`` broadcast;
    the gradient goes to ``src`` (``self`` lends only its metadata, as in ATen's derivative)."""
    return torch.empty_like(self).copy_(src, non_blocking=non_blocking)


DIFFERENTIABLE: dict[Any, Callable[..., Any]] = {torch.ops.aten.copy.default: _copy}
"""Functional ATen ops without a derivative, and differentiable calls computing the same values."""


def functionalize_fx(module: torch.fx.GraphModule) -> None:
    """Rewrite ``module``'s in-place calls out of place (see the module doc); needs ``meta["val"]``."""
    graph = module.graph
    order = {node: k for k, node in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        mutated = mutated_operand(node)
        if mutated is None:
            continue
        if not isinstance(mutated.meta.get("val"), torch.Tensor):
            node.meta[OUT_OF_PLACE] = True  # ``n += 1`` on a Python number: nothing is aliased
            continue
        if mutated.op == "get_attr":
            raise MutationError(_state_message(node, mutated))
        _check_alone(node, mutated, graph, order)
        for user in [u for u in mutated.users if order[u] > order[node]]:
            user.replace_input_with(mutated, node)
        node.meta[OUT_OF_PLACE] = True


def mutated_operand(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node an in-place call writes to (its first operand), or None for a pure call."""
    if node.op not in ("call_method", "call_function"):
        return None
    if "out" in node.kwargs:
        raise MutationError(f"{_call_text(node)} writes its result into out=: autoshard traces pure functions; "
                            "assign the result instead (y = op(...)) or use --frontend export")
    if not _is_inplace(node) or not node.args:
        return None
    first = node.args[0]
    return first if isinstance(first, torch.fx.Node) else None


def _is_inplace(node: torch.fx.Node) -> bool:
    """Methods and torch functions named ``op_`` that write ATen's ``self``, ``inplace=True``, ``+=``."""
    target = node.target
    if node.op == "call_method":
        return isinstance(target, str) and target not in _NOT_MUTATING and _writes_self(target)
    if target in INPLACE_OPERATORS:
        return True
    if isinstance(target, torch._ops.OpOverload):
        return _schema_writes(target._schema)
    name = getattr(target, "__name__", "")
    if getattr(target, "__module__", "").startswith("torch") and name not in _NOT_MUTATING and _writes_self(name):
        return True
    return _inplace_flag(target, node.args, node.kwargs)


def _writes_self(name: str) -> bool:
    """True when the ATen packet ``name`` (``masked_fill_``, ``relu_``) writes its first argument."""
    if not name.endswith("_") or name.startswith("_"):
        return False
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return False
    return any(_schema_writes(getattr(packet, overload)._schema) for overload in packet.overloads())


def _schema_writes(schema: torch._C.FunctionSchema) -> bool:
    arguments = schema.arguments
    return bool(arguments) and arguments[0].alias_info is not None and arguments[0].alias_info.is_write


def _inplace_flag(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``F.relu(x, inplace=True)``, ``F.dropout(x, p, training, True)``: a Python ``inplace`` argument."""
    if not callable(target) or not getattr(target, "__module__", "").startswith("torch"):
        return False
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return False
    if "inplace" not in signature.parameters:
        return False
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return False
    return bool(bound.arguments.get("inplace", False))


def _check_alone(node: torch.fx.Node, mutated: torch.fx.Node, graph: torch.fx.Graph,
                 order: dict[torch.fx.Node, int]) -> None:
    """Refuse a mutation that another live alias of the mutated tensor would see."""
    storage = _storage(mutated.meta["val"])
    for other in graph.nodes:
        if order[other] >= order[node]:
            break
        if other is mutated or storage not in set(_storages(other.meta.get("val"))):
            continue
        if other.op == "get_attr":
            raise MutationError(_state_message(node, other))
        later = sorted((user for user in other.users if order[user] > order[node]), key=order.__getitem__)
        if later:
            raise MutationError(f"{_call_text(node)} writes to {mutated.name}, which shares storage with "
                                f"{other.name}, read afterwards by {later[0].name}: torch.fx cannot express a "
                                "mutation seen through a view; use --frontend export (it functionalises them) or "
                                "compute a new tensor instead of writing into a view")


def _state_message(node: torch.fx.Node, state: torch.fx.Node) -> str:
    if str(state.target).startswith("_tensor_constant"):  # a tensor forward built from no input: fx froze it
        return (f"{_call_text(node)} modifies a tensor forward creates without its inputs ({state.target}), which "
                "torch.fx records as a constant: its later uses would miss the change; use --frontend export")
    return (f"{_call_text(node)} modifies parameter or buffer {state.target} in place: autoshard plans a pure "
            "function of inputs and parameters; compute a new tensor instead (or update it outside forward)")


def _storage(value: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(value.untyped_storage())


def _storages(value: Any) -> Iterator[StorageWeakRef]:
    """Storages of a node's value: a tensor, or the tensors of a tuple/list result."""
    if isinstance(value, torch.Tensor):
        yield _storage(value)
    elif isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, torch.Tensor):
                yield _storage(item)


def _call_text(node: torch.fx.Node) -> str:
    """``masked_fill_ (node masked_fill_)``: the call as the user wrote it, and its node."""
    target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    return f"in-place {target} (node {node.name})"


def has_mutations(module: torch.fx.GraphModule) -> bool:
    """True when an exported graph (or a higher-order op's body in it) calls an ATen op that writes an input."""
    for node in module.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if any(a.alias_info is not None and a.alias_info.is_write for a in node.target._schema.arguments):
                return True
        if node.op == "get_attr":
            body = operator.attrgetter(node.target)(module)
            if isinstance(body, torch.fx.GraphModule) and has_mutations(body):
                return True
    return False
