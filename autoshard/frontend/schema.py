"""Name a traced call's arguments by its ATen schema, whichever frontend recorded the call.

torch.export records calls to ATen overloads, whose arguments already follow a schema. torch.fx
records Python-level calls (``F.linear``, ``operator.add``, ``x.view(2, 8, 64)``,
``F.embedding(input, weight)``) whose names, positions and value forms differ from ATen's.
``bind_call`` maps both to a ``BoundCall``: the ATen packet name, each schema argument's value
(defaults filled in) and where that argument sits in the original call, so the original call can
be replayed later with some arguments replaced (``autoshard.frontend.call``).
"""

from __future__ import annotations

import inspect
import operator
from dataclasses import dataclass
from functools import cache
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch._jit_internal import boolean_dispatched
from torch.fx.operator_schemas import get_signature_for_torch_op

Slot = int | str | None
"""Where an argument sits in the original call: positional index, keyword name, or None when the
original callable cannot take it (e.g. ``alpha`` of ``operator.add``)."""

# Python functions whose ATen packet has another name, or whose parameters are named differently.
# The fallback rule (packet = function name, "input" -> "self") covers everything else.
_FUNCTION_PACKETS: dict[Callable[..., Any], tuple[str, dict[str, str]]] = {
    F.embedding: ("embedding", {"input": "indices"}),
    F.cross_entropy: ("cross_entropy_loss", {}),
    F.nll_loss: ("nll_loss_nd", {}),
    F.dropout: ("dropout", {"training": "train"}),
}

# Python operators -> ATen packets (the names torch.export records for the same expressions).
_OPERATOR_PACKETS: dict[Callable[..., Any], str] = {
    operator.add: "add",
    operator.sub: "sub",
    operator.mul: "mul",
    operator.truediv: "div",
    operator.floordiv: "floor_divide",
    operator.mod: "remainder",
    operator.pow: "pow",
    operator.matmul: "matmul",
    operator.neg: "neg",
    operator.invert: "bitwise_not",
    operator.and_: "__and__",
    operator.or_: "__or__",
    operator.xor: "__xor__",
    operator.eq: "eq",
    operator.ne: "ne",
    operator.lt: "lt",
    operator.le: "le",
    operator.gt: "gt",
    operator.ge: "ge",
    # in-place operators (``x += y``, replayed out of place, see frontend.functionalize) compute the same
    operator.iadd: "add",
    operator.isub: "sub",
    operator.imul: "mul",
    operator.itruediv: "div",
    operator.ifloordiv: "floor_divide",
    operator.imod: "remainder",
    operator.ipow: "pow",
    operator.imatmul: "matmul",
    operator.iand: "__and__",
    operator.ior: "__or__",
    operator.ixor: "__xor__",
}
_COMMUTATIVE = {"add", "mul", "__and__", "__or__", "__xor__", "eq", "ne"}

# Kernel-selection flags: they never change the result, Python wrappers do not pass them (so they
# would be required and unbound), and torch.export records whatever the backend said. Not attributes.
_BACKEND_FLAGS = {"cudnn_enable", "cudnn_enabled"}

# Deprecated loss arguments that override ``reduction`` in Python but have no ATen counterpart.
_LEGACY_REDUCTION = ("size_average", "reduce")

# Python string forms of ATen enum arguments (F.cross_entropy(reduction="mean") -> reduction=1).
PYTHON_ENUMS: dict[str, dict[str, int]] = {"reduction": {"none": 0, "mean": 1, "sum": 2}}


@dataclass
class BoundCall:
    """A call named by ATen schema.

    ``values`` holds every schema argument in schema order (defaults filled in), ``slots`` where
    each sits in ``args``/``kwargs`` (the original call, with ``x.view(2, 8)``'s varargs packed
    into one list), ``optional_tensor_lists`` the ``Tensor?[]`` arguments (``index``'s indices).
    """

    op: str
    values: dict[str, Any]
    slots: dict[str, Slot]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    optional_tensor_lists: frozenset[str]


DTYPE_METHODS = frozenset({"float", "double", "half", "bfloat16"})
"""Tensor methods that convert the dtype (``x.float()``) and have no ATen op of their name."""


def bind_call(
    kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], is_tensor: Callable[[Any], bool]
) -> BoundCall | None:
    """Name a call_function/call_method's arguments by the ATen overload it matches, or None.

    ``is_tensor`` says whether an argument value (an fx Node or a constant) carries a tensor.
    """
    if kind == "call_method":
        if target in DTYPE_METHODS and len(args) == 1 and is_tensor(args[0]) and set(kwargs) <= {"memory_format"}:
            return BoundCall(target, {"self": args[0]}, {"self": 0}, tuple(args), dict(kwargs), frozenset())
        # in-place methods (x.mul_(2)) compute what their functional op does: name them by it
        packet = target[:-1] if target.endswith("_") and not target.startswith("_") else target
        return _bind_positional(packet, args, kwargs, is_tensor, keywords=True, method=True)
    if isinstance(target, torch._ops.OpOverload):
        named = _schema_slots(target._schema, args, kwargs, keywords=True)
        return None if named is None else _bind_schema(target._schema, named, args, kwargs, is_tensor)
    if target in _OPERATOR_PACKETS:
        return _bind_operator(_OPERATOR_PACKETS[target], args, is_tensor)
    if target in boolean_dispatched:
        return _bind_boolean_dispatch(target, args, kwargs, is_tensor)
    if target in _FUNCTION_PACKETS:
        packet, renames = _FUNCTION_PACKETS[target]
        return _bind_python_function(target, packet, renames, args, kwargs, is_tensor)
    signatures, schemas = get_signature_for_torch_op(target, return_schemas=True)
    if signatures is not None:
        # torch.einsum("ij,jk", a, b) passes its Tensor[] as varargs: try the call as given, then packed
        packed = [_pack_varargs(schema, args) for schema in schemas]
        for call_args in [args, *(p for p in packed if p is not args)]:
            for signature, schema in zip(signatures, schemas):
                named = _signature_slots(signature, schema, {}, call_args, kwargs)
                bound = None if named is None else _bind_schema(schema, named, call_args, kwargs, is_tensor)
                if bound is not None:
                    return bound
        return None
    # a torch Python function (F.relu, F.softmax) means the ATen op of its name; user functions do not
    name = getattr(target, "__name__", "")
    if getattr(target, "__module__", "") == "torch.nn.functional" and not hasattr(torch.ops.aten, name):
        return _bind_functional(target, args, kwargs)
    if not getattr(target, "__module__", "").startswith("torch") or not hasattr(torch.ops.aten, name):
        return None
    return _bind_python_function(target, name, {}, args, kwargs, is_tensor)


@cache
def _overload_schemas(packet: str) -> tuple[torch._C.FunctionSchema, ...]:
    """Functional (non-out, non-in-place) schemas of an ATen packet."""
    ops = getattr(torch.ops.aten, packet, None)
    if ops is None:
        return ()
    schemas = (getattr(ops, name)._schema for name in ops.overloads())
    return tuple(schema for schema in schemas if not _writes_argument(schema))


def _writes_argument(schema: torch._C.FunctionSchema) -> bool:
    """True for out= and in-place overloads (``add.out``, ``add_.Tensor``)."""
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _op_name(schema: torch._C.FunctionSchema) -> str:
    """The packet name, in-place ops (``mul_``) named by the functional op they compute (``mul``)."""
    name = schema.name.split("::", 1)[1]
    if name.endswith("_") and not name.startswith("_") and _writes_argument(schema):
        return name[:-1]
    return name


def _bind_positional(
    packet: str, args: tuple[Any, ...], kwargs: dict[str, Any], is_tensor: Callable[[Any], bool],
    keywords: bool, method: bool,
) -> BoundCall | None:
    """Tensor methods (``x.view(2, 8, 64)``) and operators: positions follow the schema order."""
    for schema in _overload_schemas(packet):
        call_args = args
        if method:
            call_args = _pack_varargs(schema, args)
        named = _schema_slots(schema, call_args, kwargs, keywords)
        bound = None if named is None else _bind_schema(schema, named, call_args, kwargs, is_tensor)
        if bound is not None:
            return bound
    return None


def _pack_varargs(schema: torch._C.FunctionSchema, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``x.view(2, 8, 64)`` passes an int list as varargs; name it as the one list it stands for."""
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(args) < 2 or len(positional) < 2:
        return args
    first = positional[1].real_type
    if first.kind() == "ListType" and not isinstance(args[1], (list, tuple, torch.Size)):
        return (args[0], list(args[1:]))
    return args


def _bind_operator(packet: str, args: tuple[Any, ...], is_tensor: Callable[[Any], bool]) -> BoundCall | None:
    """``a + b`` and friends; a scalar on the left (``2 * x``) swaps for commutative ops."""
    if len(args) == 2 and not is_tensor(args[0]) and is_tensor(args[1]):
        if packet == "sub":
            packet = "rsub"
        elif packet not in _COMMUTATIVE:
            return None
        for schema in _overload_schemas(packet):
            names = [a.name for a in schema.arguments]
            bound = _bind_schema(schema, {names[0]: (1, args[1]), names[1]: (0, args[0])}, args, {}, is_tensor)
            if bound is not None:
                return bound
        return None
    return _bind_positional(packet, args, {}, is_tensor, keywords=False, method=False)


def _bind_boolean_dispatch(
    target: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], is_tensor: Callable[[Any], bool]
) -> BoundCall | None:
    """``F.max_pool2d`` picks ``max_pool2d`` or ``max_pool2d_with_indices`` from a flag argument."""
    dispatch = boolean_dispatched[target]
    index, flag_name = dispatch["index"], dispatch["arg_name"]
    flag = args[index] if len(args) > index else kwargs.get(flag_name, dispatch["default"])
    chosen = dispatch["if_true"] if flag else dispatch["if_false"]
    return _bind_python_function(chosen, chosen.__name__.lstrip("_"), {}, args, kwargs, is_tensor)


def _bind_python_function(
    function: Callable[..., Any], packet: str, renames: dict[str, str],
    args: tuple[Any, ...], kwargs: dict[str, Any], is_tensor: Callable[[Any], bool],
) -> BoundCall | None:
    """Python-level functions (``F.softmax``): bind by their signature, then rename to ATen.

    A loss given the deprecated ``size_average``/``reduce`` is not named: they override ``reduction``,
    which the graph would otherwise record as its default "mean".
    """
    try:
        signature = inspect.signature(function)
        passed = signature.bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return None
    if any(passed.get(name) is not None for name in _LEGACY_REDUCTION):
        return None
    for schema in _overload_schemas(packet):
        named = _signature_slots(signature, schema, renames, args, kwargs)
        bound = None if named is None else _bind_schema(schema, named, args, kwargs, is_tensor)
        if bound is not None:
            return bound
    return None


def _bind_functional(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> BoundCall | None:
    """A torch.nn.functional function with no ATen op of its name (``F.interpolate``, ``F.normalize``).

    fx records it as one call while torch.export records the ATen ops it runs; it is named by its
    Python name and its arguments by its Python parameters (defaults filled in), so a rule can
    still be declared for it.
    """
    try:
        bound = inspect.signature(function).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    bound.apply_defaults()
    values: dict[str, Any] = {}
    slots: dict[str, Slot] = {}
    for position, (name, parameter) in enumerate(inspect.signature(function).parameters.items()):
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            return None
        values[name] = bound.arguments[name]
        slots[name] = position if position < len(args) else name
    return BoundCall(op=function.__name__, values=values, slots=slots, args=args, kwargs=kwargs,
                     optional_tensor_lists=frozenset())


def _schema_slots(
    schema: torch._C.FunctionSchema, args: tuple[Any, ...], kwargs: dict[str, Any], keywords: bool
) -> dict[str, tuple[Slot, Any]] | None:
    """Arguments named by schema position and keyword (ATen overloads, Tensor methods, operators)."""
    positional = [a.name for a in schema.arguments if not a.kwarg_only]
    names = {a.name for a in schema.arguments}
    if len(args) > len(positional) or not set(kwargs) <= names:
        return None
    named: dict[str, tuple[Slot, Any]] = {name: (i, value) for i, (name, value) in
                                          enumerate(zip(positional, args))}
    named.update({name: (name, value) for name, value in kwargs.items()})
    if keywords:
        named.update({name: (name, _MISSING) for name in names if name not in named})
    return named


def _signature_slots(
    signature: inspect.Signature, schema: torch._C.FunctionSchema, renames: dict[str, str],
    args: tuple[Any, ...], kwargs: dict[str, Any],
) -> dict[str, tuple[Slot, Any]] | None:
    """Arguments bound by a Python signature and renamed to the schema's names."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    schema_names = {a.name for a in schema.arguments}
    named: dict[str, tuple[Slot, Any]] = {}
    for position, (name, parameter) in enumerate(signature.parameters.items()):
        aten_name = renames.get(name, name)
        if aten_name == "input" and aten_name not in schema_names:
            aten_name = "self"
        if aten_name not in schema_names or parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        keyword_ok = parameter.kind is not inspect.Parameter.POSITIONAL_ONLY
        if name not in bound.arguments:
            named[aten_name] = (name if keyword_ok else None, _MISSING)
        elif name in kwargs:
            named[aten_name] = (name, kwargs[name])
        else:
            named[aten_name] = (position, bound.arguments[name])
    return named


class _Missing:
    """Marks a schema argument the original call did not pass."""


_MISSING = _Missing()


def _bind_schema(
    schema: torch._C.FunctionSchema, named: dict[str, tuple[Slot, Any]],
    args: tuple[Any, ...], kwargs: dict[str, Any], is_tensor: Callable[[Any], bool],
) -> BoundCall | None:
    """Check ``named`` against one schema; fill defaults. None when it does not fit."""
    values: dict[str, Any] = {}
    slots: dict[str, Slot] = {}
    optional_lists = set()
    if not set(named) <= {a.name for a in schema.arguments}:
        return None
    for argument in schema.arguments:
        if argument.name in _BACKEND_FLAGS:
            continue
        slot, value = named.get(argument.name, (None, _MISSING))
        kind = argument.real_type.kind()
        if value is None and kind != "OptionalType" and argument.has_default_value():
            value = _MISSING  # Python-level None meaning "the default"
        if value is _MISSING:
            if not argument.has_default_value():
                return None
            value = argument.default_value
        else:
            if isinstance(value, str) and argument.name in PYTHON_ENUMS:
                value = PYTHON_ENUMS[argument.name].get(value, value)
            if not _fits(argument.real_type, value, argument.N, is_tensor):
                return None
        if kind == "ListType" and argument.real_type.getElementType().kind() == "OptionalType":
            if _holds_tensor_type(argument.real_type):
                optional_lists.add(argument.name)
        if argument.N is not None and isinstance(value, int) and not isinstance(value, bool):
            value = [value] * argument.N
        values[argument.name], slots[argument.name] = value, slot
    return BoundCall(
        op=_op_name(schema), values=values, slots=slots,
        args=args, kwargs=kwargs, optional_tensor_lists=frozenset(optional_lists),
    )


def _holds_tensor_type(schema_type: Any) -> bool:
    """True for Tensor, Tensor?, Tensor[] and Tensor?[] schema types."""
    kind = schema_type.kind()
    if kind in ("OptionalType", "ListType"):
        return _holds_tensor_type(schema_type.getElementType())
    return kind == "TensorType"


def _fits(schema_type: Any, value: Any, length: int | None, is_tensor: Callable[[Any], bool]) -> bool:
    """Whether a value can be passed for an argument of this schema type (Python arg-parser rules)."""
    kind = schema_type.kind()
    if kind == "OptionalType":
        return value is None or _fits(schema_type.getElementType(), value, length, is_tensor)
    if kind == "ListType":
        element = schema_type.getElementType()
        if isinstance(value, (list, tuple, torch.Size)):
            return all(_fits(element, item, None, is_tensor) for item in value)
        return length is not None and _fits(element, value, None, is_tensor)
    if is_tensor(value):
        return kind == "TensorType"
    check = _VALUE_CHECKS.get(kind)
    return check(value) if check is not None else True


# Which non-tensor Python values each schema type accepts (unknown types accept anything).
_VALUE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "TensorType": lambda v: isinstance(v, (int, float, bool)),  # scalars promote (add.Tensor(x, 2))
    "IntType": lambda v: isinstance(v, int),
    "SymIntType": lambda v: isinstance(v, int),
    "FloatType": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "ComplexType": lambda v: isinstance(v, (int, float, complex)) and not isinstance(v, bool),
    "NumberType": lambda v: isinstance(v, (int, float, complex)),
    "BoolType": lambda v: isinstance(v, bool),
    "StringType": lambda v: isinstance(v, str),
    "DeviceObjType": lambda v: isinstance(v, (str, torch.device)),
    "ScalarTypeType": lambda v: isinstance(v, torch.dtype),
    "LayoutType": lambda v: isinstance(v, torch.layout),
    "MemoryFormatType": lambda v: isinstance(v, torch.memory_format),
}
