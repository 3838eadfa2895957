"""What every rule kind produces: an :class:`OpInstance` (index labels per dim), plus the helpers
the kinds share (dim attributes, right-aligned broadcasting). Split out of ``rules.py`` so that
``rules_shapes.py`` can define more kinds without importing the dispatcher.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

Labels = tuple[str | None, ...]


class RuleError(ValueError):
    """The node does not fit its rule (unexpected operand count, rank or attribute)."""


@dataclass(frozen=True)
class Rule:
    """One entry of specs/ops.toml."""

    op: str
    kind: str
    options: dict[str, Any]


@dataclass(frozen=True)
class OpInstance:
    """A rule resolved against one node's shapes: index labels per dim and what they mean.

    ``mean_indices`` are reduced by a mean whose denominator is their size (sharding them scales
    the local result); ``counted_indices`` by a mean whose denominator depends on the data (a loss
    divided by its count of targets not equal to ``ignore_index``): sharding them divides the
    local sum by the count all-reduced over the axes that shard them.
    """

    operands: tuple[Labels | None, ...]
    output: Labels
    sizes: dict[str, tuple[int, ...]]
    fixed: frozenset[str] = frozenset()
    additive: tuple[int, ...] = ()
    mean_indices: frozenset[str] = frozenset()
    counted_indices: frozenset[str] = frozenset()
    exchange: tuple[str, str] | None = None
    """(token index, expert index) that may share one mesh axis: the op then exchanges the
    tokens among that axis's devices itself (expert parallelism, ``rules_moe.py``)."""
    truncated: frozenset[str] = frozenset()
    """Indices whose sizes are prefixes of one another (``x[:stop]`` along them): their pieces line
    up only where every size has the same piece size (``strategy.splits``)."""

    @property
    def contracted(self) -> frozenset[str]:
        """Indices summed away: in some operand, not in the output."""
        out = set(self.output)
        return frozenset(i for labels in self.operands if labels for i in labels if i and i not in out)

    @property
    def free(self) -> list[str]:
        """Indices a mesh axis may be assigned to, in first-appearance order."""
        seen: dict[str, None] = {}
        for labels in (*self.operands, self.output):
            for i in labels or ():
                if i is not None and i not in self.fixed:
                    seen.setdefault(i)
        return list(seen)



def dims_of(value: Any, rank: int) -> list[int]:
    """Normalise a dim / dim-list attribute (None = all dims) to non-negative ints."""
    if value is None or value == []:
        return list(range(rank))
    values = value if isinstance(value, (list, tuple)) else [value]
    return [int(v) % rank if rank else 0 for v in values]



def broadcast_labels(shapes: Sequence[tuple[int, ...] | None], out_shape: tuple[int, ...], prefix: str) -> tuple[list[Labels | None], Labels]:
    """Labels for operands broadcast (right-aligned) to ``out_shape``; size-1 dims get None."""
    out = tuple(f"{prefix}{d}" for d in range(len(out_shape)))
    operands: list[Labels | None] = []
    for shape in shapes:
        if shape is None:
            operands.append(None)
            continue
        offset = len(out_shape) - len(shape)
        if offset < 0:
            raise RuleError(f"operand of rank {len(shape)} does not broadcast to {out_shape}")
        operands.append(tuple(
            None if n == 1 and out_shape[offset + k] != 1 else out[offset + k] for k, n in enumerate(shape)
        ))
    return operands, out



def elementwise_instance(rule: Rule, shapes: Sequence[tuple[int, ...] | None], out_shape: tuple[int, ...],
                         attrs: dict, fixed_dims: Sequence[int] = ()) -> OpInstance:
    """Operands broadcast to the output; every dim may be sharded except ``fixed_dims`` of the output."""
    operands, out = broadcast_labels(shapes, out_shape, "d")
    sizes = {label: (n,) for label, n in zip(out, out_shape)}
    for labels, shape in zip(operands, shapes):
        for label, n in zip(labels or (), shape or ()):
            if label is not None:
                sizes[label] = tuple(sorted(set(sizes[label]) | {n}))
    fixed = frozenset(out[d] for d in fixed_dims)
    return OpInstance(tuple(operands), out, sizes, fixed)
