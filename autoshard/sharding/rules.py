"""Sharding rules: from an op's declared rule (specs/ops.toml) and its shapes to strategies.

Every rule is first *instantiated* against the node's concrete shapes into an
:class:`OpInstance`: one index label per dim of every operand and of the output (``None`` for a
dim that may never be sharded, e.g. a broadcast size-1 dim), the indices that are fixed, the
contracted indices (in operands, not in the output), additive operands and mean reductions.
A *strategy* then assigns each mesh axis to at most one free index (an index may take several
axes, in ascending order); from the assignment everything follows mechanically:

- operand i is laid out by its indices' axes (never partial);
- the output is laid out by its indices' axes, and is a partial sum over the axes of the
  contracted indices;
- the gradient of operand i is laid out like operand i, and is a partial sum over every
  assigned axis whose index operand i does not have (for a weight, the batch axes: the
  data-parallel gradient all-reduce falls out of this), except the output's partial axes for an
  operand added into a partial output (a row-parallel bias): the output's gradient arrives
  replicated over those axes, so every device computes the bias's whole gradient itself;
- the local computation is the global one divided by the product of all assigned axis sizes;
- a mean over assigned indices is a partial sum of local means times ``scale`` (1 / shards),
  unless its denominator depends on the data (``counted_indices``: cross-entropy and NLL with
  ``reduction="mean"`` divide by the number of targets not equal to ``ignore_index``, which
  differs from shard to shard). Then the strategy's ``count_axes`` are those assigned to such
  indices and the runtime computes the local *sum* divided by the global count, one scalar
  all-reduce per axis (:func:`count_steps`, charged by the builder and listed in the plan).

An op whose rule names an ``exchange`` pair (token index, expert index) also gets, for each
strategy and each axis of its token index, the strategy in which the expert index takes that
axis too: the op exchanges tokens over it (``exchange_axis``), so that axis leaves no partial
sum (``rules_moe.exchange_variants``).
"""

from __future__ import annotations

import functools
import itertools
import tomllib
from pathlib import Path
from typing import Callable, Sequence

from autoshard import specs
from autoshard.frontend.graph import TensorMeta
from autoshard.sharding.rules_base import (Labels, OpInstance, Rule, RuleError, broadcast_labels, dims_of,
                                  elementwise_instance)
from autoshard.sharding.rules_moe import MOE_KINDS, exchange_variants
from autoshard.sharding.rules_shapes import SHAPE_KINDS, einsum_signature
from autoshard.sharding.spec import TensorSpec
from autoshard.sharding.strategy import OpStrategy, make_strategy, splits


@functools.lru_cache(maxsize=None)
def load_rules(path: Path = specs.OPS) -> dict[str, Rule]:
    """Read the rule table; group tables (with an ``ops`` list) expand to one rule per op."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    rules: dict[str, Rule] = {}
    for name, entry in data.items():
        options = {k: v for k, v in entry.items() if k not in ("kind", "ops")}
        kind = entry.get("kind", "signature" if "signature" in entry else "")
        if not kind:
            raise ValueError(f"{path}: rule {name!r} needs a kind or a signature")
        for op in entry.get("ops", [name]):
            rules[op] = Rule(op, kind, options)
    return rules


def _parse_operand(text: str) -> tuple[list[str], str]:
    """Split an operand of a signature into its tokens and its flags (+ additive, ? optional, _ meta)."""
    text = text.strip()
    flags = ""
    while text and text[0] in "+_":
        flags += text[0]
        text = text[1:].strip()
    if text.endswith("?"):
        flags += "?"
        text = text[:-1].strip()
    return text.split(), flags


def _instantiate_signature(rule: Rule, shapes: list[tuple[int, ...] | None], out_shape: tuple[int, ...], attrs: dict) -> OpInstance:
    lhs, rhs = rule.options["signature"].split("->")
    specs = [_parse_operand(t) for t in lhs.split(",")]
    out_tokens, _ = _parse_operand(rhs)
    required = sum(1 for _, flags in specs if "?" not in flags)
    if not required <= len(shapes) <= len(specs):
        raise RuleError(f"{rule.op} expects {required}..{len(specs)} tensor operands, got {len(shapes)}")
    fixed: set[str] = set()
    group_len: dict[str, int] = {}

    def strip(token: str) -> str:
        name = token.rstrip("!*")
        if token.endswith("!") or token.endswith("!*") or token.endswith("*!"):
            fixed.add(name)
        return name

    # Length of each variadic group: the output's, or the longest operand's.
    tensors = [(tokens, shape) for (tokens, flags), shape in zip(specs, shapes) if "_" not in flags and shape is not None]
    for tokens, shape in [*tensors, (out_tokens, out_shape)]:
        var = [t for t in tokens if "*" in t]
        if var:
            n = len(shape) - (len(tokens) - 1)
            if n < 0:
                raise RuleError(f"{rule.op}: rank {len(shape)} too small for {' '.join(tokens)}")
            group_len[strip(var[0])] = max(group_len.get(strip(var[0]), 0), n)

    def labels_for(tokens: list[str], shape: tuple[int, ...]) -> Labels:
        labels: list[str | None] = []
        n_fixed = len(tokens) - sum(1 for t in tokens if "*" in t)
        for t in tokens:
            name = strip(t)
            if "*" in t:
                n = len(shape) - n_fixed
                total = group_len[name]
                labels.extend(f"{name}{total - n + k}" for k in range(n))
                if name in fixed:  # "s*!": every dim of the group is fixed
                    fixed.update(f"{name}{k}" for k in range(total))
            else:
                labels.append(name)
        if len(labels) != len(shape):
            raise RuleError(f"{rule.op}: operand {' '.join(tokens)} does not match rank {len(shape)}")
        return tuple(labels)

    out_labels = labels_for(out_tokens, out_shape)
    sizes: dict[str, set[int]] = {}
    operands: list[Labels | None] = []
    additive: list[int] = []
    for k, ((tokens, flags), shape) in enumerate(zip(specs, shapes)):
        if "_" in flags or shape is None:
            operands.append(None)
            continue
        if "+" in flags:
            additive.append(k)
            if len(tokens) != len(shape):  # a bias of another rank broadcasts to the output
                labels = broadcast_labels([shape], out_shape, "")[0][0]
                operands.append(tuple(None if l is None else out_labels[int(l)] for l in labels))
                continue
        operands.append(labels_for(tokens, shape))
    full: dict[str, int] = {}
    for labels, shape in [*zip(operands, shapes), (out_labels, out_shape)]:
        for label, n in zip(labels or (), shape or ()):
            if label is not None:
                full[label] = max(full.get(label, 1), n)
    # Size-1 dims that broadcast against a larger size are never sharded in that operand.
    operands = [None if labels is None else tuple(
        None if (l is not None and n == 1 and full[l] > 1) else l for l, n in zip(labels, shape))
        for labels, shape in zip(operands, shapes)]
    for labels, shape in [*zip(operands, shapes), (out_labels, out_shape)]:
        for label, n in zip(labels or (), shape or ()):
            if label is not None:
                sizes.setdefault(label, set()).add(n)
    for condition, names in rule.options.get("fixed_if", {}).items():
        if _condition(condition, attrs):  # a variadic group's name fixes all its dims
            fixed.update(names, (f"{n}{k}" for n in names for k in range(group_len.get(n, 0))))
    exchange = tuple(rule.options["exchange"]) if "exchange" in rule.options else None
    return OpInstance(tuple(operands), out_labels, {k: tuple(sorted(v)) for k, v in sizes.items()},
                      frozenset(fixed), tuple(additive), frozenset(), exchange=exchange)


def _einsum(rule: Rule, shapes, out_shape, attrs) -> OpInstance:
    """torch.einsum: the equation is the signature (contracted indices give partial sums)."""
    signature = einsum_signature(str(attrs["equation"]))
    return _instantiate_signature(Rule(rule.op, "signature", {**rule.options, "signature": signature}),
                                  shapes, out_shape, attrs)


def _condition(condition: str, attrs: dict) -> bool:
    """Evaluate a ``fixed_if`` key: ``attr`` (truthy) or ``attr != value``."""
    if "!=" in condition:
        name, value = (s.strip() for s in condition.split("!="))
        return str(attrs.get(name, value)) != value
    return bool(attrs.get(condition.strip()))



def _along_dim(rule: Rule, shapes, out_shape, attrs) -> OpInstance:
    rank = len(out_shape)
    if "last_dims" in rule.options:
        dims = list(range(max(0, rank - rule.options["last_dims"]), rank))
    else:
        dims = dims_of(attrs.get(rule.options["dim_attr"]), rank)
    return elementwise_instance(rule, shapes, out_shape, attrs, dims)


def _reduce(rule: Rule, shapes, out_shape, attrs) -> OpInstance:
    (shape,) = shapes[:1]
    dims = set(dims_of(attrs.get(rule.options.get("dim_attr", "dim")), len(shape)))
    keep = bool(attrs.get("keepdim", False)) or len(out_shape) == len(shape)
    labels = tuple(f"d{d}" for d in range(len(shape)))
    out = tuple((None if d in dims else labels[d]) for d in range(len(shape)) if keep or d not in dims)
    linear = rule.options.get("linear", False)
    reduced = frozenset(labels[d] for d in dims)
    mean = reduced if rule.options.get("mean") else frozenset()
    return OpInstance((labels, *[None] * (len(shapes) - 1)), out, {l: (n,) for l, n in zip(labels, shape)},
                      frozenset() if linear else reduced, (), mean)


def _extreme(rule: Rule, shapes, out_shape, attrs) -> OpInstance:
    """max/min: of two tensors, elementwise; of one, a reduction over ``dim`` (values and indices)."""
    if len(shapes) == 2:
        return elementwise_instance(rule, shapes, out_shape, attrs)
    return _reduce(rule, shapes, out_shape, attrs)


def _layer_norm(rule: Rule, shapes, out_shape, attrs) -> OpInstance:
    n_norm = len(attrs.get(rule.options["shape_attr"]) or [out_shape[-1]])
    base = elementwise_instance(rule, shapes[:1], out_shape, attrs, range(len(out_shape) - n_norm, len(out_shape)))
    params = [base.output[len(out_shape) - len(s):] if s is not None else None for s in shapes[1:]]
    return OpInstance((base.operands[0], *params), base.output, base.sizes, base.fixed)


def _loss(rule: Rule, shapes, out_shape, attrs) -> OpInstance:
    """cross_entropy / nll_loss: logits [N, C, d1...] (or [C]), class-index targets [N, d1...].

    The class dim is never sharded. A mean (reduction 1) divides by the number of targets not
    equal to ``ignore_index`` (label smoothing divides by the same count), so the target dims are
    ``counted_indices``; with class weights it divides by the targets' summed weights, and the
    target dims are kept whole instead.
    """
    logits, target = shapes[0], shapes[1]
    class_dim = 1 if len(logits) >= 2 else 0
    labels = tuple(f"d{d}" for d in range(len(logits)))
    target_labels = tuple(l for d, l in enumerate(labels) if d != class_dim)
    if len(target_labels) != len(target):
        raise RuleError(f"{rule.op}: target rank {len(target)} does not match logits rank {len(logits)}")
    reduction = attrs.get("reduction", 1)
    weighted = len(shapes) > 2 and shapes[2] is not None
    out = target_labels if reduction == 0 else ()
    fixed = {labels[class_dim]}
    if weighted and reduction == 1:  # a weighted mean divides by a global sum of weights
        fixed.update(target_labels)
    operands = [labels, target_labels] + [(labels[class_dim],) if s is not None else None for s in shapes[2:]]
    counted = frozenset(target_labels) if reduction == 1 else frozenset()
    return OpInstance(tuple(operands), out, {l: (n,) for l, n in zip(labels, logits)}, frozenset(fixed),
                      (), frozenset(), counted)


def _pointwise_loss(rule: Rule, shapes, out_shape, attrs) -> OpInstance:
    """Elementwise loss of broadcast operands, then reduced over everything unless reduction is none."""
    full = tuple(max(dims) for dims in zip(*[(1,) * (max(map(len, shapes)) - len(s)) + tuple(s) for s in shapes]))
    base = elementwise_instance(rule, shapes, full, attrs)
    reduction = attrs.get("reduction", 1)
    if reduction == 0:
        return base
    mean = frozenset(l for l in base.output) if reduction == 1 else frozenset()
    return OpInstance(base.operands, (), base.sizes, frozenset(), (), mean)


def _cat(rule: Rule, shapes, out_shape, attrs) -> OpInstance:
    dim = dims_of(attrs.get("dim", 0), len(out_shape))[0]
    labels = tuple(f"d{d}" for d in range(len(out_shape)))
    operands = [labels if s is not None and len(s) == len(out_shape) else None for s in shapes]
    return OpInstance(tuple(operands), labels, {l: (n,) for l, n in zip(labels, out_shape)}, frozenset({labels[dim]}))


def _split(rule: Rule, shapes, out_shape, attrs) -> OpInstance:
    shape = shapes[0]
    dim = dims_of(attrs.get("dim", 0), len(shape))[0]
    labels = tuple(f"d{d}" for d in range(len(shape)))
    out = tuple(l for d, l in enumerate(labels) if d != dim) if rule.op == "unbind" else labels
    return OpInstance((labels,), out, {l: (n,) for l, n in zip(labels, shape)}, frozenset({labels[dim]}))


def _select(rule: Rule, shapes, out_shape, attrs) -> OpInstance:
    """select / slice / narrow along ``dim``: the other dims pass through; ``dim`` passes whole
    when sliced whole, truncated when a prefix is kept (start 0, step 1), and is fixed otherwise."""
    shape = shapes[0]
    dim = dims_of(attrs.get("dim", 0), len(shape))[0]
    labels = tuple(f"d{d}" for d in range(len(shape)))
    sizes = {l: (n,) for l, n in zip(labels, shape)}
    out = tuple(l for d, l in enumerate(labels) if rule.kind == "slice" or d != dim)
    if rule.kind == "slice" and len(out_shape) == len(shape) and out_shape[dim] == shape[dim]:
        return OpInstance((labels,), out, sizes)
    if rule.kind == "slice" and len(out_shape) == len(shape) and _keeps_prefix(attrs):
        sizes[labels[dim]] = (out_shape[dim], shape[dim])
        return OpInstance((labels,), out, sizes, truncated=frozenset({labels[dim]}))
    return OpInstance((labels,), out, sizes, frozenset({labels[dim]}))


def _keeps_prefix(attrs: dict) -> bool:
    """True for a slice or narrow that keeps the first elements of its dim (start 0, step 1)."""
    return attrs.get("start") in (None, 0) and attrs.get("step") in (None, 1)


def _identity(rule: Rule, shapes, out_shape, attrs) -> OpInstance:
    labels = tuple(f"d{d}" for d in range(len(out_shape)))
    return OpInstance((labels,), labels, {l: (n,) for l, n in zip(labels, out_shape)})


def _creation(rule: Rule, shapes, out_shape, attrs) -> OpInstance:
    labels = tuple(f"d{d}" for d in range(len(out_shape)))
    return OpInstance(tuple(None for _ in shapes), labels, {l: (n,) for l, n in zip(labels, out_shape)},
                      frozenset(labels))


def _expand(rule: Rule, shapes, out_shape, attrs) -> OpInstance:
    return elementwise_instance(rule, shapes[:1], out_shape, attrs)


_KINDS: dict[str, Callable[..., OpInstance]] = {
    "signature": _instantiate_signature,
    "elementwise": elementwise_instance,
    "along_dim": _along_dim,
    "reduce": _reduce,
    "layer_norm": _layer_norm,
    "loss": _loss,
    "pointwise_loss": _pointwise_loss,
    "expand": _expand,
    "cat": _cat,
    "split": _split,
    "select": _select,
    "slice": _select,
    "getitem": _identity,
    "creation": _creation,
    "einsum": _einsum,
    "extreme": _extreme,
    **SHAPE_KINDS,
    **MOE_KINDS,
}


def instantiate(rule: Rule, operands: Sequence[TensorMeta | None], out_shape: tuple[int, ...], attrs: dict) -> OpInstance:
    """Resolve ``rule`` against the operand metas (None = not a tensor) and the output shape."""
    shapes = [m.shape if m is not None else None for m in operands]
    try:
        return _KINDS[rule.kind](rule, shapes, tuple(out_shape), attrs)
    except (KeyError, IndexError, TypeError, ZeroDivisionError) as exc:
        raise RuleError(f"{rule.op}: cannot apply its {rule.kind} rule ({exc!r})") from None


def strategies(instance: OpInstance, mesh_shape: tuple[int, ...],
               allowed: Callable[[int, int], bool] | None = None) -> list[OpStrategy]:
    """Every assignment of mesh axes to free indices that cuts them into pieces (``strategy.splits``).

    ``allowed(dim, rank)`` may forbid sharding some dims of every tensor (Slapo's search space
    only shards the last two dims).
    """
    free = instance.free
    if allowed is not None:
        positions: dict[str, list[tuple[int, int]]] = {}
        for labels in (*instance.operands, instance.output):
            for d, l in enumerate(labels or ()):
                if l is not None:
                    positions.setdefault(l, []).append((d, len(labels)))
        free = [i for i in free if all(allowed(d, r) for d, r in positions.get(i, []))]
    result: list[OpStrategy] = []
    for choice in itertools.product([None, *free], repeat=len(mesh_shape)):
        axes_of: dict[str, tuple[int, ...]] = {}
        for axis, index in enumerate(choice):
            if index is not None and mesh_shape[axis] > 1:
                axes_of[index] = axes_of.get(index, ()) + (axis,)
        if any(c is not None and n == 1 for c, n in zip(choice, mesh_shape)):
            continue  # a size-1 axis shards nothing; keep one strategy per layout
        if splits(instance, axes_of, mesh_shape):
            result.append(make_strategy(instance, axes_of, mesh_shape))
    if instance.exchange is not None and instance.exchange[1] in free:
        result += exchange_variants(instance, result, mesh_shape)
    return result


def tensor_layouts(shape: tuple[int, ...], mesh_shape: tuple[int, ...],
                   allowed: Callable[[int, int], bool] | None = None) -> list[TensorSpec]:
    """Every non-partial layout of a tensor (for parameters, buffers and pins)."""
    labels = tuple(f"d{d}" for d in range(len(shape)))
    instance = OpInstance((), labels, {l: (n,) for l, n in zip(labels, shape)})
    return [s.out_spec for s in strategies(instance, mesh_shape, allowed)]
