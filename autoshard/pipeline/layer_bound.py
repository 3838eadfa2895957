"""A lower bound on a pipeline device's time per microbatch from its parts: its ends (the ops
outside the repeated layers with the first and last layer of each stage) and one layer times its
further layers, both solved on the option shortened to two layers per stage.

Formulation. Without a memory budget a device's problem is

    min_s C(s),   C(s) = sum_i c_i(s_i) + sum_{(u,v) in E} M_uv(s_u, s_v),   c_i >= 0, M_uv >= 0.

Group its nodes: G_0 everything outside the repeated layers (the embedding, the head and loss,
received inputs, the output), G_l per layer l (the nodes of its module path, the parameters it
holds included, and the memory and reshard-copy nodes that follow them). Let A be G_0 with the
first and last layer of each stage (``sampled`` = 2 v layers on a device of v stages) and B the
other ``n - sampled`` layers. Dropping every edge between two different layers drops
non-negative terms and leaves A's problem (its edges to the outside kept) and one problem per
layer of B, so

    min C  >=  min C_A' + sum_{l in B} min C_l,

C_A' being A's problem without the edges between its layers. The layers are identical and,
without a budget, what a layer costs does not depend on where it sits (its strategies, compute
costs and edge prices are its own ops'; the overlap rule prices a parameter's traffic against its
twin in the neighbouring layer, the same for every layer of a run of two or more), so every
min C_l is one number, the layer floor, and

    min C  >=  min C_A' + (n - sampled) * layer floor.

Both are read off the same device of the option shortened to two layers per stage
(:func:`shortened`, :class:`LayerFloors`): its whole problem is A, with the same nodes outside the
layers and the same first and last layers, and its layers give the layer floor (the least
optimum over them). Each distinct problem is solved once, exactly or to its solver's lower bound
(:func:`part_floors`). ``tests/pipeline/test_layer_bound.py`` checks the bound against the exact
optimum of whole device problems, and the full device's parts against the shortened device's,
problem for problem.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence

import numpy as np

from autoshard.frontend.graph import RECEIVED, OpGraph
from autoshard.pipeline.budget_bound import DeviceParts, Part, digest, slot_rows
from autoshard.pipeline.multipliers import Grid, best_multipliers
from autoshard.pipeline.deadline import TimeLimit
from autoshard.problem.build import ModelProblem
from autoshard.pipeline.stages import Stage, cut
from autoshard.sharding.layers import RepeatedLayers, find_repeated_layers
from autoshard.solver import SolveOptions, solve
from autoshard.solver.model.problem import ShardingProblem

if TYPE_CHECKING:
    from autoshard.pipeline.options import PipelineOption

OUTSIDE = -1
"""The group of the nodes outside every repeated layer."""


@dataclass(frozen=True)
class PartFloors:
    """What every plan of a device costs at least, in ticks: its ends (``ends``: the nodes outside
    the layers with the first and last layer of each stage, ``sampled`` layers in all) and each
    further layer (``layer``)."""

    ends: int
    layer: int
    sampled: int

    def device(self, layers: int) -> int:
        """The bound on a device running ``layers`` layers: ``ends + (layers - sampled) * layer``."""
        return self.ends + (layers - self.sampled) * self.layer


def shortened(graph: OpGraph, repeated: RepeatedLayers, keep: int) -> OpGraph:
    """``graph`` with its first ``keep`` repeated layers only: the ops after the layers read the
    last kept layer's node where they read the last layer's (same position in the layer)."""
    if not 1 <= keep <= repeated.count:
        raise ValueError(f"cannot keep {keep} of {repeated.count} layers")
    dropped = {name for layer in repeated.layers[keep:] for name in layer}
    moved = dict(zip(repeated.layers[-1], repeated.layers[keep - 1]))
    nodes = {}
    for node in graph:
        if node.name in dropped:
            continue
        inputs = tuple(moved.get(src, src) for src in node.inputs)
        nodes[node.name] = node if inputs == node.inputs else replace(node, inputs=inputs)
    short = OpGraph(nodes, graph.frontend, graph.module, graph.frontend_note)
    short.name = getattr(graph, "name", "") or "model"
    return short


def node_groups(mp: ModelProblem, layer_of: Mapping[str, int]) -> list[int]:
    """Per problem node, its layer (``layer_of`` by graph node name) or :data:`OUTSIDE`: graph
    tensors by name (a received input, named as its producer in an earlier stage, is outside),
    memory nodes with their owner, an edge's copy nodes with the edge's reader."""
    groups = [OUTSIDE if mp.graph[name].attrs.get(RECEIVED) else layer_of.get(name, OUTSIDE) for name in mp.names]
    groups += [groups[owner] for owner in mp.aux_owner]
    for copies in mp.reshards:
        groups += [layer_of.get(copies.dst, OUTSIDE)] * len(copies.intervals)
    if len(groups) != mp.problem.num_nodes:
        raise ValueError(f"{len(groups)} groups for the {mp.problem.num_nodes} nodes of {mp.problem.name}")
    return groups


def subproblem(problem: ShardingProblem, nodes: Sequence[int]) -> ShardingProblem:
    """The problem on ``nodes`` alone: their costs and the edges between them, no memory limit."""
    local = {n: k for k, n in enumerate(nodes)}
    edges, matrices = [], []
    for (u, v), matrix in zip(problem.edges, problem.edge_costs):
        if u in local and v in local:
            edges.append((local[u], local[v]))
            matrices.append(matrix)
    return ShardingProblem([problem.node_costs[n] for n in nodes], [problem.node_usages[n] for n in nodes],
                           [problem.intervals[n] for n in nodes], edges, matrices, None, problem.name,
                           [problem.node_name(n) for n in nodes])


def _digest(problem: ShardingProblem) -> str:
    """Equal for equal problems (costs, edges and matrices; names and memory aside)."""
    h = hashlib.sha1()
    for costs in problem.node_costs:
        h.update(np.ascontiguousarray(costs).tobytes() + b"|")
    for (u, v), matrix in zip(problem.edges, problem.edge_costs):
        h.update(f"{u},{v},{matrix.shape}".encode() + np.ascontiguousarray(matrix).tobytes())
    return h.hexdigest()


def part_floors(problem: ShardingProblem, groups: Sequence[int], floor: Callable[[ShardingProblem], int]
                ) -> PartFloors:
    """The shortened device's :class:`PartFloors` (module formulation): ``floor`` of the whole
    problem without the edges between two layers (``ends``), and the least ``floor`` over its
    layers alone (``layer``), each distinct layer problem solved once. ``floor`` must return at
    most a problem's optimum (its cost when proved, else a proved lower bound)."""
    for (u, v), matrix in zip(problem.edges, problem.edge_costs):
        if groups[u] != groups[v] and matrix.size and matrix.min() < 0:
            raise ValueError(f"edge {problem.node_name(u)} -> {problem.node_name(v)} has a negative price: "
                             f"dropping it would not bound the problem from below")
    members: dict[int, list[int]] = {}
    for node, group in enumerate(groups):
        members.setdefault(group, []).append(node)
    layers = [g for g in members if g != OUTSIDE]
    if not layers:
        raise ValueError(f"{problem.name} has no repeated layers to split off")
    apart = [k for k, (u, v) in enumerate(problem.edges) if OUTSIDE != groups[u] != groups[v] != OUTSIDE]
    ends = floor(without_edges(problem, apart))
    solved: dict[str, int] = {}
    for group in layers:
        part = subproblem(problem, members[group])
        key = _digest(part)
        if key not in solved:
            solved[key] = floor(part)
    return PartFloors(ends, min(solved.values()), len(layers))


def without_edges(problem: ShardingProblem, dropped: Sequence[int]) -> ShardingProblem:
    """The problem less the edges at positions ``dropped``, no memory limit."""
    gone = set(dropped)
    kept = [k for k in range(len(problem.edges)) if k not in gone]
    return ShardingProblem(problem.node_costs, problem.node_usages, problem.intervals, [problem.edges[k] for k in kept],
                           [problem.edge_costs[k] for k in kept], None, problem.name, problem.node_names)


SAMPLE = 2
"""Layers per stage of the shortened option: a layer first in its stage and one after it."""


class StageProblems(Protocol):
    """What :class:`LayerFloors` reads of the pipeline search (``search.PipelineSearch``, which
    imports this module): its time limit, the model traced per microbatch count, and one device's problem."""

    limit: TimeLimit

    def graph(self, microbatches: int) -> OpGraph: ...

    def stage_problem(self, option: PipelineOption, stage: Stage, in_flight: int, bounded: bool = True,
                      boundary: Mapping | None = None, kept: bool = True) -> ModelProblem: ...


class LayerFloors:
    """Lower bounds on the devices' seconds per microbatch, each from the same device of the option
    shortened to :data:`SAMPLE` layers per stage: without a memory budget (module formulation), or
    under ``limit`` live bytes with the device's microbatches in flight (``budget_bound.py``). The shortened devices are built once per microbatch count, schedule shape,
    device and parameter policy; their parts are solved once each, and a part equal to another
    device's (same costs, edges and bytes held) is the same part. ``engine`` gives the graphs and
    device problems it reads; ``floor`` returns at most a part's optimum, in ticks."""

    def __init__(self, engine: StageProblems, floor: Callable[[ShardingProblem], int], limit: int | None = None) -> None:
        self.engine, self.floor, self.limit = engine, floor, limit
        self.graphs: dict[tuple[int, int], tuple[OpGraph, RepeatedLayers] | None] = {}
        self.layer_of: dict[int, dict[str, int]] = {}  # per microbatch count: every layer's node names
        self.devices: dict[tuple, tuple[ModelProblem, list[int]] | None] = {}
        self.parts: dict[tuple, PartFloors] = {}
        self.budgeted: dict[tuple, DeviceParts] = {}
        self.shared: dict[str, Part] = {}
        self.grids: dict[tuple[int, bool], Grid] = {}

    def seconds(self, option: PipelineOption, stage: Stage, kept: bool, in_flight: int | None = None,
                enough: float = math.inf) -> float | None:
        """At most the device's seconds per microbatch under ``option`` with its parameters kept
        gathered (``kept``) or gathered per microbatch: with ``in_flight`` (its peak count of
        forwards awaiting their backward, as the search builds its problem) and a budget, from its
        parts under the budget (``budget_bound.py``; their minimum without penalty is the free
        bound of the parts; its search stops once it reaches ``enough`` seconds), else from its
        parts without a budget (module formulation). None where the model has too few layers to
        shorten."""
        key = (option.microbatches, option.devices, option.virtual, stage.stages[0], kept)
        found = self._device(option, stage.stages[0], kept)
        if found is None or min(stage.counts) < SAMPLE:
            return None
        mp, groups = found
        if in_flight is not None and self.limit is not None:
            extra = Fraction(in_flight, option.virtual) - 1
            if key + (extra,) not in self.budgeted:
                self.budgeted[key + (extra,)] = self._split(mp, groups, extra)
            further = sum(stage.counts) - len(set(groups) - {OUTSIDE})
            grid = self.grids.setdefault((option.microbatches, kept), Grid())
            ticks = mp.cost_model.ticks_per_unit
            return best_multipliers(self.budgeted[key + (extra,)], further, self.limit, grid, enough * ticks) / ticks
        if key not in self.parts:
            self.parts[key] = part_floors(mp.problem, groups, self.floor)
        return self.parts[key].device(sum(stage.counts)) / mp.cost_model.ticks_per_unit

    def _device(self, option: PipelineOption, device: int, kept: bool) -> tuple[ModelProblem, list[int]] | None:
        """``device`` of the shortened option: its problem without a budget, one microbatch in
        flight, and its nodes' groups; None for a model with too few layers."""
        key = (option.microbatches, option.devices, option.virtual, device, kept)
        if key in self.devices:
            return self.devices[key]
        keep = SAMPLE * len(option.counts)
        if (option.microbatches, keep) not in self.graphs:
            graph = self.engine.graph(option.microbatches)
            repeated = find_repeated_layers(graph)
            enough = repeated is not None and repeated.count >= keep
            self.graphs[(option.microbatches, keep)] = (shortened(graph, repeated, keep), RepeatedLayers(
                repeated.container, repeated.layers[:keep])) if enough else None
            if enough:
                self.layer_of[option.microbatches] = {name: i for i, layer in enumerate(repeated.layers)
                                                      for name in layer}
        if self.graphs[(option.microbatches, keep)] is None:
            self.devices[key] = None
            return None
        graph, layers = self.graphs[(option.microbatches, keep)]
        short = replace(option, counts=(SAMPLE,) * len(option.counts))
        stage = cut(graph, layers, short.counts, short.devices)[device]
        mp = self.engine.stage_problem(short, stage, short.virtual, bounded=False, kept=kept)
        # the engine hands alike devices one problem (``Stage.signature``): it may be a device of
        # the whole model with these layer counts, named by its own layers, so groups are read
        # by every layer's names, the shortened graph's being the first of them
        self.devices[key] = (mp, node_groups(mp, self.layer_of[option.microbatches]))
        return self.devices[key]

    def _split(self, mp: ModelProblem, groups: Sequence[int], extra: Fraction) -> DeviceParts:
        """The device's parts with their bytes at the slots of ``budget_bound.SLOTS`` under ``extra``
        more microbatches in flight (``budget_bound.py``), each distinct part made once; the
        further layers are priced as the first sampled layer of a stage (:func:`first_layers`)."""
        held = slot_rows(mp, extra)
        members: dict[int, list[int]] = {}
        for node, group in enumerate(groups):
            members.setdefault(group, []).append(node)
        firsts = first_layers(groups)
        once, layers, matrices = [], [], {}
        for group, nodes in members.items():
            part, rows = subproblem(mp.problem, nodes), [held[n] for n in nodes]
            key = digest(part, rows, matrices)  # ``mp`` holds every matrix of its parts
            if key not in self.shared:
                self.shared[key] = Part(part, rows, self.floor)
            once.append(self.shared[key])
            if group in firsts:
                layers.append(self.shared[key])
        return DeviceParts(tuple(once), tuple(dict.fromkeys(layers)),
                           lambda: self.engine.limit.check("bounding a device under its memory budget"))


def first_layers(groups: Sequence[int]) -> set[int]:
    """Of a shortened device's layer groups (:data:`SAMPLE` consecutive layers per stage, stages in
    layer order), the first layer of each stage: the one every middle layer of a full stage is,
    bytes at the slots of ``budget_bound.SLOTS`` included (a stage's last layer hands its output
    off the stage and holds less across the horizon)."""
    layers = sorted(set(groups) - {OUTSIDE})
    if len(layers) % SAMPLE:
        raise ValueError(f"{len(layers)} layers on a device of {SAMPLE} layers per stage")
    return set(layers[::SAMPLE])


def whole_floor(graph: OpGraph, build: Callable[[OpGraph], ModelProblem], floor: Callable[[ShardingProblem], int]
                ) -> float | None:
    """At most the seconds of every plan of the whole (unpipelined) model without a memory budget:
    one stage, so ``ends + (n - 2) * layer`` from the model shortened to :data:`SAMPLE` layers,
    ``build`` giving its problem without a budget; None for a model without enough repeated layers."""
    repeated = find_repeated_layers(graph)
    if repeated is None or repeated.count < SAMPLE:
        return None
    mp = build(shortened(graph, repeated, SAMPLE))
    layer_of = {name: i for i, layer in enumerate(repeated.layers[:SAMPLE]) for name in layer}
    parts = part_floors(mp.problem, node_groups(mp, layer_of), floor)
    return parts.device(repeated.count) / mp.cost_model.ticks_per_unit


def solved_floor(limit: TimeLimit) -> Callable[[ShardingProblem], int]:
    """A part's floor by the solver within the seconds ``limit`` leaves: its cost where proved
    optimal, else its proved lower bound (0 where it proved none); ``SearchTimeout`` once none are left."""
    def floor(part: ShardingProblem) -> int:
        limit.check("bounding a layer")
        found = solve(part, SolveOptions(timeout=limit.remaining()))
        return found.cost if found.status == "optimal" else found.lower_bound or 0
    return floor
