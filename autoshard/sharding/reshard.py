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
from functools import lru_cache

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
        """Bytes each device sends in this step (:func:`ring_bytes`)."""
        return ring_bytes(self.kind, axis_size, self.in_bytes)

    def describe(self) -> str:
        """Short text such as ``all_gather(axis0,dim1)``."""
        where = f"dim{self.dim}" if self.to_dim is None else f"dim{self.dim}->dim{self.to_dim}"
        if self.kind == ALL_REDUCE:
            return f"all_reduce(axis{self.axis})"
        return f"{self.kind}(axis{self.axis},{where})"


def ring_bytes(kind: str, axis_size: int, in_bytes: int) -> int:
    """Bytes each device sends in a step of ``kind`` over an axis of ``axis_size`` devices that
    enters with ``in_bytes`` local bytes (ring algorithms; 0 for slices)."""
    n, b = axis_size, in_bytes
    if kind == ALL_GATHER:
        return (n - 1) * b
    if kind in (REDUCE_SCATTER, ALL_TO_ALL):
        return (n - 1) * b // n
    if kind == ALL_REDUCE:
        return 2 * (n - 1) * b // n
    return 0


@lru_cache(maxsize=1 << 16)
def _layout(dims: tuple[tuple[int, ...], ...], partial: frozenset[int]) -> TensorSpec:
    """``TensorSpec(dims, partial)``, one object per layout: the routes of a problem pass through
    few layouts, and equal specs that are one object compare at once."""
    return TensorSpec(dims, partial)


Move = tuple[str, int, int | None, int | None, TensorSpec, TensorSpec]
"""A step without its bytes: (kind, axis, dim, to_dim, before, after)."""


def reshard_moves(src: TensorSpec, dst: TensorSpec) -> tuple[Move, ...]:
    """The steps turning ``src`` into ``dst`` in the order of the module doc, without their bytes:
    which steps a reshard takes reads only the two layouts, never the tensor's shape or the mesh."""
    if not dst.partial <= src.partial:
        raise ValueError("a reshard cannot create partial sums")
    want, dims, partial = dst.dims, list(src.dims), src.partial
    used = {a for axes in dims for a in axes} | partial
    moves: list[Move] = []
    cur = src

    def emit(kind: str, axis: int, dim: int | None, to_dim: int | None) -> None:
        nonlocal cur
        after = _layout(tuple(dims), partial)
        moves.append((kind, axis, dim, to_dim, cur, after))
        cur = after

    def next_axis(d: int) -> int | None:
        """The axis ``dst`` appends next on dim ``d`` where the axes there are a proper prefix of its."""
        have, wanted = dims[d], want[d]
        return wanted[len(have)] if len(have) < len(wanted) and wanted[: len(have)] == have else None

    def free_slices() -> None:
        progress = True
        while progress:
            progress = False
            for d in range(len(dims)):
                a = next_axis(d)
                if a is not None and a not in used:
                    dims[d] += (a,)
                    used.add(a)
                    emit(SLICE, a, d, None)
                    progress = True

    free_slices()
    for a in sorted(partial - dst.partial):
        target = next((d for d in range(len(dims)) if next_axis(d) == a), None)
        if target is not None:
            dims[target] += (a,)
            partial = partial - {a}
            emit(REDUCE_SCATTER, a, target, None)
            free_slices()
    for a in sorted(partial - dst.partial):
        partial = partial - {a}
        used.discard(a)
        emit(ALL_REDUCE, a, None, None)
    free_slices()
    for d in range(len(dims)):
        while dims[d] != want[d][: len(dims[d])]:
            a = dims[d][-1]
            dims[d] = dims[d][:-1]
            d2 = next((e for e in range(len(dims)) if e != d and next_axis(e) == a), None)
            if d2 is None:
                used.discard(a)
                emit(ALL_GATHER, a, d, None)
            else:
                dims[d2] += (a,)
                emit(ALL_TO_ALL, a, d, d2)
        free_slices()
    free_slices()
    if cur != dst:
        raise AssertionError(f"reshard {src} -> {dst} ended at {cur}")
    return tuple(moves)


@dataclass(frozen=True)
class _Route:
    """:func:`reshard_moves` on one mesh: per move what its bytes read besides the shape and
    itemsize (``pieces``: the pieces per dim entering it, the dim it cuts, a reduce-scatter's or
    all-to-all's target, and that axis's size, else None and 0: :func:`_elements`'s arguments),
    and the pieces per dim of both ends."""

    moves: tuple[Move, ...]
    pieces: tuple[tuple[tuple[int, ...], int | None, int], ...]
    ends: tuple[tuple[int, ...], tuple[int, ...]]


@lru_cache(maxsize=1 << 14)
def _factors(spec: TensorSpec, mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    """How many pieces ``spec`` cuts each dim into (remembered: routes pass through few layouts)."""
    return tuple(spec.shard_factor(d, mesh_shape) for d in range(spec.ndim))


@lru_cache(maxsize=1 << 17)
def _route(src: TensorSpec, dst: TensorSpec, mesh_shape: tuple[int, ...]) -> _Route:
    """:class:`_Route` of ``src`` -> ``dst``, remembered: the edges of a problem reshard the same
    pair of layouts for tensors of many shapes and itemsizes."""
    moves = reshard_moves(src, dst)
    pieces = []
    for kind, axis, dim, to_dim, before, _ in moves:
        cut = dim if kind == REDUCE_SCATTER else to_dim if kind == ALL_TO_ALL else None
        pieces.append((_factors(before, mesh_shape), cut, 0 if cut is None else mesh_shape[axis]))
    return _Route(moves, tuple(pieces), (_factors(src, mesh_shape), _factors(dst, mesh_shape)))


def reshard_steps(
    src: TensorSpec,
    dst: TensorSpec,
    shape: tuple[int, ...],
    itemsize: int,
    mesh_shape: tuple[int, ...],
) -> tuple[Step, ...]:
    """Steps that turn a tensor laid out as ``src`` into ``dst`` (dst may keep, not add, partial axes):
    :func:`reshard_moves`, each with the bytes of the largest local piece entering it."""
    shape = tuple(shape)
    route = _checked_route(src, dst, shape, mesh_shape)
    uneven = shape if _uneven(shape, route.ends) else ()
    return tuple(Step(kind, axis, dim, to_dim, _elements(shape, *piece) * itemsize, before, after, uneven)
                 for (kind, axis, dim, to_dim, before, after), piece in zip(route.moves, route.pieces))


Traffic = tuple[tuple[str, int, int], ...]
"""The collectives of a reshard as (kind, axis, in_bytes), in order: all that pricing reads."""


def reshard_traffic(src: TensorSpec, dst: TensorSpec, shape: tuple[int, ...], itemsize: int,
                    mesh_shape: tuple[int, ...]) -> Traffic:
    """The collectives of :func:`reshard_steps` (its slices are free) with their bytes, computed
    the same way without building the steps: a problem prices ~10^5 reshards and executes none."""
    shape = tuple(shape)
    route = _checked_route(src, dst, shape, mesh_shape)
    return tuple((move[0], move[1], _elements(shape, *piece) * itemsize)
                 for move, piece in zip(route.moves, route.pieces) if move[0] != SLICE)


def _checked_route(src: TensorSpec, dst: TensorSpec, shape: tuple[int, ...], mesh_shape: tuple[int, ...]) -> _Route:
    """:func:`_route` of two layouts of a tensor of ``shape``, refusing layouts of another rank."""
    if len(src.dims) != len(dst.dims) or len(src.dims) != len(shape):
        raise ValueError(f"reshard between specs of different rank: {src} -> {dst} for shape {shape}")
    return _route(src, dst, tuple(mesh_shape))


@lru_cache(maxsize=1 << 14)
def _uneven(shape: tuple[int, ...], ends: tuple[tuple[int, ...], tuple[int, ...]]) -> bool:
    """Whether either end cuts some dim of ``shape`` unevenly (remembered: a problem's edges
    reshard tensors of few shapes between layouts of few cuts)."""
    return any(n % f for pieces in ends for n, f in zip(shape, pieces))


@lru_cache(maxsize=1 << 16)
def _elements(shape: tuple[int, ...], factors: tuple[int, ...], cut: int | None, cut_axis_size: int) -> int:
    """Elements of the largest local piece entering a step that finds each dim of ``shape`` in
    ``factors`` pieces; the dim the step ``cut``s travels padded to ``cut_axis_size`` equal pieces
    (module doc). Remembered: few shapes meet few cuts, while a problem prices ~10^5 reshards."""
    local = [piece_size(n, f) for n, f in zip(shape, factors)]
    if cut is not None:
        local[cut] = cut_axis_size * piece_size(local[cut], cut_axis_size)
    return math.prod(local)
