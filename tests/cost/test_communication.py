"""Cost formulas against hand-computed values."""

from __future__ import annotations

import pytest

from autoshard.cost.communication import AlphaBetaCost, SlapoCost
from autoshard.sharding.mesh import Mesh
from autoshard.sharding.reshard import reshard_steps, reshard_traffic
from autoshard.sharding.spec import TensorSpec

MESH8 = Mesh((8,), (100e9,), (2e-6,))
MB = 2**20


def _cost(model, src, dst, shape, itemsize=4, mesh_ndim=1):
    """The reshard's cost summed over its steps, checked equal to what pricing reads (its traffic)."""
    s, d = TensorSpec.parse(src, len(shape), mesh_ndim), TensorSpec.parse(dst, len(shape), mesh_ndim)
    steps = reshard_steps(s, d, shape, itemsize, model.mesh.shape)
    cost = sum(model.step_cost(step, shape) for step in steps)
    assert model.traffic_cost(reshard_traffic(s, d, shape, itemsize, model.mesh.shape), shape) == cost
    return cost


def test_alpha_beta_collectives_by_hand():
    model = AlphaBetaCost(MESH8)
    shape = (1024, 1024)  # 4 MiB fp32
    b = 4 * MB
    assert _cost(model, "RR", "SR", shape) == 0
    assert _cost(model, "SR", "RR", shape) == pytest.approx(2e-6 + 7 / 8 * b / 100e9)  # all-gather
    assert _cost(model, "RRP", "RR", shape) == pytest.approx(2e-6 + 2 * 7 / 8 * b / 100e9)  # all-reduce
    assert _cost(model, "RRP", "SR", shape) == pytest.approx(2e-6 + 7 / 8 * b / 100e9)  # reduce-scatter
    assert _cost(model, "RS", "SR", shape) == pytest.approx(2e-6 + 7 / 64 * b / 100e9)  # all-to-all


def test_alpha_beta_uses_each_axis_links():
    mesh = Mesh((2, 4), (10e9, 100e9), (5e-6, 1e-6))
    model = AlphaBetaCost(mesh)
    b = 4 * MB
    slow = _cost(model, "S0R", "RR", (1024, 1024), mesh_ndim=2)
    fast = _cost(model, "S1R", "RR", (1024, 1024), mesh_ndim=2)
    assert slow == pytest.approx(5e-6 + 1 / 2 * b / 10e9)
    assert fast == pytest.approx(1e-6 + 3 / 4 * b / 100e9)


def test_ticks_are_picoseconds():
    model = AlphaBetaCost(MESH8)
    assert model.ticks(1.5e-9) == 1500 and model.charges_compute


def test_slapo_charges_on_the_last_two_dims():
    model = SlapoCost(MESH8)
    shape = (8, 1024, 1024)
    v = 1024 * 1024
    assert _cost(model, "RRR", "RSR", shape) == 0
    assert _cost(model, "RSR", "RRR", shape) == v / 8
    assert _cost(model, "RRRP", "RRR", shape) == v
    assert _cost(model, "RRS", "RSR", shape) == v * (1 / 8 - 1 / 64)
    assert not model.charges_compute
