"""The device that weighs most on the step is solved first and freely, the others fixed to the
layouts it sends in, and each gets the solving time by its weight (``stages.path_weights``)."""

from __future__ import annotations

import pytest

from autoshard.cost.devices import get_device
from autoshard.pipeline.options import PipelineOption, stage_label
from autoshard.pipeline.schedules import device_orders
from autoshard.pipeline.search import PipelineSearch
from autoshard.pipeline.stages import WEIGHT_FLOOR, critical_path, path_weights
from autoshard.sharding.mesh import parse_mesh
from tests.pipeline.models import tiny_llama_graph

BATCH = 8


@pytest.fixture(scope="module")
def engine_and_lines():
    device = get_device("h100")
    mesh = parse_mesh("4x2", None, None, 8, device.intra, device.inter)
    build = dict(mode="training", device=device, precision="bf16-mixed", recompute="full")
    lines: list[str] = []
    return PipelineSearch(lambda m: tiny_llama_graph(8, BATCH // m), mesh, 0, build, None, lines.append), lines


def _option() -> PipelineOption:
    """1F1B over 4 devices, the middle two the fullest (3 layers against 1 and the embedding or head)."""
    return PipelineOption("1f1b", 4, 4, 1, (1, 3, 3, 1))


def test_the_weights_are_the_paths_rates_of_change_with_a_floor(engine_and_lines) -> None:
    engine, _ = engine_and_lines
    option = _option()
    stages = engine.stages(option)
    orders = device_orders(option.schedule, option.devices, option.microbatches, option.virtual)
    groups: dict[tuple, list[int]] = {}
    for d, st in enumerate(stages):
        groups.setdefault(st.signature, []).append(d)
    weights = path_weights(len(option.counts), stages, orders, groups)
    middle = stages[1].signature
    assert groups[middle] == [1, 2] and max(weights, key=weights.get) == middle  # the slowest, two of them
    times = [float(sum(st.counts) + st.first + st.last) for st in stages]
    slower = [t + 1.0 if d in groups[middle] else t for d, t in enumerate(times)]
    rise = critical_path(len(option.counts), stages, orders, slower) - critical_path(len(option.counts), stages,
                                                                                   orders, times)
    assert weights[middle] == pytest.approx(rise, rel=1e-6)  # the path is piecewise linear in the times
    assert min(weights.values()) >= WEIGHT_FLOOR * weights[middle] * (1 - 1e-12)


def test_the_lead_is_solved_freely_and_the_others_in_its_layouts(engine_and_lines) -> None:
    engine, lines = engine_and_lines
    option = _option()
    solved = engine.evaluate(option, bounded=True)
    solves = [line for line in lines if line.startswith("stage problem") and ", bound," not in line]  # not the floors
    lead = f"stage problem: {stage_label(engine.stages(option)[1].signature)},"
    assert solves[0].startswith(lead)
    assert all(("boundary layouts fixed" in line) != line.startswith(lead) for line in solves)
    assert len({line.split(",")[0] for line in solves}) == 3  # every group solved
    assert not solved.mismatches and solved.step is not None
