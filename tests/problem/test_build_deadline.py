"""A build keeps the caller's time limit: past it, one line saying how far it got, not a late problem."""

from __future__ import annotations

import time

import pytest

from autoshard.cost.communication import make_cost_model
from autoshard.problem.build import BuildOptions, BuildTimeout, build_deadline, build_problem
from autoshard.sharding.mesh import parse_mesh
from tests.graphs import mlp_graph


def _build():
    mesh = parse_mesh("4")
    return build_problem(mlp_graph(), mesh, make_cost_model("alpha-beta", mesh), BuildOptions(mode="training"))


def test_a_build_past_its_deadline_stops_with_one_line() -> None:
    with build_deadline(time.monotonic() - 1), pytest.raises(BuildTimeout) as caught:
        _build()
    line = str(caught.value)
    assert "\n" not in line and "time limit passed while building the problem" in line
    assert "0 of" in line and "raise --timeout" in line


def test_a_build_within_its_deadline_or_without_one_is_the_same_problem() -> None:
    free = _build()
    with build_deadline(time.monotonic() + 600):
        timed = _build()
    assert timed.problem.num_nodes == free.problem.num_nodes and len(timed.problem.edges) == len(free.problem.edges)
    with build_deadline(time.monotonic() - 1):
        pass
    assert _build().problem.num_nodes == free.problem.num_nodes  # the limit ends with its block
