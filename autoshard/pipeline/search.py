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
Each device also decides its parameter policy (``choose_stage``): keep its parameters gathered
over the step's ``m`` microbatches (FSDP2's ``reshard_after_forward=False`` under
torch.distributed.pipelining: one gather and one gradient reduction per step, charged to
``T_d`` as ``1/m`` of their time; the gathered copies and accumulated gradients held all step),
or gather them per microbatch (their traffic paid every microbatch, their copies freed between);
the better fitting plan of the two is taken, and its bound is the lesser of the two bounds.
(Known simplification: the critical path spreads the once-per-step traffic evenly over the
microbatches, so it is overcharged by the schedule's bubble share.)
``T_d`` is split over the device's stages and into forward and backward by torch's flop counts;
the step is the critical path of the schedule (``schedules.timing``), a non-decreasing function
of every ``T_d``. Devices share nothing but the tensors they pass on, which must leave and arrive
in one layout: the *lead* device, the one that weighs most on the step (``stages.path_weights``:
``dS/dT_d``; not the last, which sends nothing on), is solved freely, the others with each
boundary tensor fixed to the layout the lead sends its kind (shape, dtype) in (``boundary_of``; a
lead that also receives is solved again with its received tensors fixed so too), each solve
given the time left in proportion to its weight; the plans are checked to agree
(``Searched.mismatches``).

Search (``claim.py``). Every option first gets a lower bound: its critical path with each ``T_d``
bounded without fixed layouts, which can only be cheaper: from the device's parts on the option
shortened to two layers per stage, under its memory budget with its microbatches in flight
(``budget_bound.py``: a Lagrangian relaxation of the memory at the first backward slot and at the
optimizer step, over the parts outside the layers, the sampled layers and the further layers
times the cheapest layer), or without a budget where there is none (``layer_bound.py``), else
from the device's whole problem without a budget. Options are then solved in order of bound
until the best step found is no more than the next bound; an option whose bound reaches the
best step is ruled out unsolved, and its bounding stops as soon as the devices bounded so far
rule it out. A solved option's bound is its critical path over the lead's solver bound and the
others' bounds as above. The result is the optimum over the enumerated options when the
best step meets every bound; otherwise the claim is the best step, the least bound and the gap.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from typing import Any, Callable, Mapping, Sequence

from autoshard.api import (BudgetError, ModelSolution, StageOptions, build_model_problem, default_solve_options,
                           solve_model_problem)
from autoshard.errors import AutoshardError
from autoshard.pipeline.deadline import TimeLimit
from autoshard.pipeline.plans import relabel
from autoshard.pipeline.results import Searched
from autoshard.problem.build import ModelProblem
from autoshard.problem.baselines.torchtitan import torchtitan_choice
from autoshard.problem.plan import Plan
from autoshard.problem.readback import make_plan
from autoshard.solver import Solution, SolveOptions
from autoshard.solver.procs.clock import MONOTONIC, Clock
from autoshard.frontend.graph import OpGraph
from autoshard.pipeline.options import PipelineOption, on_stage_mesh, stage_label
from autoshard.pipeline.schedules import device_orders, peak_in_flight
from autoshard.pipeline.budget_bound import live_budget
from autoshard.pipeline.layer_bound import LayerFloors, solved_floor
from autoshard.pipeline.option_bound import option_bound
from autoshard.pipeline.boundaries import boundary_layouts, boundary_mismatches, boundary_of, device_layouts
from autoshard.pipeline.stages import Stage, critical_path, cut, path_weights, shared_parameters
from autoshard.sharding.layers import find_repeated_layers
from autoshard.sharding.mesh import Mesh
from autoshard.sharding.spec import TensorSpec


OPTION_SHARE = 0.7
"""The share of the time left that solving one option's devices takes (the rest: bounding the
other options at its step, and solving those that stay below it)."""

Recipe = Callable[[ModelProblem], list[int]]
"""A hand-written plan of a device's problem (torchtitan's: ``torchtitan_choice``)."""


class PipelineSearch:
    """Solves the options of one model on one mesh (stage problems cached by what makes them alike).

    ``build``: the options of ``build_model_problem`` as given on the whole mesh (restated on the
    stages' mesh by ``on_stage_mesh``); ``solver`` adjusts each stage's default solve options.
    ``timeout``: seconds for the whole search, read on ``clock``: every build stops at it, every
    solve gets a share of what is left, and past it a build or solve raises ``SearchTimeout``."""

    def __init__(self, graph_for: Callable[[int], OpGraph], mesh: Mesh, axis: int, build: Mapping[str, Any],
                 timeout: float | None, progress: Callable[[str], None] = lambda line: None,
                 incumbent: Recipe | None = torchtitan_choice,
                 solver: Callable[[SolveOptions], SolveOptions] = lambda options: options,
                 clock: Clock = MONOTONIC) -> None:
        if build.get("mode", "inference") != "training":
            raise AutoshardError("--pipeline plans training steps (forwards and backwards of microbatches): "
                                 "add --mode training")
        if not 0 <= axis < mesh.ndim or mesh.ndim < 2:
            raise AutoshardError(f"--pipeline {axis} is not an axis of the {mesh.ndim}-D mesh {mesh.label} that "
                                 f"leaves another: pipeline over one axis of a mesh with two or more")
        self.graph_for, self.mesh, self.axis = graph_for, mesh, axis
        self.inner = mesh.without_axis(axis)
        self.link = (mesh.bandwidth[axis], mesh.latency[axis])
        self.build, self.progress, self.incumbent = on_stage_mesh(build, axis), progress, incumbent
        self.solver, self.limit = solver, TimeLimit(timeout, clock)
        self.cache: dict[tuple, ModelSolution] = {}
        self.cuts: dict[tuple, list[Stage]] = {}
        self.graphs: dict[int, OpGraph] = {}
        self.problems: dict[tuple, ModelProblem] = {}
        self.floors = LayerFloors(self, solved_floor(self.limit), live_budget(self.build))
        self.warned = False

    def graph(self, microbatches: int) -> OpGraph:
        """The model traced at the microbatch size of ``microbatches`` per step."""
        if microbatches not in self.graphs:
            self.limit.check(f"tracing the model at {microbatches} microbatches")
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

    def group_plans(self, searched: Searched) -> list[tuple[list[int], Plan, bool]]:
        """Per group of alike devices, its plan on the graph of its first device under this option
        (a solution may have been found on an alike device of another option) and whether it keeps
        its parameters gathered over the step."""
        stages = self.stages(searched.option)
        return [(devices, relabel(searched.solutions[sig].plan, searched.solutions[sig].model_problem.graph,
                                  stages[devices[0]].graph), kept_gathered(searched.solutions[sig]))
                for sig, devices in searched.groups.items()]

    def _key(self, option: PipelineOption, stage: Stage, in_flight: int, bounded: bool,
             boundary: Mapping[str, TensorSpec], kept: bool) -> tuple:
        layouts = tuple(spec.format(self.inner.ndim) for spec in boundary.values())  # by position: alike devices
        return (option.microbatches, stage.signature, Fraction(in_flight, option.virtual) if bounded else None,
                layouts, kept)

    def stage_problem(self, option: PipelineOption, stage: Stage, in_flight: int, bounded: bool = True,
                      boundary: Mapping[str, TensorSpec] | None = None, kept: bool = True) -> ModelProblem:
        """One device's problem: its in-flight memory under the budget, or no budget at all;
        ``boundary``: the layouts it must receive and send tensors in; ``kept``: its parameters
        kept gathered over the step (else gathered per microbatch)."""
        key = self._key(option, stage, in_flight, bounded, boundary or {}, kept)
        if key not in self.problems:
            build = dict(self.build)
            names = set(stage.graph.nodes) | {n.qualname for n in stage.graph if n.qualname}
            build["pins"] = {k: v for k, v in dict(build.get("pins") or {}).items() if k in names}
            if not bounded:
                build["memory_budget"] = 1 << 62
            stage_options = StageOptions(option.microbatches, Fraction(in_flight, option.virtual), self.link,
                                         dict(boundary or {}), kept)
            with self.limit.builds(f"building a device problem of {option.label}"):
                self.problems[key] = build_model_problem(stage.graph, self.inner, stage=stage_options, **build)
        return self.problems[key]

    def choose_stage(self, option: PipelineOption, stage: Stage, in_flight: int, share: float = 1,
                     boundary: Mapping[str, TensorSpec] | None = None,
                     recipe: Recipe | None = None) -> tuple[ModelSolution, float]:
        """The device's better plan over its two parameter policies, kept gathered over the step or
        gathered per microbatch, and the least lower bound (seconds per microbatch) over both. The
        per-microbatch problem is solved only where its bound without a budget is below the kept
        plan's time, and while the time left would still give the ``share - 1`` solves after it
        (this device's and the devices' still to come) as long as the kept one took; a policy not
        solved, or solved without a plan in time, bounds only by its problem without a budget (0
        where that has none). ``recipe`` (torchtitan's) keeps them gathered, as torchtitan does under PP."""
        if recipe is not None:
            found = self.solve_stage(option, stage, in_flight, True, share, boundary, recipe, kept=True)
            return found, _seconds(found, lower=True)
        found: ModelSolution | None = None
        floor, failure, spent = float("inf"), None, 0.0
        for kept in (True, False):
            if found is not None:
                free = self.device_floor(option, stage, in_flight, kept)
                if free is not None and free >= _seconds(found, lower=False):
                    floor = min(floor, free)  # pruned: its bound is no better
                    continue
                left = self.limit.remaining()
                if left is not None and left < spent * (share - 1):
                    self.progress(f"no time for parameters gathered per microbatch: {stage_label(stage.signature)}")
                    floor = min(floor, 0.0 if free is None else free)
                    continue
            began = self.limit.clock()
            try:
                solved = self.solve_stage(option, stage, in_flight, True, share, boundary, kept=kept)
            except AutoshardError as exc:  # BudgetError: proved not to fit; else no plan in time
                # proved not to fit only when both policies are: a policy cut short by time proves nothing
                failure = exc if failure is None or isinstance(failure, BudgetError) else failure
                if not isinstance(exc, BudgetError):
                    floor = min(floor, self.device_floor(option, stage, in_flight, kept) or 0.0)
                continue
            spent = self.limit.clock() - began
            floor = min(floor, _seconds(solved, lower=True))
            if found is None or _seconds(solved, lower=False) < _seconds(found, lower=False):
                found = solved
        if found is None:
            raise failure
        return found, floor

    def device_floor(self, option: PipelineOption, stage: Stage, in_flight: int, kept: bool,
                     enough: float = float("inf")) -> float | None:
        """At most the device's seconds per microbatch under one parameter policy with ``in_flight``
        microbatches held, whatever its boundary layouts: from its parts on the shortened option,
        without a budget and under it (``layer_bound.py``, ``budget_bound.py``), else from its
        whole problem without a budget (``enough``: a bound at least this much may stop there);
        None when that found no plan in time."""
        try:
            parts = self.floors.seconds(option, stage, kept, in_flight, enough)
            if parts is not None:
                return parts
            return _seconds(self.solve_stage(option, stage, in_flight, False, 4, kept=kept), lower=True)
        except AutoshardError:
            return None

    def solve_stage(self, option: PipelineOption, stage: Stage, in_flight: int, bounded: bool,
                    share: float = 1, boundary: Mapping[str, TensorSpec] | None = None,
                    recipe: Recipe | None = None, kept: bool = True) -> ModelSolution:
        """The optimum of :meth:`stage_problem`, given ``1/share`` of the time left (with a budget,
        the incumbent's plan instead where it fits and costs less); or ``recipe``'s plan as it is,
        not solved, whether it fits or not."""
        key = self._key(option, stage, in_flight, bounded, boundary or {}, kept) + ((recipe,) if recipe else ())
        if key in self.cache:
            return self.cache[key]
        mp = self.stage_problem(option, stage, in_flight, bounded, boundary, kept)
        if recipe is not None:
            self.cache[key] = _as_solution(mp, recipe(mp), stage)
            return self.cache[key]
        known = _as_solution(mp, self.incumbent(mp), stage) if bounded and self.incumbent is not None else None
        if known is not None and not mp.problem.is_feasible(list(known.solution.choice)):
            known = None
        what = "bound" if not bounded else f"{in_flight}/{option.virtual} in flight" if option.virtual > 1 \
            else f"{in_flight} in flight"
        fixed = ", boundary layouts fixed" if boundary else ""
        policy = "parameters kept gathered" if kept else "parameters gathered per microbatch"
        self.progress(f"stage problem: {stage_label(stage.signature)}, {option.microbatches} microbatches, "
                      f"{what}{fixed}, {policy}: {mp.problem.num_nodes} nodes")
        try:
            self.limit.check(f"solving a device problem of {option.label}")
            left = self.limit.remaining()
            solved = solve_model_problem(mp, self.solver(default_solve_options(mp, None if left is None else left / share)),
                                         model_name=stage.graph.name)
        except AutoshardError:
            if known is None:
                raise
            solved = known
        late = {phase: seconds for phase, seconds in solved.solution.overruns.items() if seconds > 1.0}
        if late:
            self.progress("solver past its share by " + ", ".join(f"{s:.1f} s in {p}" for p, s in late.items()))
        if known is not None and known.solution.cost < solved.solution.cost:
            solved = ModelSolution(mp, replace(known.solution, lower_bound=solved.solution.lower_bound), known.plan)
        self.cache[key] = solved
        return solved

    def evaluate(self, option: PipelineOption, bounded: bool, recipe: Recipe | None = None,
                 cutoff: float = float("inf")) -> Searched:
        """The option's step (``bounded``) or its lower bound (``option_bound.py``: ``device_floor``
        per device, the fullest devices first, each searched no further than ruling the option out
        at ``cutoff`` needs; once the critical path over those bounded so far, the others at 0,
        reaches ``cutoff``, that is its bound and the rest are left unbounded).

        Bounded, the lead device is solved on its own and the others receive and send their
        boundary tensors in the layouts it sends in (alike devices chain the same tensor), so the
        stages agree by construction; their bound is that of their free problems without a budget,
        the lead's that of its own solve. ``recipe``: that plan on every device, not solved
        (its bound then 0, its origin ``baseline``)."""
        stages = self.stages(option)
        orders = device_orders(option.schedule, option.devices, option.microbatches, option.virtual)
        in_flight = tuple(peak_in_flight(order) for order in orders)
        searched = Searched(option, 0.0, origin="search" if recipe is None else "baseline")
        for d, stage in enumerate(stages):
            searched.groups.setdefault(stage.signature, []).append(d)
        held = {sig: max(in_flight[d] for d in ds) for sig, ds in searched.groups.items()}
        if not bounded:
            floor = lambda stage, held, kept, enough: self.device_floor(option, stage, held, kept, enough)  # noqa: E731
            searched.bound = option_bound(floor, option.label, stages, len(option.counts), orders, searched.groups,
                                          held, cutoff)
            return searched
        # memory-free floors, one per group of alike devices: the devices' likely times (a recipe is not solved)
        free = {} if recipe is not None else {sig: self.device_floor(option, stages[ds[0]], held[sig], True, 0.0)
                                              for sig, ds in searched.groups.items()}
        known = bool(free) and all(t is not None and 0 < t < math.inf for t in free.values())
        weights = path_weights(len(option.counts), stages, orders, searched.groups,
                               [free[st.signature] for st in stages] if known else None)
        order = sorted(searched.groups, key=lambda g: (g[2], -weights[g]))  # a last device sends nothing to fix
        lead, lead_stage = order[0], stages[searched.groups[order[0]][0]]
        share = self._shares(weights)
        searched.solutions[lead], floor = self.choose_stage(option, lead_stage, held[lead], share(lead), recipe=recipe)
        lower = {lead: floor}
        sent = boundary_layouts(lead_stage, searched.solutions[lead])
        own = boundary_of(lead_stage, sent)
        received = device_layouts(lead_stage, searched.solutions[lead])[0]
        if any(received.get(n, l) != l for n, l in own.items()):  # it also receives: in the layouts it sends in
            searched.solutions[lead], floor = self.choose_stage(option, lead_stage, held[lead], share(lead), own, recipe)
            lower[lead] = min(lower[lead], floor)
        for sig in order[1:]:
            stage = stages[searched.groups[sig][0]]
            searched.solutions[sig] = self.choose_stage(option, stage, held[sig], share(sig), boundary_of(stage, sent),
                                                        recipe)[0]
            if recipe is None:
                free = [self.device_floor(option, stage, held[sig], kept) for kept in (True, False)]
                # a free problem without a plan in time bounds nothing from below
                lower[sig] = 0.0 if None in free else min(free)
        searched.mismatches = boundary_mismatches(stages, [searched.solutions[st.signature] for st in stages])
        searched.step = critical_path(len(option.counts), stages, orders, self._times(stages, searched))
        if recipe is None:  # a recipe's plans, not solved, bound nothing
            searched.bound = critical_path(len(option.counts), stages, orders, [lower[st.signature] for st in stages])
        return searched

    def _shares(self, weights: Mapping[tuple, float]) -> Callable[[tuple], float]:
        """Each group's share of the time left when its solve starts (``solve_stage``'s divisor):
        :data:`OPTION_SHARE` of the time left now, split by the groups' weights."""
        left, total = self.limit.remaining(), sum(weights.values())
        return lambda sig: 1.0 if left is None else max(1.0, (self.limit.remaining() or 0.0) /
                                                        max(OPTION_SHARE * left * weights[sig] / total, 1e-9))

    @staticmethod
    def _times(stages: list[Stage], searched: Searched) -> list[float]:
        return [_seconds(searched.solutions[st.signature], lower=False) for st in stages]


def kept_gathered(solution: ModelSolution) -> bool:
    """Whether a device's plan keeps its parameters gathered over the step's microbatches."""
    return solution.model_problem.options.kept_over > 0


def _as_solution(mp: ModelProblem, choice: Sequence[int], stage: Stage) -> ModelSolution:
    """A given plan of a device's problem, evaluated, as a (feasible or not) solution."""
    choice = list(choice)
    fits = mp.problem.is_feasible(choice)
    found = Solution(choice, mp.problem.cost(choice), None, "feasible" if fits else "over budget", None, 0.0, 0,
                     peak=mp.problem.peak_usage(choice))
    return ModelSolution(mp, found, make_plan(mp, choice, model=stage.graph.name))


def _seconds(solution: ModelSolution, lower: bool) -> float:
    """A device's seconds per microbatch: its plan's cost, or what is proved below it (:func:`floor_ticks`)."""
    ticks = floor_ticks(solution.solution) if lower else solution.solution.cost
    return ticks / solution.model_problem.cost_model.ticks_per_unit


def floor_ticks(solution: Solution) -> int:
    """What is proved below every plan: the solver's lower bound, the cost of a plan proved optimal,
    else 0 (a plan found without a bound, or a recipe's plan taken as it is, bounds nothing)."""
    if solution.lower_bound is not None:
        return solution.lower_bound
    return solution.cost if solution.status == "optimal" else 0
