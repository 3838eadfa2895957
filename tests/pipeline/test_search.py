"""The pipeline search against brute force: every option solved, the best step and the bounds."""

from __future__ import annotations

import pytest

from autoshard.cost.devices import get_device
from autoshard.pipeline.baseline import torchtitan_options, torchtitan_pipeline
from autoshard.pipeline.options import options_for
from autoshard.pipeline.boundaries import boundary_mismatches
from autoshard.pipeline.claim import search
from autoshard.pipeline.search import PipelineSearch
from autoshard.pipeline.stages import cut
from autoshard.sharding.layers import find_repeated_layers
from autoshard.sharding.mesh import parse_mesh
from autoshard.solver.engines.milp import solve_problem_milp
from autoshard.errors import AutoshardError
from tests.pipeline.models import tiny_llama_graph

BATCH = 8


@pytest.fixture(scope="module")
def engine():
    device = get_device("h100")
    mesh = parse_mesh("2x2", None, None, 8, device.intra, device.inter)
    build = dict(mode="training", device=device, precision="bf16-mixed", memory_budget=device.runtime_bytes + (6 << 20),
                 recompute="full")
    return PipelineSearch(lambda m: tiny_llama_graph(4, BATCH // m), mesh, 0, build, None)


def test_search_finds_the_best_option_brute_force_finds(engine) -> None:
    """Solving every option (no pruning) gives the same best step, every bound is below its
    option's step, and each device problem of the best option agrees with HiGHS."""
    # 1F1B and interleaved at 2 and 4 microbatches: GPipe differs from 1F1B only in what is in
    # flight (test_memory_in_flight_rises_with_the_schedule), and 8 adds options, not cases.
    options = options_for(4, 2, [2, 4], ("1f1b", "interleaved-1f1b"))
    result = search(engine, options)
    every = []
    for option in options:
        bound = engine.evaluate(option, bounded=False).bound
        try:
            solved = engine.evaluate(option, bounded=True)
        except AutoshardError:
            continue
        assert bound <= solved.step * (1 + 1e-9)
        every.append(solved.step)
    assert result.best.step == pytest.approx(min(every))
    assert result.lower_bound <= result.best.step
    assert result.best.proved and result.gap == 0
    for solved in result.best.solutions.values():
        reference = solve_problem_milp(solved.model_problem.problem, 60)
        assert reference.optimal and reference.cost == solved.solution.cost


def test_memory_in_flight_rises_with_the_schedule(engine) -> None:
    """GPipe holds every microbatch, 1F1B at most the pipeline degree: the first device's peak
    under GPipe with 4 microbatches is above its peak under 1F1B."""
    gpipe, one_f = (next(o for o in options_for(4, 2, [4], (s,)) if o.counts == (2, 2)) for s in ("gpipe", "1f1b"))
    stage = engine.stages(gpipe)[0]
    peaks = []
    for option, held in ((gpipe, 4), (one_f, 2)):
        sol = engine.solve_stage(option, stage, held, bounded=True)
        peaks.append(sol.model_problem.problem.peak_usage(list(sol.solution.choice)))
    assert peaks[0] > peaks[1]


def test_stages_agree_on_the_layouts_they_pass(engine) -> None:
    option = next(o for o in options_for(4, 2, [2], ("1f1b",)) if o.counts == (2, 2))
    solved = engine.evaluate(option, bounded=True)
    stages = engine.stages(option)
    assert boundary_mismatches(stages, [solved.solutions[s.signature] for s in stages]) == solved.mismatches


def test_a_pipeline_needs_another_axis() -> None:
    mesh = parse_mesh("4")
    with pytest.raises(AutoshardError, match="pipeline over one axis"):
        PipelineSearch(lambda m: None, mesh, 0, {"mode": "training"}, None)


def test_cuts_must_cover_the_layers() -> None:
    graph = tiny_llama_graph(4, 2)
    with pytest.raises(AutoshardError, match="do not split the 4 layers"):
        cut(graph, find_repeated_layers(graph), (2, 1), 2)


def test_interleaved_devices_agree_on_every_boundary(engine) -> None:
    """Device 0 of an interleaved pipeline also receives (its second stage): all in one layout."""
    option = options_for(4, 2, [2], ("interleaved-1f1b",))[0]
    assert option.virtual == 2 and len(engine.stages(option)[0].received) == 1
    assert engine.evaluate(option, bounded=True).mismatches == []


def test_options_whose_stages_find_no_plan_in_time_stay_unbounded(monkeypatch) -> None:
    """A stage solve that ends without a plan leaves its option without a bound, not the search
    without an answer: the recipe's plans stand (on the seed's option or, as incumbents, on
    another), and the claim has no lower bound."""
    import autoshard.pipeline.layer_bound as layer_bound
    import autoshard.pipeline.search as pipeline_search

    def nothing_in_time(*args, **kwargs):
        raise AutoshardError("no plan found within the time limit of 0.25s: raise the timeout")

    device = get_device("h100")
    mesh = parse_mesh("2x2", None, None, 8, device.intra, device.inter)
    build = dict(mode="training", device=device, memory_budget=device.runtime_bytes + (6 << 20))
    seed = torchtitan_options(4, 2, BATCH)[0]
    monkeypatch.setattr(pipeline_search, "solve_model_problem", nothing_in_time)
    monkeypatch.setattr(layer_bound, "solve", nothing_in_time)  # the bounds' parts too, without a budget
    monkeypatch.setattr(layer_bound, "best_multipliers", nothing_in_time)  # and under it
    engine = PipelineSearch(lambda m: tiny_llama_graph(4, BATCH // m), mesh, 0, build, timeout=60)
    options = options_for(4, 2, [2, 4], ("1f1b",))
    result = search(engine, options, [seed])
    assert result.best.step <= torchtitan_pipeline(engine, seed).step
    assert result.unbounded == len(options) and result.lower_bound == 0.0


def test_the_search_with_time_is_never_worse_than_the_recipe_it_is_seeded_with(engine) -> None:
    """The recipe's plan seeds the best (tests/pipeline/test_deadline.py: it stands when time runs
    out); with time (the module's engine has no limit), the search's best is never worse than it."""
    seed = torchtitan_options(4, 2, BATCH)[0]
    solved = search(engine, options_for(4, 2, [2], ("1f1b",)), [seed])
    assert solved.best.origin == "search" and solved.best.step <= torchtitan_pipeline(engine, seed).step
