"""Whether to pipeline, and over which mesh axis (``--pipeline auto``): every candidate searched as one.

The candidates are the pipeline options over each mesh axis ``a`` of more than one device that
leaves another axis (``options_for`` with ``axis = a``, each stage sharded on the other axes:
``search.PipelineSearch`` over ``a``) and one more, the whole model on the whole mesh without a
pipeline (:data:`~autoshard.pipeline.options.NO_PIPELINE`: the problem ``autoshard.solve``
solves without ``--pipeline``, at the whole batch). Every candidate's step is in seconds per
training step, so they compare directly; its lower bound is, for a pipeline option, the
critical path over its stages' unbudgeted bounds (``search.py``) and, without a pipeline, the
whole model's ends and layers bounded apart on the model shortened to two layers
(``layer_bound.whole_floor``), else the solver's bound on the whole problem without a memory budget. :func:`~autoshard.pipeline.search.search`
then runs over all of them at once: the unpipelined candidate is solved first (:func:`auto_seeds`),
each is bounded (the axes' options before the unpipelined one, :func:`in_turn`), then they are
solved cheapest bound first until the best step is below every remaining bound, so the chosen
axis (or none) beats each other one by the bounds printed beside it (:func:`why`).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from autoshard.api import ModelSolution, build_model_problem, default_solve_options, solve_model_problem
from autoshard.cost.units import format_seconds
from autoshard.errors import AutoshardError
from autoshard.frontend.graph import OpGraph
from autoshard.pipeline.deadline import TimeLimit
from autoshard.pipeline.layer_bound import solved_floor, whole_floor
from autoshard.pipeline.options import NO_PIPELINE, PipelineOption
from autoshard.pipeline.results import PipelineResult, Searched
from autoshard.pipeline.search import PipelineSearch, Recipe, floor_ticks
from autoshard.sharding.mesh import Mesh
from autoshard.problem.build import ModelProblem
from autoshard.solver import SolveOptions
from autoshard.solver.procs.clock import MONOTONIC, Clock


def pipeline_axes(mesh: Mesh) -> list[int]:
    """The mesh axes a pipeline can run over: more than one device, and another axis left."""
    return [a for a, n in enumerate(mesh.shape) if n > 1] if mesh.ndim >= 2 else []


def in_turn(per_axis: list[list[PipelineOption]], layers: int) -> list[PipelineOption]:
    """Every candidate's options in the order the search bounds them: one option of each axis in
    turn, so that a time limit leaves no axis without any bound, then the whole model, which
    :func:`auto_seeds` has solved first: its plan is what the pipelined options' bounds rule out,
    and its own bound counts only where a pipelined plan beats it."""
    found = []
    for k in range(max(map(len, per_axis), default=0)):
        found += [options[k] for options in per_axis if k < len(options)]
    return found + [whole_option(layers)]


def auto_seeds(layers: int, recipes: Sequence[PipelineOption]) -> list[PipelineOption]:
    """The seeds of ``--pipeline auto``, costed before any bound: the unpipelined candidate first (its
    solve starts from the hand-written recipes that fit, ``problem/baselines/start.py``), so that by
    its time limit ``--pipeline auto`` has at least the plan ``solve`` gives without ``--pipeline``;
    then the pipelined ``recipes``."""
    return [whole_option(layers), *recipes]


def whole_option(layers: int) -> PipelineOption:
    """The candidate without a pipeline."""
    return PipelineOption(NO_PIPELINE, 1, 1, 1, (layers,))


class AxesSearch:
    """The pipeline searches of every axis and the whole-model problem, driven as one engine
    (``evaluate`` dispatches on the option's axis); ``whole``: the model traced at the whole batch."""

    def __init__(self, engines: Mapping[int, PipelineSearch], whole: Callable[[], OpGraph], mesh: Mesh,
                 build: Mapping[str, Any], timeout: float | None, progress: Callable[[str], None] = lambda line: None,
                 solver: Callable[[SolveOptions], SolveOptions] = lambda options: options,
                 clock: Clock = MONOTONIC) -> None:
        if build.get("mode", "inference") != "training":
            raise AutoshardError("--pipeline plans training steps (forwards and backwards of microbatches): "
                                 "add --mode training")
        self.engines, self.whole, self.mesh, self.build = dict(engines), whole, mesh, dict(build)
        self.progress, self.solver, self.limit = progress, solver, TimeLimit(timeout, clock)
        self.incumbent: Recipe | None = next(iter(self.engines.values())).incumbent if self.engines else None
        self.solved: dict[bool, ModelSolution] = {}
        self.graph: OpGraph | None = None

    def evaluate(self, option: PipelineOption, bounded: bool, recipe: Recipe | None = None,
                 cutoff: float = float("inf")) -> Searched:
        """The option's step (``bounded``) or bound, on its axis's engine (bounding stops once it
        reaches ``cutoff``) or, without a pipeline, on the whole problem. The unpipelined candidate
        is costed from a ``recipe`` by its solve, which starts from the recipes that fit."""
        if option.schedule != NO_PIPELINE:
            return self.engines[option.axis].evaluate(option, bounded, recipe, cutoff)
        bounded = bounded or recipe is not None
        if not bounded:
            floor = self._floor()
            if floor is not None:
                return Searched(option, floor)
        solved = self._solve(bounded)
        ticks = solved.model_problem.cost_model.ticks_per_unit
        searched = Searched(option, floor_ticks(solved.solution) / ticks)
        searched.solutions[()], searched.groups[()] = solved, [0]
        if bounded:
            searched.step = solved.solution.cost / ticks
        return searched

    def _floor(self) -> float | None:
        """The whole model's bound from its parts (``layer_bound.whole_floor``), or None."""
        build = dict(self.build, memory_budget=1 << 62)
        floor = whole_floor(self._whole_graph(), lambda short: self._build(short, build), solved_floor(self.limit))
        if floor is not None:
            self.progress(f"whole model without a pipeline, bound from two layers: {format_seconds(floor)}")
        return floor

    def _solve(self, bounded: bool) -> ModelSolution:
        """The whole problem under the memory budget, or without one (its bound); solved once each."""
        if bounded not in self.solved:
            build = dict(self.build)
            if not bounded:
                build["memory_budget"] = 1 << 62
            mp = self._build(self._whole_graph(), build)
            self.progress(f"whole model without a pipeline{'' if bounded else ', bound'}: {mp.problem.num_nodes} nodes")
            self.limit.check("solving the whole model without a pipeline")
            left = self.limit.remaining()
            self.solved[bounded] = solve_model_problem(
                mp, self.solver(default_solve_options(mp, None if left is None else left / 4)), model_name="model")
        return self.solved[bounded]

    def _whole_graph(self) -> OpGraph:
        """The model traced at the whole batch (once, within the time limit)."""
        if self.graph is None:
            self.limit.check("tracing the whole model")
            self.graph = self.whole()
        return self.graph

    def _build(self, graph: OpGraph, build: Mapping[str, Any]) -> ModelProblem:
        """The problem of ``graph`` on the whole mesh, built within the time limit."""
        with self.limit.builds("building the whole model's problem"):
            return build_model_problem(graph, self.mesh, **build)


def why(result: PipelineResult) -> list[str]:
    """Per candidate (each axis, and no pipeline), its best step or least bound against the chosen
    one's step: why the chosen degree beats the others."""
    best = result.best
    by: dict[str, list[Searched]] = {}
    for s in result.searched:
        by.setdefault(_candidate(s.option), []).append(s)
    lines = []
    for name, entries in by.items():
        steps = [s.step for s in entries if s.step is not None]
        bounds = [s.bound for s in entries if s.bounded]
        least = min(bounds) if bounds else None
        if name == _candidate(best.option):
            lines.append(f"{name}: chosen, step {format_seconds(best.step)} ({best.option.label})")
        elif least is None:
            lines.append(f"{name}: not bounded in time, so not excluded")
        elif least >= best.step:
            lines.append(f"{name}: least bound {format_seconds(least)} >= the chosen step {format_seconds(best.step)}")
        else:
            found = f", best step {format_seconds(min(steps))}" if steps else ", no plan in time"
            lines.append(f"{name}: least bound {format_seconds(least)} is below the chosen step{found} (the gap "
                         f"of the claim)")
    return lines


def _candidate(option: PipelineOption) -> str:
    """``pipeline over axis 0 (8 devices)`` or ``no pipeline``."""
    if option.schedule == NO_PIPELINE:
        return "no pipeline"
    return f"pipeline over axis {option.axis} ({option.devices} devices)"
