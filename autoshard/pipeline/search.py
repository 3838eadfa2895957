"""Pipeline parallelism as a decision: degree, schedule, microbatches, virtual stages and cuts,
searched together with each stage's sharding on the other mesh axes.

Formulation. A mesh axis of size ``p`` carries the pipeline; the other axes form each stage's
mesh. An *option* fixes the schedule, the microbatch count ``m``, the virtual stages per device
``v`` and the layers of each of the ``p v`` stages. Under an option, device ``d`` solves its own
sharding problem (``autoshard/pipeline/stages.py`` cuts its graph at microbatch size) whose
objective is its time per microbatch ``T_d`` (compute, collectives and receiving its inputs
point to point, everything the model charges once per microbatch) and whose memory rows hold the
``k_d / v`` activation sets its schedule keeps in flight (``k_d``: the schedule's peak count of
forwards awaiting their backward) and gradients accumulated over the step. Devices with alike
graphs (same layers per stage, same ends) are solved once, under the largest ``k_d`` among them.
``T_d`` is split over the device's stages and into forward and backward by torch's flop counts;
the step is the critical path of the schedule (``schedules.timing``), a non-decreasing function
of every ``T_d``. Devices share nothing but the tensors they pass on, which must leave and arrive
in one layout: the first device is solved freely, the others with each boundary tensor fixed to
the layout the first device sends its kind (shape, dtype) in (``boundary_of``; an interleaved
first device is solved again with its own received tensors fixed so too), and the plans are
checked to agree (``Searched.mismatches``).

Search. Every option first gets a lower bound: its critical path with each ``T_d`` from the
problem without a memory budget and without fixed layouts, which can only be cheaper. Options
are then solved in order of bound until the best step found is no more than the next bound; a
solved option's bound is its critical path over the first device's solver bound and the others'
unbudgeted bounds. The result is the optimum over the enumerated options when the best step meets
every bound; otherwise the claim is the best step, the least bound and the gap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Callable, Mapping, Sequence

from autoshard.api import (BudgetError, ModelSolution, StageOptions, build_model_problem, default_solve_options,
                           solve_model_problem)
from autoshard.cost.units import format_seconds
from autoshard.errors import AutoshardError
from autoshard.pipeline.plans import relabel
from autoshard.problem.build import ModelProblem
from autoshard.problem.baselines.torchtitan import torchtitan_choice
from autoshard.problem.plan import Plan
from autoshard.problem.readback import make_plan
from autoshard.solver import Solution, SolveOptions
from autoshard.frontend.graph import OpGraph, TensorMeta
from autoshard.pipeline.options import PipelineOption, on_stage_mesh, stage_label
from autoshard.pipeline.schedules import device_orders, peak_in_flight, timing
from autoshard.pipeline.stages import Stage, cut, shared_parameters, stage_layouts, stage_outputs
from autoshard.sharding.layers import find_repeated_layers
from autoshard.sharding.mesh import Mesh
from autoshard.sharding.spec import TensorSpec


@dataclass
class Searched:
    """An option as far as it was solved: per device group its solution, the step and its bound
    (``bounded``: False when the time limit came before its bound; ``origin``: ``baseline`` for
    the recipe's plans taken as they are, not solved, ``no plan`` where solving found none in time)."""

    option: PipelineOption
    bound: float
    step: float | None = None
    solutions: dict[tuple, ModelSolution] = field(default_factory=dict)
    groups: dict[tuple, list[int]] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    bounded: bool = True
    origin: str = "search"

    @property
    def fits(self) -> bool:
        """Every device's plan within the memory budget."""
        return all(s.solution.status != "over budget" for s in self.solutions.values())

    @property
    def proved(self) -> bool:
        """Its step meets its bound and every boundary layout agrees."""
        return self.step is not None and not self.mismatches and self.step <= self.bound * (1 + 1e-9)


@dataclass
class PipelineResult:
    """The best option, every option's bound or step, and the claim over them."""

    best: Searched
    searched: list[Searched]
    lower_bound: float
    elapsed: float
    unbounded: int = 0

    @property
    def gap(self) -> float:
        """Relative gap between the best step and the least bound over the options."""
        return max(0.0, (self.best.step - self.lower_bound) / self.best.step) if self.best.step else 0.0


Recipe = Callable[[ModelProblem], list[int]]
"""A hand-written plan of a device's problem (torchtitan's: ``torchtitan_choice``)."""


class PipelineSearch:
    """Solves the options of one model on one mesh (stage problems cached by what makes them alike).

    ``build``: the options of ``build_model_problem`` as given on the whole mesh (restated on the
    stages' mesh by ``on_stage_mesh``); ``solver`` adjusts each stage's default solve options."""

    def __init__(self, graph_for: Callable[[int], OpGraph], mesh: Mesh, axis: int, build: Mapping[str, Any],
                 timeout: float | None, progress: Callable[[str], None] = lambda line: None,
                 incumbent: Recipe | None = torchtitan_choice,
                 solver: Callable[[SolveOptions], SolveOptions] = lambda options: options) -> None:
        if build.get("mode", "inference") != "training":
            raise AutoshardError("--pipeline plans training steps (forwards and backwards of microbatches): "
                                 "add --mode training")
        if not 0 <= axis < mesh.ndim or mesh.ndim < 2:
            raise AutoshardError(f"--pipeline {axis} is not an axis of the {mesh.ndim}-D mesh {mesh.label} that "
                                 f"leaves another: pipeline over one axis of a mesh with two or more")
        self.graph_for, self.mesh, self.axis = graph_for, mesh, axis
        self.inner = mesh.without_axis(axis)
        self.link = (mesh.bandwidth[axis], mesh.latency[axis])
        self.build, self.timeout, self.progress, self.incumbent = on_stage_mesh(build, axis), timeout, progress, incumbent
        self.solver = solver
        self.start = time.monotonic()
        self.cache: dict[tuple, ModelSolution] = {}
        self.cuts: dict[tuple, list[Stage]] = {}
        self.graphs: dict[int, OpGraph] = {}
        self.problems: dict[tuple, ModelProblem] = {}
        self.warned = False

    def remaining(self) -> float | None:
        """Seconds left of the whole search's limit."""
        return None if self.timeout is None else max(1.0, self.timeout - (time.monotonic() - self.start))

    def graph(self, microbatches: int) -> OpGraph:
        """The model traced at the microbatch size of ``microbatches`` per step."""
        if microbatches not in self.graphs:
            graph = self.graph_for(microbatches)
            names = set(graph.nodes) | {n.qualname for n in graph if n.qualname}
            unknown = [name for name in self.build.get("pins") or {} if name not in names]
            if unknown:
                raise AutoshardError(f"--pin {unknown[0]}=...: no tensor or node of the model is named {unknown[0]!r}; "
                                     f"name a parameter (e.g. model.layers.0.mlp.up_proj.weight) or a graph node")
            self.graphs[microbatches] = graph
        return self.graphs[microbatches]

    def stages(self, option: PipelineOption) -> list[Stage]:
        """The devices' graphs under ``option`` (traced at its microbatch size)."""
        key = (option.microbatches, option.counts, option.devices)
        if key not in self.cuts:
            graph = self.graph(option.microbatches)
            repeated = find_repeated_layers(graph)
            if repeated is None:
                raise AutoshardError("pipelining cuts a model between its repeated layers, and this model has none "
                                     "(a ModuleList of identical blocks): plan it without --pipeline")
            self.cuts[key] = cut(graph, repeated, option.counts, option.devices)
            tied = shared_parameters([s.graph for s in self.cuts[key]])
            if tied and not self.warned:
                self.warned = True
                self.progress(f"warning: {', '.join(tied[:3])} read on several stages (tied weights) are stored on "
                              f"each and trained apart: the plan cannot run until they are untied")
        return self.cuts[key]

    def group_plans(self, searched: Searched) -> list[tuple[list[int], Plan]]:
        """Per group of alike devices, its plan on the graph of its first device under this option
        (a solution may have been found on an alike device of another option)."""
        stages = self.stages(searched.option)
        return [(devices, relabel(searched.solutions[sig].plan, searched.solutions[sig].model_problem.graph,
                                  stages[devices[0]].graph)) for sig, devices in searched.groups.items()]

    def _key(self, option: PipelineOption, stage: Stage, in_flight: int, bounded: bool,
             boundary: Mapping[str, TensorSpec]) -> tuple:
        layouts = tuple(spec.format(self.inner.ndim) for spec in boundary.values())  # by position: alike devices
        return option.microbatches, stage.signature, Fraction(in_flight, option.virtual) if bounded else None, layouts

    def stage_problem(self, option: PipelineOption, stage: Stage, in_flight: int, bounded: bool = True,
                      boundary: Mapping[str, TensorSpec] | None = None) -> ModelProblem:
        """One device's problem: its in-flight memory under the budget, or no budget at all;
        ``boundary``: the layouts it must receive and send tensors in."""
        key = self._key(option, stage, in_flight, bounded, boundary or {})
        if key not in self.problems:
            build = dict(self.build)
            names = set(stage.graph.nodes) | {n.qualname for n in stage.graph if n.qualname}
            build["pins"] = {k: v for k, v in dict(build.get("pins") or {}).items() if k in names}
            if not bounded:
                build["memory_budget"] = 1 << 62
            stage_options = StageOptions(option.microbatches, Fraction(in_flight, option.virtual), self.link,
                                         dict(boundary or {}))
            self.problems[key] = build_model_problem(stage.graph, self.inner, stage=stage_options, **build)
        return self.problems[key]

    def solve_stage(self, option: PipelineOption, stage: Stage, in_flight: int, bounded: bool,
                    share: int = 1, boundary: Mapping[str, TensorSpec] | None = None,
                    recipe: Recipe | None = None) -> ModelSolution:
        """The optimum of :meth:`stage_problem`, given ``1/share`` of the time left (with a budget,
        the incumbent's plan instead where it fits and costs less); or ``recipe``'s plan as it is,
        not solved, whether it fits or not."""
        key = self._key(option, stage, in_flight, bounded, boundary or {}) + ((recipe,) if recipe else ())
        if key in self.cache:
            return self.cache[key]
        mp = self.stage_problem(option, stage, in_flight, bounded, boundary)
        if recipe is not None:
            self.cache[key] = _as_solution(mp, recipe(mp), stage)
            return self.cache[key]
        known = _as_solution(mp, self.incumbent(mp), stage) if bounded and self.incumbent is not None else None
        if known is not None and not mp.problem.is_feasible(list(known.solution.choice)):
            known = None
        what = "bound" if not bounded else f"{in_flight}/{option.virtual} in flight" if option.virtual > 1 \
            else f"{in_flight} in flight"
        fixed = ", boundary layouts fixed" if boundary else ""
        self.progress(f"stage problem: {stage_label(stage.signature)}, {option.microbatches} microbatches, "
                      f"{what}{fixed}: {mp.problem.num_nodes} nodes")
        left = self.remaining()
        try:
            solved = solve_model_problem(mp, self.solver(default_solve_options(mp, None if left is None else left / share)),
                                         model_name=stage.graph.name)
        except AutoshardError:
            if known is None:
                raise
            solved = known
        if known is not None and known.solution.cost < solved.solution.cost:
            solved = ModelSolution(mp, replace(known.solution, lower_bound=solved.solution.lower_bound), known.plan)
        self.cache[key] = solved
        return solved

    def evaluate(self, option: PipelineOption, bounded: bool, recipe: Recipe | None = None) -> Searched:
        """The option's step (``bounded``) or its lower bound (no memory budget).

        Bounded, the first device is solved on its own and the others receive and send their
        boundary tensors in the layouts it sends in (alike devices chain the same tensor), so the
        stages agree by construction; their bound is that of their free problems without a budget,
        the first device's that of its own solve. ``recipe``: that plan on every device, not solved."""
        stages = self.stages(option)
        orders = device_orders(option.schedule, option.devices, option.microbatches, option.virtual)
        in_flight = tuple(peak_in_flight(order) for order in orders)
        searched = Searched(option, 0.0)
        for d, stage in enumerate(stages):
            searched.groups.setdefault(stage.signature, []).append(d)
        held = {sig: max(in_flight[d] for d in ds) for sig, ds in searched.groups.items()}
        if not bounded:
            for sig, ds in searched.groups.items():
                searched.solutions[sig] = self.solve_stage(option, stages[ds[0]], held[sig], False, 4)
            searched.bound = critical_path(option, stages, orders, self._times(stages, searched, lower=True))
            return searched
        first = stages[0].signature
        rest = [sig for sig in searched.groups if sig != first]
        searched.solutions[first] = self.solve_stage(option, stages[0], held[first], True, 2 * (len(rest) + 1),
                                                     recipe=recipe)
        lower = {first: _seconds(searched.solutions[first], lower=True)}
        sent = boundary_layouts(stages[0], searched.solutions[first])
        own = boundary_of(stages[0], sent)
        received = device_layouts(stages[0], searched.solutions[first])[0]
        if any(received.get(n, l) != l for n, l in own.items()):
            # an interleaved first device also receives: in the layouts it sends in
            searched.solutions[first] = self.solve_stage(option, stages[0], held[first], True, 2 * (len(rest) + 1),
                                                         own, recipe)
            lower[first] = min(lower[first], _seconds(searched.solutions[first], lower=True))
        for k, sig in enumerate(sorted(rest, key=lambda g: -held[g] * sum(g[0]))):  # the fullest first
            stage = stages[searched.groups[sig][0]]
            searched.solutions[sig] = self.solve_stage(option, stage, held[sig], True, 2 * (len(rest) - k),
                                                       boundary_of(stage, sent), recipe)
            try:
                lower[sig] = _seconds(self.solve_stage(option, stage, held[sig], False, 4), lower=True)
            except AutoshardError:  # its free problem found no plan in time: nothing bounds it from below
                lower[sig] = 0.0
        searched.mismatches = boundary_mismatches(stages, [searched.solutions[st.signature] for st in stages])
        searched.step = critical_path(option, stages, orders, self._times(stages, searched, lower=False))
        searched.bound = critical_path(option, stages, orders, [lower[st.signature] for st in stages])
        return searched

    @staticmethod
    def _times(stages: list[Stage], searched: Searched, lower: bool) -> list[float]:
        return [_seconds(searched.solutions[st.signature], lower) for st in stages]


def device_layouts(stage: Stage, solution: ModelSolution) -> tuple[dict[str, TensorSpec], dict[str, TensorSpec]]:
    """(received, returned) layouts of a device under ``solution``, which may have been solved on an
    alike device's graph: matched by position, named as on ``stage``."""
    got, gave = stage_layouts(solution.model_problem.graph, solution.plan)
    return dict(zip(stage.received, got.values())), dict(zip(stage_outputs(stage.graph), gave.values()))


def boundary_layouts(stage: Stage, solution: ModelSolution) -> dict[TensorMeta, TensorSpec]:
    """The layout the first device sends each kind (shape and dtype) of boundary tensor in."""
    sent = device_layouts(stage, solution)[1]
    return {stage.graph[name].tensor: sent[name] for name in stage.sent if stage.graph[name].tensor is not None}


def boundary_of(stage: Stage, layouts: Mapping[TensorMeta, TensorSpec]) -> dict[str, TensorSpec]:
    """The layouts ``stage`` receives and sends its boundary tensors in: those of their kind."""
    names = stage.received + (() if stage.last else stage.sent)
    return {name: layouts[stage.graph[name].tensor] for name in names if stage.graph[name].tensor in layouts}


def _as_solution(mp: ModelProblem, choice: Sequence[int], stage: Stage) -> ModelSolution:
    """A given plan of a device's problem, evaluated, as a (feasible or not) solution."""
    choice = list(choice)
    fits = mp.problem.is_feasible(choice)
    found = Solution(choice, mp.problem.cost(choice), None, "feasible" if fits else "over budget", None, 0.0, 0,
                     peak=mp.problem.peak_usage(choice))
    return ModelSolution(mp, found, make_plan(mp, choice, model=stage.graph.name))


def _seconds(solution: ModelSolution, lower: bool) -> float:
    """A device's seconds per microbatch: its plan's cost, or the solver's lower bound on it."""
    sol = solution.solution
    ticks = sol.lower_bound if lower and sol.lower_bound is not None else sol.cost
    return ticks / solution.model_problem.cost_model.ticks_per_unit


def critical_path(option: PipelineOption, stages: list[Stage], orders: list, per_device: Sequence[float]) -> float:
    """The schedule's step when device ``d`` takes ``per_device[d]`` seconds per microbatch, split
    over its stages and into forward and backward by torch's flop counts."""
    forward = [0.0] * len(option.counts)
    backward = [0.0] * len(option.counts)
    for stage, seconds in zip(stages, per_device):
        total = sum(f + b for f, b in stage.flops) or 1
        for s, (f, b) in zip(stage.stages, stage.flops):
            forward[s], backward[s] = seconds * f / total, seconds * b / total
    return timing(orders, forward, backward).step


def boundary_mismatches(stages: list[Stage], solutions: list[ModelSolution]) -> list[str]:
    """Tensors a device receives in another layout than its sender sends them in (``solutions[d]``:
    device ``d``'s, perhaps solved on an alike device's graph)."""
    received: dict[str, TensorSpec] = {}
    sent: dict[str, TensorSpec] = {}
    for stage, sol in zip(stages, solutions):
        got, gave = device_layouts(stage, sol)
        received |= got
        sent |= gave
    ndim = solutions[0].model_problem.mesh.ndim if solutions else 1
    return [f"{name} sent as {sent[name].format(ndim)}, received as {spec.format(ndim)}"
            for name, spec in received.items() if name in sent and sent[name] != spec]


def search(engine: PipelineSearch, options: Sequence[PipelineOption], seeds: Sequence[PipelineOption] = (),
           bounding_share: float = 0.4) -> PipelineResult:
    """Bound the options (within ``bounding_share`` of the time limit); take the incumbent plans of
    the ``seeds`` options (the recipe people run) as the first best; then solve the options cheapest
    bound first until no bound is below the best. Options left without a bound are solved after the
    bounded ones while time remains, and leave the claim without a bound."""
    bounds: list[Searched] = []
    unbounded: list[Searched] = []
    for k, option in enumerate(options):
        if bounds and engine.timeout is not None and time.monotonic() - engine.start > bounding_share * engine.timeout:
            engine.progress(f"no time to bound {len(options) - k} more options")
            unbounded += [Searched(o, 0.0, bounded=False) for o in options[k:]]
            break
        try:
            bounds.append(engine.evaluate(option, bounded=False))
        except AutoshardError:  # its stages found no plan in their share of the time: no bound
            engine.progress(f"not bounded in time: {option.label}")
            unbounded.append(Searched(option, 0.0, bounded=False))
            continue
        engine.progress(f"bound {format_seconds(bounds[-1].bound)}: {option.label}")
    best = _seeded(engine, seeds, {b.option: b.bound for b in bounds})
    searched: list[Searched] = []
    for entry in sorted(bounds, key=lambda b: b.bound) + unbounded:
        left = engine.remaining()
        if best is not None and (entry.bounded and entry.bound >= best.step or left is not None and left <= 1.0):
            searched.append(entry)
            continue
        try:
            solved = engine.evaluate(entry.option, bounded=True)
        except BudgetError as exc:  # proved: no plan of this option fits
            engine.progress(f"does not fit: {entry.option.label} ({exc})")
            continue
        except AutoshardError as exc:  # none found in time: its bound stays in the claim
            engine.progress(f"no plan found: {entry.option.label} ({exc})")
            entry.origin = "no plan"
            searched.append(entry)
            continue
        solved.bound = max(solved.bound, entry.bound)
        proved = " (proved)" if solved.proved else ""
        engine.progress(f"step {format_seconds(solved.step)}{proved}: {entry.option.label}")
        searched.append(solved)
        if best is None or solved.step < best.step:
            best = solved
    if best is None:
        raise AutoshardError("no pipeline option fits the memory budget: raise --memory-budget, use more "
                             "microbatches, or a larger mesh")
    lower = 0.0 if unbounded else min(s.step if s.proved else s.bound for s in searched)
    return PipelineResult(best, searched, min(lower, best.step), time.monotonic() - engine.start, len(unbounded))


def _seeded(engine: PipelineSearch, seeds: Sequence[PipelineOption], bounds: Mapping[PipelineOption, float]
            ) -> Searched | None:
    """The best of the seed options under the incumbent plans alone (no solving), or None."""
    best = None
    for option in seeds if engine.incumbent is not None else ():
        seeded = engine.evaluate(option, bounded=True, recipe=engine.incumbent)
        if not seeded.fits:
            engine.progress(f"the baseline plan does not fit the budget: {option.label}")
            continue
        seeded.bound, seeded.origin = bounds.get(option, 0.0), "baseline"
        engine.progress(f"baseline step {format_seconds(seeded.step)}: {option.label}")
        if best is None or seeded.step < best.step:
            best = seeded
    return best
