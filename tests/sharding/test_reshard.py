"""Reshard step lists, checked exhaustively against the definition of a layout (numpy mesh model)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autoshard.sharding.reshard import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER, SLICE, reshard_steps
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
