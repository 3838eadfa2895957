"""The pipeline search keeps its time limit: no build or solve starts past it, and the search ends
with the best plan so far and a claim bounded only by what was proved, or one line saying what
was left. The limit passes on a fake clock, moved by the test at a known point of the search."""

from __future__ import annotations

from typing import Any, Callable

import pytest

import autoshard.pipeline.axes as axes
import autoshard.pipeline.search as pipeline_search
from autoshard.cost.devices import get_device
from autoshard.errors import AutoshardError
from autoshard.pipeline.baseline import torchtitan_options
from autoshard.pipeline.claim import search
from autoshard.pipeline.deadline import SearchTimeout, TimeLimit
from autoshard.pipeline.axes import AxesSearch, in_turn
from autoshard.pipeline.options import options_for
from autoshard.pipeline.search import PipelineSearch
from autoshard.sharding.mesh import parse_mesh
from tests.pipeline.models import tiny_llama_graph
from tests.solver.helpers import FakeClock

BATCH = 8
LIMIT = 100.0
"""The search's time limit in seconds of the fake clock."""


class Builds:
    """``build_model_problem`` counted, each build's clock reading kept; the clock passes the
    limit once ``after`` builds have been made (None: never)."""

    def __init__(self, clock: FakeClock, build: Callable[..., Any], after: int | None) -> None:
        self.clock, self.build, self.after = clock, build, after
        self.readings: list[float] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.readings.append(self.clock.now)
        built = self.build(*args, **kwargs)
        if len(self.readings) == self.after:
            self.clock.now += 2 * LIMIT
        return built


BUILD = dict(mode="training", device=get_device("h100"), memory_budget=get_device("h100").runtime_bytes + (6 << 20))
MESH = parse_mesh("2x2", None, None, 8, get_device("h100").intra, get_device("h100").inter)


def _engine(clock: FakeClock, progress: Callable[[str], None] = lambda line: None, axis: int = 0) -> PipelineSearch:
    return PipelineSearch(lambda m: tiny_llama_graph(4, BATCH // m), MESH, axis, BUILD, LIMIT, progress, clock=clock)


def test_a_limit_already_past_builds_nothing_and_says_what_was_left_in_one_line(monkeypatch) -> None:
    clock = FakeClock()
    engine = _engine(clock)
    builds = Builds(clock, pipeline_search.build_model_problem, None)
    monkeypatch.setattr(pipeline_search, "build_model_problem", builds)
    clock.now += 2 * LIMIT
    with pytest.raises(AutoshardError) as caught:
        search(engine, options_for(4, 2, [2, 4], ("1f1b",)), torchtitan_options(4, 2, BATCH), processors=1)
    line = str(caught.value)
    assert "\n" not in line and "time limit" in line and "raise --timeout" in line
    assert builds.readings == []


def test_pipeline_auto_past_its_limit_builds_nothing_and_says_so_in_one_line(monkeypatch) -> None:
    """The whole-model candidate's builds keep the same limit as the axes' (``AxesSearch``)."""
    clock = FakeClock()
    engines = {a: _engine(clock, axis=a) for a in (0, 1)}
    whole = AxesSearch(engines, lambda: tiny_llama_graph(4, BATCH), MESH, BUILD, LIMIT, clock=clock)
    builds = Builds(clock, pipeline_search.build_model_problem, None)
    monkeypatch.setattr(pipeline_search, "build_model_problem", builds)
    monkeypatch.setattr(axes, "build_model_problem", builds)
    clock.now += 2 * LIMIT
    with pytest.raises(AutoshardError, match=r"time limit.*raise --timeout$"):
        search(whole, in_turn([options_for(4, 2, [2], ("1f1b",), axis=a) for a in (0, 1)], 4), processors=1)
    assert builds.readings == []


@pytest.mark.parametrize("after", [1, 3, 6])
def test_the_limit_passing_after_some_builds_ends_the_search_with_what_was_proved(monkeypatch, after: int) -> None:
    """Builds stop at the limit; the search returns the recipe's plan or a better one (the seed
    is costed first), and its claim's bound is at most the best step: options never bounded
    count in ``unbounded`` and bound nothing."""
    clock = FakeClock()
    engine = _engine(clock)
    start = engine.limit.start
    builds = Builds(clock, pipeline_search.build_model_problem, after)
    monkeypatch.setattr(pipeline_search, "build_model_problem", builds)
    options = options_for(4, 2, [2, 4], ("1f1b",))
    seed = torchtitan_options(4, 2, BATCH)[0]
    try:
        result = search(engine, options, [seed], processors=1)
    except AutoshardError as exc:  # the seed's own builds were cut short
        assert "raise --timeout" in str(exc) and "\n" not in str(exc)
        assert len(builds.readings) == after
        return
    assert len(builds.readings) == after and all(reading - start <= LIMIT for reading in builds.readings)
    assert result.lower_bound <= result.best.step
    assert result.unbounded >= sum(not s.bounded for s in result.searched)
    if any(not s.bounded for s in result.searched):
        assert result.lower_bound == 0.0 and result.gap == pytest.approx(1.0)


def test_the_limit_passing_after_the_recipe_is_costed_leaves_the_recipe_as_the_plan() -> None:
    """With no time after the seed: the recipe's plan is the answer, nothing is bounded, and the
    claim has no bound."""
    clock = FakeClock()

    def progress(line: str) -> None:
        if line.startswith("baseline step"):
            clock.now += 2 * LIMIT

    engine = _engine(clock, progress)
    seed = torchtitan_options(4, 2, BATCH)[0]
    options = options_for(4, 2, [2, 4], ("1f1b",))
    result = search(engine, options, [seed], processors=1)
    assert result.best.origin == "baseline" and result.best.option == seed
    assert result.unbounded == len(options) and result.lower_bound == 0.0


def test_options_left_unbounded_at_the_bounding_share_bound_nothing_once_time_runs_out() -> None:
    """The bounding phase's share passes after the first bound, the whole limit after the first
    solved option: that option is the best, the others stay unbounded and the claim has no bound."""
    clock = FakeClock()

    def progress(line: str) -> None:
        if line.startswith("bound") and clock.now < 1000.0 + 0.5 * LIMIT:
            clock.now += 0.5 * LIMIT
        if line.startswith("step"):
            clock.now += 2 * LIMIT

    engine = _engine(clock, progress)
    options = options_for(4, 2, [2, 4], ("1f1b",))
    result = search(engine, options, processors=1)
    assert result.best.step is not None and result.best.option == options[0]
    assert result.unbounded == len(options) - 1 and result.lower_bound == 0.0


def test_a_time_limit_raises_before_the_work_it_names() -> None:
    clock = FakeClock()
    limit = TimeLimit(LIMIT, clock)
    limit.check("anything")  # within the limit: nothing happens
    clock.now += LIMIT + 1
    assert limit.remaining() == 0.0 and limit.passed()
    with pytest.raises(SearchTimeout, match=r"passed before solving a stage, 101 s into the pipeline search: raise --timeout$"):
        limit.check("solving a stage")
    with pytest.raises(SearchTimeout), limit.builds("building a stage"):
        pytest.fail("the block ran past the limit")
    assert TimeLimit(None, clock).remaining() is None and not TimeLimit(None, clock).passed()


class SlowBuilds(Builds):
    """Builds that each take ``seconds`` of the fake clock."""

    def __init__(self, clock: FakeClock, build: Callable[..., Any], seconds: float) -> None:
        super().__init__(clock, build, None)
        self.seconds = seconds

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        built = super().__call__(*args, **kwargs)
        self.clock.now += self.seconds
        return built


@pytest.mark.parametrize("share, skipped", [(40, True), (1, False)])
def test_a_device_tries_its_second_parameter_policy_only_with_time_for_the_solves_after_it(
        monkeypatch, share: int, skipped: bool) -> None:
    """Each build takes 10 s of a 100 s limit: with 39 solves still to come after the kept
    policy's, the per-microbatch policy is left unsolved (its bound then only its free one); with
    none to come, it is solved."""
    clock = FakeClock()
    lines: list[str] = []
    engine = _engine(clock, lines.append)
    monkeypatch.setattr(pipeline_search, "build_model_problem",
                        SlowBuilds(clock, pipeline_search.build_model_problem, 10.0))
    monkeypatch.setattr(engine, "device_floor", lambda *args: 0.0)  # a free bound that prunes no policy
    option = next(o for o in options_for(4, 2, [2], ("1f1b",)) if o.counts == (2, 2))
    stage = engine.stages(option)[0]
    found, floor = engine.choose_stage(option, stage, 2, share)
    solved_policies = {key[4] for key in engine.problems if key[2] is not None}  # budgeted problems built
    assert (False not in solved_policies) == skipped
    assert any(line.startswith("no time for parameters gathered per microbatch") for line in lines) == skipped
    assert found.solution.cost is not None
    if skipped:
        assert floor == 0.0  # the unsolved policy's free bound
