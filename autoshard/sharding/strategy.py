"""One way to run an op on the mesh (``OpStrategy``), made from an op instance and an assignment
of mesh axes to its indices (``make_strategy``; the indices and their meaning are rules.py's).

An index assigned mesh axes shards every tensor dim it labels over those axes; a contracted
index (in the operands, not the output) that is sharded leaves the output a partial sum over
its axes; each operand's gradient is partial over the axes the op used that shard none of its
own dims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Sequence

from autoshard.frontend.graph import TensorMeta
from autoshard.sharding.reshard import Step, reshard_steps
from autoshard.sharding.rules_base import Labels, OpInstance
from autoshard.sharding.spec import TensorSpec, cuts, piece_size


@dataclass(frozen=True)
class OpStrategy:
    """One way to run an op: operand/output layouts, gradient layouts, local adjustments."""

    assignment: tuple[tuple[str, tuple[int, ...]], ...]
    in_specs: tuple[TensorSpec | None, ...]
    out_spec: TensorSpec
    grad_specs: tuple[TensorSpec | None, ...]
    degree: int = 1
    scale: Fraction = Fraction(1)
    masked: tuple[int, ...] = ()
    label: str = field(default="", compare=False)
    count_axes: tuple[int, ...] = ()
    exchange_axis: int | None = None


def count_steps(strategy: OpStrategy, itemsize: int, mesh_shape: tuple[int, ...]) -> tuple[Step, ...]:
    """The all-reduces that sum a mean loss's count of valid targets over the axes sharding them (a scalar
    of ``itemsize`` bytes, partial over ``count_axes``, made whole); none when the targets are not sharded."""
    if not strategy.count_axes:
        return ()
    partial = TensorSpec((), frozenset(strategy.count_axes))
    return reshard_steps(partial, TensorSpec(()), (), itemsize, mesh_shape)


def spec_of(labels: Labels, axes_of: dict[str, tuple[int, ...]], partial: frozenset[int] = frozenset()) -> TensorSpec:
    """The layout of a tensor whose dims carry ``labels``, given the indices' mesh axes."""
    return TensorSpec(tuple(axes_of.get(l, ()) if l is not None else () for l in labels), partial)


def divides(instance: OpInstance, axes_of: dict[str, tuple[int, ...]], mesh_shape: tuple[int, ...]) -> bool:
    """True when every index's sizes divide by the product of the mesh axes assigned to it."""
    return not any(n % math.prod(mesh_shape[a] for a in axes) for i, axes in axes_of.items() for n in instance.sizes[i])


def splits(instance: OpInstance, axes_of: dict[str, tuple[int, ...]], mesh_shape: tuple[int, ...]) -> bool:
    """True when the local op on every device's pieces computes its piece of the global op.

    An index is cut as every tensor dim it labels is (``spec.cuts``: ``torch.chunk`` pieces).
    Its sizes must all divide by its shard count, unless all are cut by one axis into pieces of
    one size: an index of one size (every tensor's pieces then line up), or a truncated index
    (``x[:stop]``: the pieces of ``stop`` are those of the whole, the last ones shortened).
    Never unevenly for a mean's index: a mean of unequal pieces is not the mean of the means.
    """
    for index, axes in axes_of.items():
        sizes = instance.sizes[index]
        shards = tuple(mesh_shape[a] for a in axes)
        pieces = math.prod(shards)
        even = not any(n % pieces for n in sizes)
        if even and index not in instance.truncated:
            continue
        if index in instance.mean_indices or not all(cuts(n, shards) for n in sizes):
            return False
        if len({piece_size(n, pieces) for n in sizes}) != 1 or (len(set(sizes)) > 1 and index not in instance.truncated):
            return False
    return True


def make_strategy(instance: OpInstance, axes_of: dict[str, tuple[int, ...]], mesh_shape: tuple[int, ...],
                  exchange_axis: int | None = None) -> OpStrategy:
    """The strategy of one assignment of mesh axes to indices (see the module doc); an
    ``exchange_axis`` shared by the token and expert indices makes no partial sum."""
    partial = frozenset(a for i in instance.contracted for a in axes_of.get(i, ())) - {exchange_axis}
    used = frozenset(a for axes in axes_of.values() for a in axes)
    in_specs = tuple(None if labels is None else spec_of(labels, axes_of) for labels in instance.operands)
    masked = tuple(k for k in instance.additive if partial and instance.operands[k] is not None)
    grads = tuple(None if labels is None else spec_of(labels, axes_of, used - {a for l in labels if l for a in axes_of.get(l, ())}
                                                      - (partial if k in masked else frozenset()))
                  for k, labels in enumerate(instance.operands))
    mean_shards = math.prod(mesh_shape[a] for i in instance.mean_indices for a in axes_of.get(i, ()))
    counted = tuple(sorted(a for i in instance.counted_indices for a in axes_of.get(i, ())))
    return OpStrategy(
        tuple(sorted(axes_of.items())), in_specs, spec_of(instance.output, axes_of, partial), grads,
        math.prod(mesh_shape[a] for a in used), Fraction(1, mean_shards), masked, count_axes=counted,
        exchange_axis=exchange_axis,
    )


def replicated_strategy(operands: Sequence[TensorMeta | None], out_rank: int) -> OpStrategy:
    """The fallback for ops without a rule: every operand gathered, the op run on every device."""
    specs = tuple(None if m is None else TensorSpec.replicated(len(m.shape)) for m in operands)
    return OpStrategy((), specs, TensorSpec.replicated(out_rank), specs)
