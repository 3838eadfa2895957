"""Rule kinds for ops whose output shape is its input's reshaped by attributes (views, permutations,
indexing, stacking, repeating, padding, gathering, writing into a slice), and einsum's signature
derived from its equation.

Each kind labels the dims that pass through the op whole and leaves every dim the op touches
unlabelled (None: never sharded), since a device's piece of a touched dim is not the piece the
same op computes on the global tensor. The op then runs unchanged on local pieces: no attribute
needs a local value.
"""

from __future__ import annotations

import string
from typing import Any, Sequence

from autoshard.sharding.rules_base import OpInstance, Rule, RuleError, dims_of

Shapes = Sequence[tuple[int, ...] | None]
_ELLIPSIS_GROUP = "ell"
"""Name of the variadic group an einsum ``...`` becomes (its dims are ``ell0``, ``ell1`` ...)."""


def einsum_signature(equation: str) -> str:
    """The rule signature an einsum equation is: ``"bij,jk->bik"`` -> ``"b i j, j k -> b i k"``.

    ``...`` becomes a variadic group (aligned right, broadcast like einsum's); an implicit output
    is the indices used once, in alphabetical order. Repeated indices within one operand
    (diagonals, traces) have no signature form and raise RuleError.
    """
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if not arrow:
        letters = [c for c in lhs if c.isalpha()]
        rhs = ("..." if "..." in lhs else "") + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))

    def tokens(term: str) -> list[str]:
        body = term.replace("...", "")
        if any(c not in string.ascii_letters for c in body) or len(set(body)) != len(body) or term.count("...") > 1:
            raise RuleError(f"einsum term {term!r} has repeated or unknown indices")
        head, _, tail = term.partition("...")
        return [*head, *([f"{_ELLIPSIS_GROUP}*"] if "..." in term else []), *tail]

    return ", ".join(" ".join(tokens(t)) for t in terms) + " -> " + " ".join(tokens(rhs))


def _labels(shape: tuple[int, ...]) -> tuple[str, ...]:
    return tuple(f"d{d}" for d in range(len(shape)))


def _sizes(labels: Sequence[str | None], *shapes: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Every size each label takes in ``shapes`` (tensors labelled alike, dim by dim)."""
    sizes: dict[str, set[int]] = {}
    for shape in shapes:
        for label, n in zip(labels, shape):
            if label is not None:
                sizes.setdefault(label, set()).add(n)
    return {label: tuple(sorted(ns)) for label, ns in sizes.items()}


def index_instance(rule: Rule, shapes: Shapes, out_shape: tuple[int, ...], attrs: dict[str, Any]) -> OpInstance:
    """``x[:, :16, None, ..., 0]`` (attribute ``index``: ints, None, "..." and [start, stop, step]).

    A dim sliced whole (no start, stop or step that cuts it) keeps its label; a dim sliced or
    indexed by an int, and a new size-1 dim, are unlabelled.
    """
    shape = shapes[0]
    items = list(attrs["index"])
    if items.count("...") > 1:
        raise RuleError("an index with two ellipses")
    whole = [None, None, None]
    missing = len(shape) - sum(1 for item in items if item is not None and item != "...")
    if missing < 0:
        raise RuleError(f"index {items} has more entries than the tensor's {len(shape)} dims")
    at = items.index("...") if "..." in items else len(items)
    items[at: at + 1] = [whole] * missing
    in_labels: list[str | None] = []
    out_labels: list[str | None] = []
    for item in items:
        if item is None:
            out_labels.append(None)
            continue
        d = len(in_labels)
        if isinstance(item, int):
            in_labels.append(None)
            continue
        start, stop, step = item
        untouched = start in (None, 0) and step in (None, 1) and (stop is None or stop >= shape[d])
        in_labels.append(f"d{d}" if untouched else None)
        out_labels.append(in_labels[-1])
    if len(out_labels) != len(out_shape):
        raise RuleError(f"index {attrs['index']} of shape {shape} does not give rank {len(out_shape)}")
    return OpInstance((tuple(in_labels),), tuple(out_labels), _sizes(in_labels, shape))


def stack_instance(rule: Rule, shapes: Shapes, out_shape: tuple[int, ...], attrs: dict[str, Any]) -> OpInstance:
    """``torch.stack(tensors, dim)``: the operands' dims all pass through; the new dim is unlabelled."""
    dim = dims_of(attrs.get("dim", 0), len(out_shape))[0]
    labels = _labels(out_shape[:-1])
    out = (*labels[:dim], None, *labels[dim:])
    operands = tuple(labels if s is not None else None for s in shapes)
    if any(s is not None and len(s) != len(labels) for s in shapes):
        raise RuleError(f"stack operands of ranks {[len(s) for s in shapes if s]} into rank {len(out_shape)}")
    return OpInstance(operands, out, _sizes(labels, *[s for s in shapes if s is not None]))


def repeat_instance(rule: Rule, shapes: Shapes, out_shape: tuple[int, ...], attrs: dict[str, Any]) -> OpInstance:
    """``x.repeat(reps)`` / ``x.tile(reps)``: only dims repeated once pass through; new leading dims
    and repeated dims are unlabelled (a local piece repeated is not a piece of the global repeat)."""
    shape = shapes[0]
    reps = list(attrs[rule.options["repeats_attr"]])
    reps = [1] * (len(shape) - len(reps)) + reps  # tile pads short repeat lists on the left
    offset = len(reps) - len(shape)
    if offset < 0 or len(reps) != len(out_shape):
        raise RuleError(f"repeats {reps} do not fit shape {shape} -> {out_shape}")
    labels = tuple(f"d{d}" if reps[offset + d] == 1 else None for d in range(len(shape)))
    out = (None,) * offset + labels
    return OpInstance((labels,), out, _sizes(labels, shape))


def pad_instance(rule: Rule, shapes: Shapes, out_shape: tuple[int, ...], attrs: dict[str, Any]) -> OpInstance:
    """``F.pad(x, pad)``: ``pad`` holds (before, after) pairs from the last dim backwards; every dim
    it pads or crops is unlabelled, the others pass through (any mode: only padded dims are read)."""
    shape = shapes[0]
    pad = list(attrs[rule.options.get("pad_attr", "pad")])
    padded = {len(shape) - 1 - k // 2 for k, amount in enumerate(pad) if amount}
    if len(shape) != len(out_shape) or len(pad) > 2 * len(shape):
        raise RuleError(f"pad {pad} does not fit shape {shape}")
    labels = tuple(None if d in padded else f"d{d}" for d in range(len(shape)))
    return OpInstance((labels, *[None] * (len(shapes) - 1)), labels, _sizes(labels, shape))


def gather_instance(rule: Rule, shapes: Shapes, out_shape: tuple[int, ...], attrs: dict[str, Any]) -> OpInstance:
    """``torch.gather(x, dim, index)``: input and index pieces line up on the dims other than
    ``dim`` where both have the same size; those pass through, the rest are unlabelled."""
    shape, index = shapes[0], shapes[1]
    if len(shape) != len(index):
        raise RuleError(f"gather index of rank {len(index)} for an input of rank {len(shape)}")
    dim = dims_of(attrs.get("dim", 0), len(shape))[0]
    labels = tuple(f"d{d}" if d != dim and shape[d] == index[d] else None for d in range(len(shape)))
    return OpInstance((labels, labels), labels, _sizes(labels, shape))


def index_select_instance(rule: Rule, shapes: Shapes, out_shape: tuple[int, ...],
                          attrs: dict[str, Any]) -> OpInstance:
    """``torch.index_select(x, dim, index)``: every dim but ``dim`` passes through; the 1-d index is whole."""
    shape = shapes[0]
    dim = dims_of(attrs.get("dim", 0), len(shape))[0]
    labels = tuple(None if d == dim else f"d{d}" for d in range(len(shape)))
    index = tuple(None for _ in shapes[1] or ())
    return OpInstance((labels, index), labels, _sizes(labels, shape))


def scatter_slice_instance(rule: Rule, shapes: Shapes, out_shape: tuple[int, ...],
                           attrs: dict[str, Any]) -> OpInstance:
    """``slice_scatter(x, src, dim, ...)`` / ``select_scatter(x, src, dim, index)`` (torch.export's
    ``x[..., :n] = src``): the output is ``x`` with ``src`` written into a slice of ``dim`` (``src``
    lacks ``dim`` for a select); every other dim passes through, ``dim`` is whole."""
    shape, src = shapes[0], shapes[1]
    dim = dims_of(attrs.get("dim", 0), len(shape))[0]
    labels = tuple(None if d == dim else f"d{d}" for d in range(len(shape)))
    src_labels = labels if len(src) == len(shape) else labels[:dim] + labels[dim + 1:]
    if len(src) not in (len(shape), len(shape) - 1) or len(out_shape) != len(shape):
        raise RuleError(f"cannot write a tensor of shape {src} into shape {shape} along dim {dim}")
    return OpInstance((labels, src_labels), labels, _sizes(labels, shape))


def view_instance(rule: Rule, shapes: Shapes, out_shape: tuple[int, ...], attrs: dict[str, Any]) -> OpInstance:
    """Reshapes: in each group of dims with equal products, only the outermost dims correspond."""
    in_shape = shapes[0]
    in_labels: list[str | None] = [None] * len(in_shape)
    out_labels: list[str | None] = [None] * len(out_shape)
    sizes: dict[str, tuple[int, ...]] = {}
    i = j = 0
    group = 0
    while i < len(in_shape) or j < len(out_shape):
        while i < len(in_shape) and in_shape[i] == 1:
            i += 1
        while j < len(out_shape) and out_shape[j] == 1:
            j += 1
        if i >= len(in_shape) or j >= len(out_shape):
            break
        label = f"g{group}"
        in_labels[i], out_labels[j] = label, label
        sizes[label] = tuple(sorted({in_shape[i], out_shape[j]}))
        p, q = in_shape[i], out_shape[j]
        i, j = i + 1, j + 1
        while p != q:
            if p < q:
                p *= in_shape[i]
                i += 1
            else:
                q *= out_shape[j]
                j += 1
        group += 1
    return OpInstance((tuple(in_labels), *[None] * (len(shapes) - 1)), tuple(out_labels), sizes)


def permute_instance(rule: Rule, shapes: Shapes, out_shape: tuple[int, ...], attrs: dict[str, Any]) -> OpInstance:
    """Permutations of dims (permute, transpose, swapaxes, movedim, .T, .mT): every dim passes through."""
    rank = len(shapes[0])
    perm = list(range(rank))
    if rule.op == "permute":
        perm = dims_of(attrs["dims"], rank)
    elif rule.op == "numpy_T":
        perm = list(reversed(perm))
    elif rule.op in ("movedim", "moveaxis"):
        perm = _moved(rank, dims_of(attrs["source"], rank), dims_of(attrs["destination"], rank))
    elif rule.op == "mT":
        perm[-2:] = perm[:-3:-1]
    elif rank >= 2:
        first, second = ("axis0", "axis1") if rule.op == "swapaxes" else ("dim0", "dim1")
        a, b = dims_of(attrs.get(first, 0), rank)[0], dims_of(attrs.get(second, 1), rank)[0]
        perm[a], perm[b] = perm[b], perm[a]
    labels = tuple(f"d{d}" for d in range(rank))
    return OpInstance((labels,), tuple(labels[p] for p in perm), {l: (n,) for l, n in zip(labels, shapes[0])})


def _moved(rank: int, source: list[int], destination: list[int]) -> list[int]:
    """The permutation ``movedim(source, destination)`` applies: output dim -> input dim."""
    perm: list[int | None] = [None] * rank
    for s, d in zip(source, destination):
        perm[d] = s
    rest = iter(d for d in range(rank) if d not in source)
    return [next(rest) if p is None else p for p in perm]


SHAPE_KINDS = {
    "view": view_instance,
    "permute": permute_instance,
    "index": index_instance,
    "stack": stack_instance,
    "repeat": repeat_instance,
    "pad": pad_instance,
    "gather": gather_instance,
    "index_select": index_select_instance,
    "scatter_slice": scatter_slice_instance,
}
"""Kind name (``kind =`` in specs/ops.toml) -> instantiation function."""
