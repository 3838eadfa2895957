"""Reshard step lists, checked exhaustively against the definition of a layout (numpy mesh model)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autoshard.sharding.reshard import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER, SLICE, reshard_moves,
                                     reshard_steps, reshard_traffic)
from autoshard.sharding.spec import TensorSpec
from tests.layout_sim import all_coords, apply_step, piece, place, reduce_partial


def layouts(ndim: int, mesh_shape: tuple[int, ...], with_partial: bool) -> list[TensorSpec]:
    """Every layout: each mesh axis shards one dim (any axis order), is partial, or is unused."""
    choices = list(range(ndim)) + [None] + (["P"] if with_partial else [])
    specs = set()
    for assign in itertools.product(choices, repeat=len(mesh_shape)):
        for order in itertools.permutations(range(len(mesh_shape))):
            dims = [()] * ndim
            for a in order:
                if isinstance(assign[a], int):
                    dims[assign[a]] = dims[assign[a]] + (a,)
            specs.add(TensorSpec(tuple(dims), frozenset(a for a in range(len(mesh_shape)) if assign[a] == "P")))
    return sorted(specs)


@pytest.mark.parametrize("mesh_shape", [(4,), (2, 2), (2, 4)])
def test_every_pair_of_layouts_reshards_exactly(mesh_shape):
    rng = np.random.default_rng(0)
    shape = (8, 8, 4)
    full = rng.standard_normal(shape)
    sources = layouts(3, mesh_shape, with_partial=True)
    targets = layouts(3, mesh_shape, with_partial=False)
    checked = 0
    for src in sources:
        if not src.fits(shape, mesh_shape):
            continue
        start = place(full, src, mesh_shape, rng)
        for dst in targets:
            if not dst.fits(shape, mesh_shape):
                continue
            local = start
            for step in reshard_steps(src, dst, shape, 8, mesh_shape):
                local = apply_step(local, step, mesh_shape)
            for c in all_coords(mesh_shape):
                np.testing.assert_allclose(local[c], piece(full, dst, c, mesh_shape), atol=1e-9,
                                           err_msg=f"{src} -> {dst} at {c}")
            checked += 1
    assert checked >= 20  # every fitting pair was exercised


def test_partial_axes_kept_in_destination_stay_partial():
    rng = np.random.default_rng(1)
    mesh_shape, shape = (2, 2), (4, 4)
    full = rng.standard_normal(shape)
    src = TensorSpec(((), ()), frozenset({0, 1}))
    dst = TensorSpec(((1,), ()), frozenset({0}))
    local = place(full, src, mesh_shape, rng)
    for step in reshard_steps(src, dst, shape, 8, mesh_shape):
        local = apply_step(local, step, mesh_shape)
    summed = reduce_partial(local, dst, mesh_shape)
    for c in all_coords(mesh_shape):
        np.testing.assert_allclose(summed[c], piece(full, dst, c, mesh_shape))


def _kinds(src: str, dst: str, mesh_ndim: int = 1, shape=(1024, 1024), mesh_shape=(8,)) -> list[str]:
    s = TensorSpec.parse(src, len(shape), mesh_ndim)
    d = TensorSpec.parse(dst, len(shape), mesh_ndim)
    return [step.kind for step in reshard_steps(s, d, shape, 4, mesh_shape)]


def test_one_dimensional_reshards_use_the_expected_single_collective():
    assert _kinds("RR", "SR") == [SLICE]
    assert _kinds("SR", "RR") == [ALL_GATHER]
    assert _kinds("RS", "SR") == [ALL_TO_ALL]
    assert _kinds("RRP", "RR") == [ALL_REDUCE]
    assert _kinds("RRP", "RS") == [REDUCE_SCATTER]
    assert _kinds("SR", "SR") == []


def test_step_bytes_follow_the_local_tensor_size():
    steps = reshard_steps(TensorSpec.parse("SR", 2, 1), TensorSpec.parse("RR", 2, 1), (1024, 1024), 4, (8,))
    assert steps[0].in_bytes == 1024 * 1024 * 4 // 8
    assert steps[0].sent_bytes(8) == 7 * 1024 * 1024 * 4 // 8


def test_a_reshard_cannot_create_partial_sums():
    with pytest.raises(ValueError):
        reshard_steps(TensorSpec.parse("RR", 2, 1), TensorSpec.parse("RRP", 2, 1), (4, 4), 4, (2,))


def _entering_bytes(step, shape, itemsize, mesh_shape) -> int:
    """The module doc's definition: the largest local piece entering the step, the dim it cuts padded."""
    local = list(step.before.local_shape(shape, mesh_shape))
    cut = step.dim if step.kind == REDUCE_SCATTER else step.to_dim if step.kind == ALL_TO_ALL else None
    if cut is not None:
        n = mesh_shape[step.axis]
        local[cut] = n * -(-local[cut] // n)
    return int(np.prod(local)) * itemsize


@pytest.mark.parametrize("mesh_shape", [(2, 4), (3, 2)])
def test_steps_of_one_pair_differ_across_shapes_only_in_their_bytes(mesh_shape):
    """The route of a pair of layouts (``reshard_moves``, remembered per pair) is shared by every
    shape; each shape's steps carry that shape's bytes and, where a dim is cut unevenly, the shape;
    ``reshard_traffic`` gives their collectives' kinds, axes and bytes."""
    shapes = [(8, 8, 4), (24, 16, 8), (7, 9, 5), (13, 8, 24)]
    checked = uneven = 0
    for src in layouts(3, mesh_shape, with_partial=True):
        for dst in layouts(3, mesh_shape, with_partial=False):
            if not dst.partial <= src.partial:
                continue
            moves = reshard_moves(src, dst)
            for shape in shapes:
                if not (src.fits(shape, mesh_shape) and dst.fits(shape, mesh_shape)):
                    continue
                for itemsize in (2, 4):
                    steps = reshard_steps(src, dst, shape, itemsize, mesh_shape)
                    assert [(s.kind, s.axis, s.dim, s.to_dim, s.before, s.after) for s in steps] == list(moves)
                    assert [s.in_bytes for s in steps] == [_entering_bytes(s, shape, itemsize, mesh_shape)
                                                           for s in steps]
                    # what pricing reads: the same collectives with the same bytes, no step built
                    assert reshard_traffic(src, dst, shape, itemsize, mesh_shape) == \
                        tuple((s.kind, s.axis, s.in_bytes) for s in steps if s.kind != SLICE)
                    ragged = bool(src.uneven_dims(shape, mesh_shape) or dst.uneven_dims(shape, mesh_shape))
                    assert all(s.shape == (shape if ragged else ()) for s in steps)
                    uneven += ragged and bool(steps)
                    checked += 1
    assert checked > 500 and uneven > 50
