"""The claim's search rules out, unsolved and said so, every option whose bound reaches the best
step, and asks for bounds that may stop at the best step (a stub engine: bounds and steps given)."""

from __future__ import annotations

from autoshard.pipeline.claim import search
from autoshard.pipeline.deadline import TimeLimit
from autoshard.pipeline.options import PipelineOption
from autoshard.pipeline.results import Searched


class Stub:
    """Bounds, steps and the seed's step by option; records what was evaluated and each cutoff."""

    def __init__(self, bounds: dict[PipelineOption, float], steps: dict[PipelineOption, float], seed: float) -> None:
        self.bounds, self.steps, self.seed = bounds, steps, seed
        self.limit, self.incumbent = TimeLimit(None), object()
        self.lines: list[str] = []
        self.cutoffs: list[float] = []
        self.solved: list[PipelineOption] = []

    def progress(self, line: str) -> None:
        self.lines.append(line)

    def evaluate(self, option: PipelineOption, bounded: bool, recipe=None, cutoff: float = float("inf")) -> Searched:
        if recipe is not None:
            return Searched(option, 0.0, self.seed)
        if not bounded:
            self.cutoffs.append(cutoff)
            return Searched(option, self.bounds[option])
        self.solved.append(option)
        return Searched(option, self.bounds[option], self.steps[option])


def _option(m: int) -> PipelineOption:
    return PipelineOption("1f1b", 2, m, 1, (2, 2))


def test_options_whose_bound_reaches_the_best_step_are_ruled_out_unsolved_and_named() -> None:
    seed, cheap, close, dear = _option(1), _option(2), _option(4), _option(8)
    engine = Stub({seed: 9.0, cheap: 5.0, close: 6.5, dear: 11.0}, {cheap: 6.0, close: 7.0}, seed=10.0)
    result = search(engine, [cheap, close, dear], seeds=[seed], processors=1)
    assert engine.cutoffs == [10.0, 10.0, 10.0]  # bounding may stop at the seed's step
    assert engine.solved == [cheap]  # its step 6 rules out close (bound 6.5) before it is solved
    assert result.best.option == cheap and result.best.step == 6.0
    ruled = [line for line in engine.lines if line.startswith("ruled out")]
    assert ruled == [f"ruled out by its bound 11 s >= the best step 10 s ({seed.label}): {dear.label}",
                     f"ruled out by its bound 6.5 s >= the best step 6 s ({cheap.label}): {close.label}"]
    assert result.lower_bound == 5.0


class LateStub(Stub):
    """A Stub whose first bound takes half the time limit: the bounding phase ends after it."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.now = 0.0
        self.limit = TimeLimit(100.0, lambda: self.now)

    def evaluate(self, option: PipelineOption, bounded: bool, recipe=None, cutoff: float = float("inf")) -> Searched:
        if not bounded and not self.cutoffs:
            self.now += 50.0
        return super().evaluate(option, bounded, recipe, cutoff)


def test_options_the_bounding_phase_left_are_bounded_before_any_is_solved_and_ruled_out_by_it() -> None:
    first, dear, close = _option(2), _option(4), _option(8)
    engine = LateStub({first: 5.0, dear: 8.0, close: 5.5}, {first: 6.0, close: 7.0}, 10.0)
    result = search(engine, [first, dear, close], processors=1)
    assert any(line.startswith("no time to bound 2 more options") for line in engine.lines)
    assert engine.cutoffs == [float("inf"), 6.0, 6.0]  # bounded late, each may stop at the best step
    assert engine.solved == [first, close]  # dear's late bound 8 rules it out unsolved
    assert f"ruled out by its bound 8 s >= the best step 6 s ({first.label}): {dear.label}" in engine.lines
    assert result.unbounded == 0 and result.lower_bound == 5.0 and result.best.option == first


def test_once_a_plan_exists_the_options_left_without_a_bound_are_bounded_before_another_is_solved() -> None:
    first, second, dear, close = _option(2), _option(4), _option(8), _option(16)
    engine = LateStub({first: 5.0, second: 5.2, dear: 8.0, close: 5.5},
                      {first: 6.0, second: 5.8, close: 7.0}, 10.0)
    result = search(engine, [first, dear, close, second], processors=1)
    assert any(line.startswith("no time to bound 3 more options") for line in engine.lines)
    assert engine.cutoffs == [float("inf"), 6.0, 6.0, 6.0]  # all three bounded late, right after first's solve
    assert engine.solved == [first, second, close]  # then in order of bound: second 5.2, close 5.5
    assert result.unbounded == 0 and result.lower_bound == 5.0 and result.best.option == second
