"""A device's plan split into one plan per pipeline stage it runs (interleaved schedules run stage by stage).

Under an interleaved schedule a device holds ``v`` stages and its problem is solved on one graph
holding all of them (``stages.cut`` over the devices); at run time each stage is a module of its
own, called once per microbatch in the schedule's order. Cut over the stages (``cut`` with one
device per stage), every stage's graph is a subgraph of its device's, with the same node names:
consecutive stages are never on one device, so what a stage receives its device receives too,
and the ops it recomputes (masks, positions) are the device's. A stage's plan is then its
device's plan restricted to the stage's nodes and edges, the output's layouts taken by tensor
name (the stage returns a subset of what its device returns, in its own order).
"""

from __future__ import annotations

from dataclasses import replace

from typing import Sequence

from autoshard.errors import AutoshardError
from autoshard.frontend.graph import NodeKind, OpGraph, fingerprint, graph_signature
from autoshard.pipeline.stages import Stage, cut
from autoshard.problem.plan import Plan
from autoshard.sharding.layers import RepeatedLayers


def run_stages(graph: OpGraph, repeated: RepeatedLayers, counts: tuple[int, ...], devices: Sequence[Stage],
               plans: Sequence[Plan]) -> tuple[list[OpGraph], list[Plan]]:
    """Every pipeline stage's graph and plan, in stage order, from the devices' (``devices``: the
    model cut over the pipeline devices, ``plans`` theirs): the devices' own when each holds one
    stage, else each device's plan split over its stages."""
    if len(counts) == len(devices):
        return [d.graph for d in devices], list(plans)
    stages = cut(graph, repeated, counts, len(counts))
    p = len(devices)
    return ([s.graph for s in stages],
            [stage_plan(plans[k % p], devices[k % p].graph, stage.graph) for k, stage in enumerate(stages)])


def stage_plan(plan: Plan, device: OpGraph, stage: OpGraph) -> Plan:
    """``plan`` (made for ``device``'s graph) restricted to ``stage``'s graph, one of its stages."""
    missing = [name for name in stage.nodes if name not in plan.nodes]
    if missing:
        raise AutoshardError(f"a stage graph has nodes its device's plan lacks ({missing[0]}): the plan "
                             f"is for another cut; re-plan the pipeline")
    out = _output(stage)
    device_out = _output(device)
    by_name = dict(zip(device_out.inputs, plan.nodes[device_out.name].in_specs))
    nodes = {name: plan.nodes[name] for name in stage.nodes if name != out.name}
    nodes[out.name] = replace(plan.nodes[device_out.name], name=out.name,
                              in_specs=tuple(by_name[src] for src in out.inputs))
    edges = []
    for edge in plan.edges:
        if edge.dst == device_out.name:
            if edge.src in out.inputs:
                edges.append(replace(edge, dst=out.name, operand=out.inputs.index(edge.src)))
        elif edge.dst in stage.nodes and edge.src in stage.nodes:
            edges.append(edge)
    params = {n.qualname for n in stage if n.kind in (NodeKind.PARAM, NodeKind.BUFFER)}
    return replace(plan, model=getattr(stage, "name", "") or plan.model, fingerprint=fingerprint(stage), signature=graph_signature(stage),
                   nodes=nodes, edges=edges,
                   param_specs={q: spec for q, spec in plan.param_specs.items() if q in params},
                   recompute=[seg for seg in plan.recompute if seg[0] in stage.nodes],
                   recompute_kept=[n for n in plan.recompute_kept if n in stage.nodes])


def _output(graph: OpGraph):
    return next(n for n in graph if n.kind == NodeKind.OUTPUT)
