"""Rule kinds for the ops mixture-of-experts layers trace to, and expert parallelism.

**Expert parallelism.** A rule may name an ``exchange`` pair (token index, expert index), as
``moe_experts`` does (specs/ops.toml). Besides its signature strategies (tokens split: every
device runs every expert on its own tokens; experts split: every device runs its own experts on
every token and the output is a partial sum over that axis), the pair may then share one mesh
axis a: tokens split over a *and* experts split over a. The op sends each token-expert pair's
row to the device holding its expert and the result back (two all-to-alls, ``exchange.py``),
so over a the output is whole, not partial, and each device's expert weights get their whole
gradient from the pairs it received. :func:`exchange_variants` adds these strategies.

**Kinds** (each op's local computation is the op itself on local pieces):

- ``grouped_mm``: ``torch._grouped_mm`` and transformers' fallback. Rows grouped by ``offs`` are
  never split (a piece of the rows is not the rows of a piece of the groups); the contracted
  dim gives partial sums and the output features split, as for a matmul; a 3-D by 3-D grouped
  matmul is a batched matmul over its groups.
- ``histogram``: ``histc`` / ``bincount`` count values: the counts of a split input are partial
  sums. Not when the bins depend on the data (``histc`` with min = max, ``bincount`` whose length
  is not its ``minlength``).
- ``index_tensor``: ``x[idx]`` (index tensors broadcast together, any positions): the index dims
  carry to the output, x's other dims pass through, the indexed dims are whole; x's gradient is a
  partial sum over the axes splitting the index (a scatter-add of the rows each device read).
- ``index_put`` / ``scatter_add`` (``index_put`` with ``accumulate``, ``index_add``,
  ``scatter_add``): the written rows may be split, making the output a partial sum to which the
  target is added once; without accumulation the written rows stay whole (a later write wins).
- ``one_hot``: the input's dims pass through; the class dim is whole.
"""

from __future__ import annotations

from typing import Any, Sequence

from autoshard.sharding.rules_base import OpInstance, Rule, RuleError, broadcast_labels, dims_of
from autoshard.sharding.strategy import OpStrategy, divides, make_strategy

Shapes = Sequence[tuple[int, ...] | None]


def exchange_variants(instance: OpInstance, base: Sequence[OpStrategy], mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """For each base strategy and each mesh axis of its token index not already the expert index's,
    the strategy whose expert index takes that axis too (as its last, minor axis), exchanging
    tokens over it; kept when the experts divide."""
    tokens, experts = instance.exchange
    variants = []
    for strategy in base:
        axes_of = dict(strategy.assignment)
        for axis in axes_of.get(tokens, ()):
            if axis in axes_of.get(experts, ()):
                continue
            shared = {**axes_of, experts: axes_of.get(experts, ()) + (axis,)}
            if divides(instance, shared, mesh_shape):
                variants.append(make_strategy(instance, shared, mesh_shape, exchange_axis=axis))
    return variants


def _labels(shape: tuple[int, ...], prefix: str = "d") -> tuple[str, ...]:
    return tuple(f"{prefix}{d}" for d in range(len(shape)))


def _sizes(*pairs: tuple[Sequence[str | None] | None, tuple[int, ...] | None]) -> dict[str, tuple[int, ...]]:
    sizes: dict[str, set[int]] = {}
    for labels, shape in pairs:
        for label, n in zip(labels or (), shape or ()):
            if label is not None:
                sizes.setdefault(label, set()).add(n)
    return {label: tuple(sorted(ns)) for label, ns in sizes.items()}


def grouped_mm_instance(rule: Rule, shapes: Shapes, out_shape: tuple[int, ...], attrs: dict[str, Any]) -> OpInstance:
    """``_grouped_mm(a, b, offs)``: 2-D x 3-D (rows grouped), 3-D x 3-D (batched) or 2-D x 2-D (k grouped)."""
    a, b = shapes[0], shapes[1]
    offs = shapes[2] if len(shapes) > 2 else None
    extra = [None] * (len(shapes) - 3)
    if len(a) == 2 and len(b) == 3 and offs is not None:  # rows s of group g meet b[g]
        operands = [("s", "k"), ("g", "k", "n"), ("g",)]
        out, fixed = ("s", "n"), {"s", "g"}
    elif len(a) == 3 and len(b) == 3 and offs is None:
        operands, out, fixed = [("g", "m", "k"), ("g", "k", "n")], ("g", "m", "n"), set()
    elif len(a) == 2 and len(b) == 2 and offs is not None:  # k grouped: one [m, n] block per group
        operands = [("m", "k"), ("k", "n"), ("g",)]
        out, fixed = ("g", "m", "n"), {"k", "g"}
    else:
        raise RuleError(f"{rule.op}: no rule for grouped operands of ranks {len(a)} and {len(b)}")
    operands += [None] * (len(shapes) - len(operands))  # optional bias / scales: kept whole (replicated)
    if extra and any(s is not None for s in shapes[3:]):
        raise RuleError(f"{rule.op}: a bias or scale operand has no rule")
    sizes = _sizes(*zip(operands, shapes), (out, out_shape))
    return OpInstance(tuple(operands), out, sizes, frozenset(fixed))


def histogram_instance(rule: Rule, shapes: Shapes, out_shape: tuple[int, ...], attrs: dict[str, Any]) -> OpInstance:
    """``histc(x, bins, min, max)`` / ``bincount(x, weights, minlength)``: counts over a split input add up."""
    shape = shapes[0]
    labels = _labels(shape)
    data_bins = attrs.get("min", 0) == attrs.get("max", 0) if rule.op == "histc" else \
        attrs.get("minlength", 0) != out_shape[0]
    weights = [labels if s is not None and tuple(s) == tuple(shape) else None for s in shapes[1:]]
    fixed = frozenset(labels) if data_bins else frozenset()
    return OpInstance((labels, *weights), (None,), _sizes((labels, shape)), fixed)


def index_tensor_instance(rule: Rule, shapes: Shapes, out_shape: tuple[int, ...], attrs: dict[str, Any]) -> OpInstance:
    """``x[..., idx, ...]``: ``indices`` holds, per dim of x, the operand indexing it or None.

    The index tensors broadcast together to B; the output is B in place of the indexed dims when
    they are adjacent, else B first (NumPy's rule), followed or surrounded by x's other dims.
    """
    shape = shapes[0]
    indices = list(attrs.get("indices") or [])
    tensors = [(p, k) for p, k in enumerate(indices) if k is not None]
    if not tensors:
        raise RuleError(f"{rule.op}: no index tensor")
    index_shapes = [shapes[k] for _, k in tensors]
    rank = max(len(s) for s in index_shapes)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in index_shapes]
    broadcast = tuple(max(dims) for dims in zip(*padded))
    index_labels, b = broadcast_labels(index_shapes, broadcast, "i")
    positions = [p for p, _ in tensors]
    x = tuple(None if d in positions else f"x{d}" for d in range(len(shape)))
    rest = [label for label in x[len(indices):]]
    kept = [x[d] for d in range(len(indices)) if d not in positions]
    if positions == list(range(positions[0], positions[-1] + 1)):
        out = (*x[:positions[0]], *b, *x[positions[-1] + 1:])
        expected = (*shape[:positions[0]], *broadcast, *shape[positions[-1] + 1:])
    else:
        out = (*b, *kept, *rest)
        expected = (*broadcast, *[shape[d] for d in range(len(shape)) if d not in positions])
    if tuple(out_shape) != expected:
        raise RuleError(f"{rule.op}: output {out_shape} is not x[indices] of {shape} by {index_shapes} (a mask?)")
    operands: list[tuple[str | None, ...] | None] = [None] * len(shapes)
    operands[0] = x
    for (_, k), labels in zip(tensors, index_labels):
        operands[k] = labels
    return OpInstance(tuple(operands), out, _sizes((x, shape), *zip(index_labels, index_shapes), (out, out_shape)))


def index_put_instance(rule: Rule, shapes: Shapes, out_shape: tuple[int, ...], attrs: dict[str, Any]) -> OpInstance:
    """``x[idx] = v`` / ``x[idx] += v`` (``accumulate``) with one index tensor on dim 0."""
    indices = list(attrs.get("indices") or [])
    if len(indices) != 1 or indices[0] is None:
        raise RuleError(f"{rule.op}: only a write through one index tensor on dim 0 has a rule")
    operand = indices[0]
    values = next(k for k in range(1, len(shapes)) if k != operand and shapes[k] is not None)
    return _scatter(shapes[0], shapes[operand], shapes[values], operand, values, len(shapes), 0,
                    bool(attrs.get("accumulate", False)), rule)


def scatter_add_instance(rule: Rule, shapes: Shapes, out_shape: tuple[int, ...], attrs: dict[str, Any]) -> OpInstance:
    """``index_add(x, dim, idx, src)`` and ``scatter_add(x, dim, idx, src)``: rows of src added at idx."""
    dim = dims_of(attrs.get("dim", 0), len(shapes[0]))[0]
    return _scatter(shapes[0], shapes[1], shapes[2], 1, 2, len(shapes), dim, True, rule)


def _scatter(target: tuple[int, ...], index: tuple[int, ...], values: tuple[int, ...], index_operand: int,
             values_operand: int, count: int, dim: int, accumulate: bool, rule: Rule) -> OpInstance:
    """Rows of ``values`` written at ``index`` along ``dim`` of ``target``: the other dims pass through where
    the sizes agree; the written rows split only when added (a partial sum, the target added once)."""
    rank = len(target)
    x = tuple(None if d == dim else f"x{d}" for d in range(rank))
    row = "m" if accumulate else None
    if len(index) == 1 and dim == 0:  # index_put / index_add on dim 0: values = index rows x the other dims
        v_labels, _ = broadcast_labels([values], (*index, *target[1:]), "")
        v = tuple(None if l is None else (row, *x[1:])[int(l)] for l in v_labels[0])
        idx: tuple[str | None, ...] = (row,)
    elif len(index) == 1 and len(values) == rank:  # index_add along another dim: values keep the layout
        v, idx = tuple(row if d == dim else x[d] for d in range(rank)), (row,)
    elif len(index) == len(values) == rank:  # scatter_add: index and src align with the target dim by dim
        v = tuple(row if d == dim else (x[d] if index[d] == values[d] == target[d] else None) for d in range(rank))
        idx = v
    else:
        raise RuleError(f"{rule.op}: index of shape {index} and values of shape {values} for a target {target}")
    operands: list[tuple[str | None, ...] | None] = [None] * count
    operands[0], operands[index_operand], operands[values_operand] = x, idx, v
    sizes = _sizes((x, target), (idx, index), (v, values))
    return OpInstance(tuple(operands), x, sizes, frozenset(), (0,) if accumulate else ())


def one_hot_instance(rule: Rule, shapes: Shapes, out_shape: tuple[int, ...], attrs: dict[str, Any]) -> OpInstance:
    """``one_hot(x, num_classes)``: x's dims pass through, the class dim is whole."""
    labels = _labels(shapes[0])
    return OpInstance((labels,), (*labels, None), _sizes((labels, shapes[0])))


MOE_KINDS = {
    "grouped_mm": grouped_mm_instance,
    "histogram": histogram_instance,
    "index_tensor": index_tensor_instance,
    "index_put": index_put_instance,
    "scatter_add": scatter_add_instance,
    "one_hot": one_hot_instance,
}
"""Kind name (``kind =`` in specs/ops.toml) -> instantiation function."""
