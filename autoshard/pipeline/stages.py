"""Cut a traced model into pipeline stages: contiguous runs of its repeated layers, the ops before
them (the embedding) on the first stage and those after them (the head and the loss) on the last.

A stage is an OpGraph of its own, so it is planned as any model is. What it reads from an earlier
stage becomes a *received* input (``attrs["received"]``: sent point to point, in the layout the
stage reads it in, its gradient sent back); what a later stage reads becomes one of its outputs.
Parameters and buffers go to every stage that reads them (a weight read on two stages, tied
embeddings, is then stored on both: ``shared_parameters`` names them). Ops that no gradient
flows through and that read no earlier-stage activation (masks, positions, rotary tables) are
recomputed where they are needed rather than sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import networkx as nx

from autoshard.errors import AutoshardError
from autoshard.frontend.graph import RECEIVED, NodeKind, OpGraph, OpNode
from autoshard.pipeline.schedules import timing
from autoshard.problem.plan import Plan
from autoshard.sharding.layers import RepeatedLayers
from autoshard.sharding.spec import TensorSpec


@dataclass(frozen=True)
class Stage:
    """One device of a pipeline: its graph (sharing the whole model's traced module, which the
    executor runs its nodes with and torch's local flop counts replay), what it receives and sends,
    and per pipeline stage it runs (``stages``: several when interleaved) its layer count and
    torch's (forward, backward) flops."""

    graph: OpGraph
    received: tuple[str, ...]
    sent: tuple[str, ...]
    stages: tuple[int, ...]
    counts: tuple[int, ...]
    flops: tuple[tuple[int, int], ...]
    first: bool
    last: bool

    @property
    def signature(self) -> tuple[tuple[int, ...], bool, bool]:
        """Devices with equal signatures have alike problems: their layers per stage, and whether
        they hold the embedding (the first stage) and the head (the last)."""
        return self.counts, self.first, self.last


def even_cuts(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage as even as possible, the remainder given to the middle stages (the first
    and last also hold the embedding and the head)."""
    if stages > layers:
        raise AutoshardError(f"{stages} pipeline stages need at least {stages} repeated layers, the model has "
                             f"{layers}: use a smaller pipeline degree or fewer virtual stages")
    base, extra = divmod(layers, stages)
    middle = list(range(1, stages - 1)) or list(range(stages))
    bonus = set(sorted(middle, key=lambda s: abs(s - (stages - 1) / 2))[:extra])
    if len(bonus) < extra:
        bonus |= set(range(extra - len(bonus)))
    return tuple(base + (s in bonus) for s in range(stages))


def cut(graph: OpGraph, repeated: RepeatedLayers, counts: tuple[int, ...], devices: int) -> list[Stage]:
    """The graph of each *device* of a pipeline whose stage ``s`` runs ``counts[s]`` consecutive
    layers and lives on device ``s % devices`` (several stages per device: interleaved)."""
    if sum(counts) != repeated.count or any(c < 1 for c in counts):
        raise AutoshardError(f"pipeline cuts {list(counts)} do not split the {repeated.count} layers into "
                             f"non-empty stages")
    layer_of = {name: i for i, layer in enumerate(repeated.layers) for name in layer}
    bounds = [sum(counts[:s]) for s in range(len(counts) + 1)]
    stage_of_layer = {i: s for s in range(len(counts)) for i in range(bounds[s], bounds[s + 1])}
    ops = [n for n in graph if n.kind == NodeKind.OP]
    first = next(k for k, n in enumerate(ops) if n.name in layer_of)
    last = max(k for k, n in enumerate(ops) if n.name in layer_of)
    stage: dict[str, int] = {}
    for k, node in enumerate(ops):
        if node.name in layer_of:
            stage[node.name] = stage_of_layer[layer_of[node.name]]
        elif first < k < last:
            raise AutoshardError(f"op {node.name} runs between the repeated layers but belongs to none: the "
                                 f"pipeline cannot place it")
        else:
            stage[node.name] = 0 if k < first else len(counts) - 1
    flops = [[0, 0] for _ in counts]
    for node in ops:
        if node.work is not None:
            flops[stage[node.name]][0] += node.work.flops
            flops[stage[node.name]][1] += node.work.backward_flops
    recomputable = _recomputable(graph)
    dataflow = graph.to_networkx()
    devices_of = []
    for d in range(devices):
        mine = {n for n, s in stage.items() if s % devices == d}
        graph_d, received, sent = _device_graph(graph, dataflow, mine, d, recomputable)
        ids = tuple(range(d, len(counts), devices))
        devices_of.append(Stage(graph_d, received, sent, ids, tuple(counts[s] for s in ids),
                                tuple((flops[s][0], flops[s][1]) for s in ids), 0 in ids, len(counts) - 1 in ids))
    return devices_of


def _recomputable(graph: OpGraph) -> set[str]:
    """Ops no gradient flows through whose every ancestor is an input, a buffer or such an op."""
    found: set[str] = set()
    for node in graph:
        if node.kind == NodeKind.OP and not node.requires_grad and all(
                graph[s].kind in (NodeKind.INPUT, NodeKind.BUFFER) or s in found for s in node.inputs):
            found.add(node.name)
    return found


def _device_graph(graph: OpGraph, dataflow: nx.MultiDiGraph, mine: set[str], device: int,
                  recomputable: set[str]) -> tuple[OpGraph, tuple[str, ...], tuple[str, ...]]:
    """The nodes of one device, with received inputs for what earlier stages produce, the names it
    receives and those it sends."""
    keep = set(mine)
    received: set[str] = set()
    for name in sorted(mine):
        for src in graph[name].inputs:
            producer = graph[src]
            if src in keep or producer.kind == NodeKind.OUTPUT:
                continue
            if producer.kind in (NodeKind.INPUT, NodeKind.PARAM, NodeKind.BUFFER) or src in recomputable:
                keep.add(src)
                keep |= {a for a in nx.ancestors(dataflow, src)
                         if graph[a].kind in (NodeKind.INPUT, NodeKind.BUFFER) or a in recomputable}
            else:
                received.add(src)
    sent = [n.name for n in graph if n.name in mine and n.name not in recomputable
            and any(graph[u].kind != NodeKind.OUTPUT and u not in mine for u in dataflow.successors(n.name))]
    final = [s for n in graph if n.kind == NodeKind.OUTPUT for s in n.inputs if s in mine]
    nodes: dict[str, OpNode] = {}
    for node in graph:
        if node.name in received:
            nodes[node.name] = OpNode(node.name, NodeKind.INPUT, node.name, attrs={RECEIVED: True}, out=node.out,
                                      requires_grad=node.requires_grad)
        elif node.name in keep:
            nodes[node.name] = node
    outputs = tuple(dict.fromkeys(final + sent))
    nodes["output"] = OpNode("output", NodeKind.OUTPUT, "output", inputs=outputs)
    sub = OpGraph(nodes, graph.frontend, graph.module, graph.frontend_note)
    sub.name = f"{getattr(graph, 'name', '') or 'model'}.stage{device}"
    return sub, tuple(n for n in nodes if n in received), tuple(sent)


def shared_parameters(graphs: Sequence[OpGraph]) -> list[str]:
    """Parameters stored on more than one stage (tied weights): each copy is charged, their
    gradients' exchange between stages is not."""
    seen: dict[str, int] = {}
    for graph in graphs:
        for node in graph:
            if node.kind == NodeKind.PARAM:
                seen[node.name] = seen.get(node.name, 0) + 1
    return sorted(n for n, k in seen.items() if k > 1)


def stage_layouts(graph: OpGraph, plan: Plan) -> tuple[dict[str, TensorSpec], dict[str, TensorSpec]]:
    """(received, sent) tensors of a stage and the layouts its plan holds them in."""
    received = {n.name: plan.nodes[n.name].out_spec for n in graph if n.attrs.get(RECEIVED)}
    output = next(n for n in graph if n.kind == NodeKind.OUTPUT)
    sent = {src: spec for src, spec in zip(output.inputs, plan.nodes[output.name].in_specs)}
    return received, sent


def stage_outputs(graph: OpGraph) -> tuple[str, ...]:
    """What a stage returns: its final outputs (the loss, on the last stage), then what it sends."""
    return next(n for n in graph if n.kind == NodeKind.OUTPUT).inputs


def critical_path(stage_count: int, stages: Sequence[Stage], orders: list, per_device: Sequence[float]) -> float:
    """The schedule's step (``orders``, over ``stage_count`` stages) when device ``d`` takes
    ``per_device[d]`` seconds per microbatch, split over its stages and into forward and backward
    by torch's flop counts."""
    forward = [0.0] * stage_count
    backward = [0.0] * stage_count
    for stage, seconds in zip(stages, per_device):
        total = sum(f + b for f, b in stage.flops) or 1
        for s, (f, b) in zip(stage.stages, stage.flops):
            forward[s], backward[s] = seconds * f / total, seconds * b / total
    return timing(orders, forward, backward).step


WEIGHT_FLOOR = 0.25
"""The least weight of a group of devices, as a share of the heaviest group's (``path_weights``):
every device keeps some of the solving time, as its plan also fixes what it sends."""


def path_weights(stage_count: int, stages: Sequence[Stage], orders: list, groups: Mapping[tuple, Sequence[int]],
                 times: Sequence[float] | None = None) -> dict[tuple, float]:
    """How much each group of alike devices weighs on the step: the critical path's rate of
    change in the group's seconds per microbatch, ``dS/dT_g``, at the devices' ``times`` (estimates;
    None: each device's layers, plus one for the embedding or the head), at least
    :data:`WEIGHT_FLOOR` of the heaviest. The groups' solves share the time by these weights
    (``PipelineSearch.evaluate``)."""
    times = list(times) if times is not None else [float(sum(st.counts) + st.first + st.last) for st in stages]
    base = critical_path(stage_count, stages, orders, times)
    step = 1e-3 * max(times)
    rates = {}
    for sig, devices in groups.items():
        bumped = [t + step if d in devices else t for d, t in enumerate(times)]
        rates[sig] = (critical_path(stage_count, stages, orders, bumped) - base) / step
    top = max(rates.values(), default=0.0)
    return {sig: max(rate, WEIGHT_FLOOR * top) for sig, rate in rates.items()}
