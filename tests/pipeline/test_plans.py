"""Pipelined plan files: the round trip, plans carried onto alike devices, and malformed files."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from autoshard.api import StageOptions, build_model_problem
from autoshard.errors import AutoshardError
from autoshard.frontend.graph import fingerprint
from autoshard.pipeline.plans import PipelinePlan, relabel
from autoshard.pipeline.stages import cut
from autoshard.problem.baselines.megatron import megatron_choice
from autoshard.problem.readback import make_plan
from autoshard.sharding.layers import find_repeated_layers
from autoshard.sharding.mesh import parse_mesh
from tests.pipeline.models import tiny_llama_graph


@pytest.fixture(scope="module")
def middle():
    """The two middle devices of a 4-stage cut of 8 layers, and a plan made on the first of them."""
    graph = tiny_llama_graph(8, 2)
    stages = cut(graph, find_repeated_layers(graph), (2, 2, 2, 2), 4)
    mp = build_model_problem(stages[1].graph, "2", mode="training", stage=StageOptions(4, Fraction(3), (1e11, 1e-5)))
    return stages, make_plan(mp, megatron_choice(mp))


def test_a_plan_carried_onto_an_alike_device_names_its_own_layers(middle) -> None:
    stages, plan = middle
    moved = relabel(plan, stages[1].graph, stages[2].graph)
    assert moved.fingerprint == fingerprint(stages[2].graph) != plan.fingerprint
    assert set(moved.nodes) == set(stages[2].graph.nodes)
    assert all(name.startswith(("layers.4.", "layers.5.")) for name in moved.param_specs if name.startswith("layers."))
    assert sorted(map(str, moved.param_specs.values())) == sorted(map(str, plan.param_specs.values()))


def test_a_plan_is_not_carried_onto_a_different_graph(middle) -> None:
    stages, plan = middle
    with pytest.raises(AutoshardError, match="differ in their graphs"):
        relabel(plan, stages[1].graph, stages[0].graph)  # the first device also holds the embedding


def test_the_file_round_trips_and_malformed_files_are_one_line_errors(middle, tmp_path: Path) -> None:
    stages, plan = middle
    pipeline = PipelinePlan(parse_mesh("4x2"), 0, "1f1b", 4, 1, (2, 2, 2, 2), 1.5, 1.2, False, [([1, 2], plan, True)])
    path = tmp_path / "pipeline.json"
    pipeline.save(path)
    loaded = PipelinePlan.load(path)
    assert (loaded.mesh.shape, loaded.axis, loaded.counts, loaded.groups[0][0]) == ((4, 2), 0, (2, 2, 2, 2), [1, 2])
    assert loaded.kept(2) and json.loads(path.read_text())["devices"][0]["keep_gathered"] is True
    with pytest.raises(AutoshardError, match=r"covers pipeline devices \[1, 2\], the mesh has 4"):
        loaded.device_plans(stages)
    data = json.loads(path.read_text())
    del data["pipeline"]["axis"]
    path.write_text(json.dumps(data))
    with pytest.raises(AutoshardError, match=r"is malformed \(pipeline\.axis is missing\): re-create it"):
        PipelinePlan.load(path)
    path.write_text(json.dumps({"devices": []}))
    with pytest.raises(AutoshardError, match="is not a pipelined plan"):
        PipelinePlan.load(path)
    path.write_text("{")
    with pytest.raises(AutoshardError, match="cannot be read"):
        PipelinePlan.load(path)
