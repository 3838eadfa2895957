"""Mesh parsing, spec text, byte units: the user-facing value formats."""

from __future__ import annotations

import pytest

from autoshard.errors import AutoshardError
from autoshard.sharding.mesh import NETWORK_BANDWIDTH, NVLINK_BANDWIDTH, parse_mesh
from autoshard.sharding.spec import TensorSpec
from autoshard.cost.units import format_bytes, parse_bytes


def test_mesh_shapes_and_default_links():
    assert parse_mesh("8").shape == (8,)
    mesh = parse_mesh("2x4")
    assert mesh.shape == (2, 4) and mesh.size == 8
    assert mesh.bandwidth == (NVLINK_BANDWIDTH, NVLINK_BANDWIDTH)  # 8 devices fit in one node
    big = parse_mesh("4x8")
    assert big.bandwidth == (NETWORK_BANDWIDTH, NVLINK_BANDWIDTH)
    assert parse_mesh("2x4", "300e9,25e9", "1e-6,5e-6").bandwidth == (300e9, 25e9)


@pytest.mark.parametrize("text", ["0", "-2", "2.5", "eight", "2x0", "x4"])
def test_bad_meshes_get_one_line_errors(text):
    with pytest.raises(AutoshardError) as err:
        parse_mesh(text)
    assert "\n" not in str(err.value) and "--mesh" in str(err.value)


def test_link_lists_must_match_the_mesh():
    with pytest.raises(AutoshardError, match="3 values"):
        parse_mesh("2x4", "1e9,2e9,3e9")


def test_ranks_are_row_major():
    mesh = parse_mesh("2x4")
    assert mesh.coords(5) == (1, 1) and mesh.rank((1, 1)) == 5
    assert mesh.axis_groups(0) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh.axis_groups(1) == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("text,ndim,mesh_ndim", [("RS", 2, 1), ("RRP", 2, 1), ("S0R", 2, 2), ("S01R", 2, 2),
                                                  ("RS1P0", 2, 2), ("RRR", 3, 3)])
def test_spec_text_round_trips(text, ndim, mesh_ndim):
    assert TensorSpec.parse(text, ndim, mesh_ndim).format(mesh_ndim) == text


@pytest.mark.parametrize("text,ndim,mesh_ndim,match", [
    ("RSX", 3, 1, "letters"), ("RS", 3, 1, "dims"), ("S2R", 2, 2, "axis"), ("S0S0", 2, 2, "twice"), ("SR", 2, 2, "name")])
def test_bad_specs_say_what_is_wrong(text, ndim, mesh_ndim, match):
    with pytest.raises(AutoshardError, match=match):
        TensorSpec.parse(text, ndim, mesh_ndim)


def test_local_shapes_and_chunks():
    spec = TensorSpec.parse("S01R", 2, 2)
    assert spec.local_shape((16, 4), (2, 4)) == (2, 4)
    assert spec.chunk_index(0, (1, 2), (2, 4)) == 6
    assert TensorSpec.parse("S0R", 2, 2).fits((3, 4), (2, 4))  # pieces of 2 and 1
    assert TensorSpec.parse("S0R", 2, 2).local_shape((3, 4), (2, 4)) == (2, 4)
    assert not TensorSpec.parse("RS1", 2, 2).fits((3, 5), (2, 4))  # pieces 2, 2, 1, 0: one empty
    assert not TensorSpec.parse("S01R", 2, 2).fits((9, 4), (2, 4))  # uneven over two axes


def test_byte_units():
    assert parse_bytes("16GiB") == 16 * 2**30
    assert parse_bytes("1.5 GB") == 1_500_000_000
    assert parse_bytes("4096") == 4096
    assert format_bytes(3 * 2**30) == "3 GiB"
    with pytest.raises(AutoshardError, match="unit"):
        parse_bytes("12 apples")
