"""Turn one tensor layout into another as a list of single-axis collective steps.

The same step list is priced by the cost model and executed by the runtime, so what the
solver charges for an edge is exactly what the executor sends (communication fidelity).

Step semantics on one device's local tensor (``n`` = size of the step's mesh axis):

- ``slice(a, d)``: keep piece ``coord[a]`` of ``n`` along dim d; axis a becomes d's minor axis. Free.
- ``all_gather(a, d)``: concatenate the pieces of the axis-a group along d; a must be d's minor axis.
- ``reduce_scatter(a, d)``: sum the partial values over axis a, keep piece ``coord[a]`` along d.
- ``all_reduce(a)``: sum the partial values over axis a.
- ``all_to_all(a, d -> d2)``: axis a stops sharding d (it was d's minor axis) and becomes d2's minor axis.

A dim the mesh does not divide is cut by one axis into ``torch.chunk`` pieces (``spec.cuts``):
every step on it moves pieces of the largest size, padded (what is priced, ``in_bytes`` of the
largest piece), and each step of a tensor with such a dim carries the tensor's global ``shape``,
from which the runtime pads and trims (``runtime/uneven.py``); steps of evenly cut tensors carry none.

Order: free slices first (they shrink what follows), then reductions of partial sums, then
all-to-all / all-gather for axes that must leave a dim (minor axis first), then the last slices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoshard.sharding.spec import TensorSpec, piece_size

SLICE = "slice"
ALL_GATHER = "all_gather"
REDUCE_SCATTER = "reduce_scatter"
ALL_REDUCE = "all_reduce"
ALL_TO_ALL = "all_to_all"
COLLECTIVES = (ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, ALL_TO_ALL)


@dataclass(frozen=True)
class Step:
    """One single-axis resharding step; ``in_bytes`` is the local tensor size entering it."""

    kind: str
    axis: int
    dim: int | None
    to_dim: int | None
    in_bytes: int
    before: TensorSpec
    after: TensorSpec
    shape: tuple[int, ...] = ()
    """The tensor's global shape where some dim is cut unevenly (module doc), else empty."""

    def sent_bytes(self, axis_size: int) -> int:
        """Bytes each device sends in this step (ring algorithms; 0 for slices)."""
        n, b = axis_size, self.in_bytes
        if self.kind == ALL_GATHER:
            return (n - 1) * b
        if self.kind in (REDUCE_SCATTER, ALL_TO_ALL):
            return (n - 1) * b // n
        if self.kind == ALL_REDUCE:
            return 2 * (n - 1) * b // n
        return 0

    def describe(self) -> str:
        """Short text such as ``all_gather(axis0,dim1)``."""
        where = f"dim{self.dim}" if self.to_dim is None else f"dim{self.dim}->dim{self.to_dim}"
        if self.kind == ALL_REDUCE:
            return f"all_reduce(axis{self.axis})"
        return f"{self.kind}(axis{self.axis},{where})"


def _next_axis(cur: TensorSpec, dst: TensorSpec, dim: int) -> int | None:
    """The axis dst appends next on ``dim`` if cur's axes there are a proper prefix of dst's."""
    have, want = cur.dims[dim], dst.dims[dim]
    if len(have) < len(want) and want[: len(have)] == have:
        return want[len(have)]
    return None


def _replace(cur: TensorSpec, dim: int, axes: tuple[int, ...], partial: frozenset[int] | None = None) -> TensorSpec:
    dims = list(cur.dims)
    dims[dim] = axes
    return TensorSpec(tuple(dims), cur.partial if partial is None else partial)


def reshard_steps(
    src: TensorSpec,
    dst: TensorSpec,
    shape: tuple[int, ...],
    itemsize: int,
    mesh_shape: tuple[int, ...],
) -> tuple[Step, ...]:
    """Steps that turn a tensor laid out as ``src`` into ``dst`` (dst may keep, not add, partial axes)."""
    if src.ndim != dst.ndim or src.ndim != len(shape):
        raise ValueError(f"reshard between specs of different rank: {src} -> {dst} for shape {shape}")
    if not dst.partial <= src.partial:
        raise ValueError("a reshard cannot create partial sums")
    steps: list[Step] = []
    cur = src
    uneven = tuple(shape) if src.uneven_dims(shape, mesh_shape) or dst.uneven_dims(shape, mesh_shape) else ()

    def emit(kind: str, axis: int, dim: int | None, to_dim: int | None, after: TensorSpec) -> None:
        nonlocal cur
        local = list(cur.local_shape(shape, mesh_shape))
        cut = dim if kind == REDUCE_SCATTER else to_dim if kind == ALL_TO_ALL else None
        if cut is not None:  # the dim this step cuts travels padded to equal pieces (module doc)
            local[cut] = mesh_shape[axis] * piece_size(local[cut], mesh_shape[axis])
        size = math.prod(local) * itemsize
        steps.append(Step(kind, axis, dim, to_dim, size, cur, after, uneven))
        cur = after

    def free_slices() -> None:
        progress = True
        while progress:
            progress = False
            for d in range(cur.ndim):
                a = _next_axis(cur, dst, d)
                if a is not None and a not in cur.used_axes:
                    emit(SLICE, a, d, None, _replace(cur, d, cur.dims[d] + (a,)))
                    progress = True

    free_slices()
    for a in sorted(cur.partial - dst.partial):
        target = next((d for d in range(cur.ndim) if _next_axis(cur, dst, d) == a), None)
        if target is not None:
            emit(REDUCE_SCATTER, a, target, None, _replace(cur, target, cur.dims[target] + (a,), cur.partial - {a}))
            free_slices()
    for a in sorted(cur.partial - dst.partial):
        emit(ALL_REDUCE, a, None, None, TensorSpec(cur.dims, cur.partial - {a}))
    free_slices()
    for d in range(cur.ndim):
        while cur.dims[d] != dst.dims[d][: len(cur.dims[d])]:
            a = cur.dims[d][-1]
            removed = _replace(cur, d, cur.dims[d][:-1])
            d2 = next((e for e in range(cur.ndim) if e != d and _next_axis(removed, dst, e) == a), None)
            if d2 is None:
                emit(ALL_GATHER, a, d, None, removed)
            else:
                emit(ALL_TO_ALL, a, d, d2, _replace(removed, d2, removed.dims[d2] + (a,)))
        free_slices()
    free_slices()
    if cur != dst:
        raise AssertionError(f"reshard {src} -> {dst} ended at {cur}")
    return tuple(steps)
