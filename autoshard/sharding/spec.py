"""How one tensor is laid out on the mesh: per tensor dim, the mesh axes sharding it; plus partial sums.

Text form (the names used in tables, plans and schedules): one letter per tensor dim, ``R``
(replicated) or ``S`` followed by the mesh axes that shard it, major first; then optionally ``P``
and the mesh axes over which the local values are partial sums. On a 1-D mesh the axis digits
are dropped: ``RS``, ``SR``, ``RRP``. On N-D meshes: ``S0R``, ``S01R``, ``RS1``, ``S0RP1``.

A dim of size ``n`` cut into ``p`` pieces is cut as ``torch.chunk`` and DTensor's ``Shard`` cut it:
pieces of ``ceil(n / p)`` elements, the last one smaller (:func:`piece_range`). A dim that ``p``
does not divide may be cut by one mesh axis only, and only where every piece is nonempty
(:func:`cuts`): a dim cut by two axes in turn would not give the pieces of one cut by their
product, and an empty piece holds a device for nothing. Sizes, bytes and flops of a device's
piece are those of the largest piece (:meth:`TensorSpec.local_shape`), the device that sets the pace.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from autoshard.errors import AutoshardError


def piece_size(n: int, pieces: int) -> int:
    """Elements of the largest piece of a dim of size ``n`` cut into ``pieces`` (``torch.chunk``)."""
    return -(-n // pieces)


def piece_range(n: int, pieces: int, index: int) -> tuple[int, int]:
    """(start, length) of piece ``index`` of a dim of size ``n`` cut into ``pieces`` as ``torch.chunk``
    cuts it: ``ceil(n / pieces)`` elements each, the last ones shorter or empty."""
    size = piece_size(n, pieces)
    start = min(index * size, n)
    return start, min(size, n - start)


def cuts(n: int, axis_sizes: tuple[int, ...]) -> bool:
    """True when a dim of size ``n`` may be cut by mesh axes of these sizes (module doc): they
    divide it, or one axis cuts it into nonempty pieces."""
    pieces = math.prod(axis_sizes)
    if n % pieces == 0:
        return True
    return len(axis_sizes) == 1 and n > (pieces - 1) * piece_size(n, pieces)


@dataclass(frozen=True, order=True)
class TensorSpec:
    """Placement of a tensor: ``dims[d]`` = mesh axes sharding dim d (major to minor); ``partial`` axes."""

    dims: tuple[tuple[int, ...], ...]
    partial: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        used = [a for axes in self.dims for a in axes] + sorted(self.partial)
        if len(used) != len(set(used)):
            raise ValueError(f"mesh axis used twice in spec {self.dims} partial={sorted(self.partial)}")
        object.__setattr__(self, "_hash", hash((self.dims, self.partial)))

    def __hash__(self) -> int:
        """The fields' hash, computed once: specs key the edge pricing's tables, millions of
        lookups on a 3-D mesh, and the generated hash rebuilds and hashes the tuple each time."""
        return self._hash  # type: ignore[attr-defined, no-any-return]

    @staticmethod
    def replicated(ndim: int) -> "TensorSpec":
        """The fully replicated spec of a rank-``ndim`` tensor."""
        return TensorSpec(((),) * ndim)

    @property
    def ndim(self) -> int:
        """Tensor rank."""
        return len(self.dims)

    @property
    def used_axes(self) -> frozenset[int]:
        """Mesh axes that shard a dim or hold partial sums."""
        return frozenset(a for axes in self.dims for a in axes) | self.partial

    @property
    def is_replicated(self) -> bool:
        """True when every device holds the whole tensor."""
        return not self.partial and all(not axes for axes in self.dims)

    def axis_dim(self, axis: int) -> int | None:
        """The tensor dim sharded by ``axis``, or None."""
        for d, axes in enumerate(self.dims):
            if axis in axes:
                return d
        return None

    def shard_factor(self, dim: int, mesh_shape: tuple[int, ...]) -> int:
        """How many pieces dim ``dim`` is cut into."""
        return math.prod(mesh_shape[a] for a in self.dims[dim])

    def local_shape(self, shape: tuple[int, ...], mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the largest device's piece (module doc; see :meth:`fits`)."""
        return tuple(piece_size(n, self.shard_factor(d, mesh_shape)) for d, n in enumerate(shape))

    def piece_shape(self, shape: tuple[int, ...], coords: tuple[int, ...], mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the piece the device at ``coords`` holds (smaller than :meth:`local_shape` on uneven dims)."""
        return tuple(piece_range(n, self.shard_factor(d, mesh_shape), self.chunk_index(d, coords, mesh_shape))[1]
                     for d, n in enumerate(shape))

    def fits(self, shape: tuple[int, ...], mesh_shape: tuple[int, ...]) -> bool:
        """True when every sharded dim may be cut as the spec cuts it (:func:`cuts`)."""
        return len(shape) == self.ndim and all(
            cuts(n, tuple(mesh_shape[a] for a in axes)) for n, axes in zip(shape, self.dims)
        )

    def uneven_dims(self, shape: tuple[int, ...], mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The dims whose pieces differ in size (their shard factor does not divide them)."""
        return tuple(d for d, n in enumerate(shape) if n % self.shard_factor(d, mesh_shape))

    def chunk_index(self, dim: int, coords: tuple[int, ...], mesh_shape: tuple[int, ...]) -> int:
        """Which piece of dim ``dim`` the device at ``coords`` holds (major axis first)."""
        index = 0
        for a in self.dims[dim]:
            index = index * mesh_shape[a] + coords[a]
        return index

    def without_partial(self) -> "TensorSpec":
        """The same layout with partial sums treated as already reduced (replicated on those axes)."""
        return TensorSpec(self.dims)

    def with_partial(self, axes: frozenset[int]) -> "TensorSpec":
        """The same layout with extra partial-sum axes."""
        return TensorSpec(self.dims, self.partial | axes)

    def format(self, mesh_ndim: int) -> str:
        """Text form; axis digits are omitted on a 1-D mesh."""
        digits = mesh_ndim > 1
        parts = []
        for axes in self.dims:
            parts.append("S" + ("".join(map(str, axes)) if digits else "") if axes else "R")
        if self.partial:
            parts.append("P" + ("".join(map(str, sorted(self.partial))) if digits else ""))
        return "".join(parts)

    @staticmethod
    def parse(text: str, ndim: int, mesh_ndim: int) -> "TensorSpec":
        """Inverse of :meth:`format` for a rank-``ndim`` tensor on a ``mesh_ndim``-D mesh."""
        tokens = re.findall(r"[RSP]\d*", text.strip().upper())
        if "".join(tokens) != text.strip().upper():
            raise AutoshardError(f"spec {text!r} is not R/S/P letters with mesh-axis digits, e.g. RS or S0R")
        partial: frozenset[int] = frozenset()
        if tokens and tokens[-1].startswith("P"):
            partial = _axes(tokens.pop()[1:], mesh_ndim, text)
            partial = frozenset(partial)
        if len(tokens) != ndim:
            raise AutoshardError(f"spec {text!r} has {len(tokens)} dims but the tensor has {ndim}: give one letter per dim")
        dims = tuple(() if t == "R" else _axes(t[1:], mesh_ndim, text) for t in tokens)
        try:
            return TensorSpec(dims, partial)
        except ValueError:
            raise AutoshardError(f"spec {text!r} uses a mesh axis twice: each axis shards at most one dim") from None


def _axes(digits: str, mesh_ndim: int, text: str) -> tuple[int, ...]:
    if not digits:
        if mesh_ndim != 1:
            raise AutoshardError(f"spec {text!r} must name mesh axes on a {mesh_ndim}-D mesh, e.g. S0 or S01")
        return (0,)
    axes = tuple(int(c) for c in digits)
    if any(a >= mesh_ndim for a in axes):
        raise AutoshardError(f"spec {text!r} names a mesh axis >= {mesh_ndim}: the mesh has axes 0..{mesh_ndim - 1}")
    return axes
