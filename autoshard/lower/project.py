"""A plan seen along one mesh axis: the 1-D plan that the PyTorch-native export maps axis by axis.

Every layout keeps only that axis, every reshard only its steps on that axis, and an op's
explicit local size, scale or mask counts only when that axis causes it. A local size the model
infers itself (``-1`` in its view, as Hugging Face and torchtitan models write head counts) never
counts. Only what depends on a parameter is held to the plan (:func:`parameter_dependent`):
tensors computed from inputs, buffers and constants alone (position ids, masks, rotary tables)
are computed natively by the model's own code from what it is fed, so edges out of them lose
their steps and their consumers get them as they need them.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from autoshard.frontend.graph import NodeKind, OpGraph, OpNode
from autoshard.problem.plan import NodePlacement, Plan
from autoshard.sharding.reshard import Step
from autoshard.sharding.rules import load_rules
from autoshard.sharding.spec import TensorSpec


@lru_cache(maxsize=1 << 14)
def project_spec(spec: TensorSpec | None, axis: int) -> TensorSpec | None:
    """The layout seen along one mesh axis, as a 1-D spec (remembered: a plan of 10^4-10^5 nodes
    and steps passes through few layouts)."""
    if spec is None:
        return None
    return TensorSpec(tuple((0,) if axis in axes else () for axes in spec.dims),
                      frozenset({0}) if axis in spec.partial else frozenset())


def _project_steps(steps: tuple[Step, ...], axis: int) -> tuple[Step, ...]:
    return tuple(replace(s, axis=0, before=project_spec(s.before, axis), after=project_spec(s.after, axis))
                 for s in steps if s.axis == axis)


def explicit_size_axes(node: OpNode, place: NodePlacement) -> set[int]:
    """Mesh axes whose sharding the node's local size must name explicitly: dims the model gave a
    fixed size (not ``-1``) that the plan shards. Running the model's own code cannot do that."""
    rule = load_rules().get(node.op or "")
    attr = rule.options.get("local_size_attr") if rule else None
    if attr is None or attr not in place.local_attrs or place.out_spec is None:
        return set()
    traced = list(node.attrs.get(attr) or [])
    ndim = place.out_spec.ndim
    offset = node.attrs.get("dim", 0) % (ndim - len(traced) + 1) if attr == "sizes" else 0  # unflatten's new dims
    return {a for k, size in enumerate(traced) if size != -1 and k + offset < ndim for a in place.out_spec.dims[k + offset]}


def parameter_dependent(graph: OpGraph) -> frozenset[str]:
    """Nodes whose value depends on a parameter (the parameters included), in graph order."""
    found: set[str] = set()
    for node in graph:
        if node.kind == NodeKind.PARAM or any(src in found for src in node.inputs):
            found.add(node.name)
    return frozenset(found)


def project(plan: Plan, graph: OpGraph, axis: int, dependent: frozenset[str]) -> Plan:
    """The plan as seen along mesh axis ``axis``: a 1-D plan of the same graph (see module doc).

    Nodes outside ``dependent`` keep their layouts but lose local sizes, scales and masks, and
    edges out of them lose their steps: the consumer gets such a tensor as it needs it.
    """
    nodes = {}
    for name, place in plan.nodes.items():
        held = name in dependent and place.out_spec is not None
        partial = held and axis in place.out_spec.partial
        nodes[name] = replace(
            place, in_specs=tuple(project_spec(s, axis) for s in place.in_specs),
            out_spec=project_spec(place.out_spec, axis),
            local_attrs=place.local_attrs if held and axis in explicit_size_axes(graph[name], place) else {},
            scale=place.scale if partial else 1, masked_operands=place.masked_operands if partial else ())
    edges = []
    for e in plan.edges:
        src, dst = project_spec(e.src_spec, axis), project_spec(e.dst_spec, axis)
        held = e.src in dependent
        edges.append(replace(e, src_spec=src if held else dst, dst_spec=dst,
                             steps=_project_steps(e.steps, axis) if held else (),
                             grad_src_spec=project_spec(e.grad_src_spec, axis),
                             grad_dst_spec=project_spec(e.grad_dst_spec, axis),
                             grad_steps=_project_steps(e.grad_steps, axis)))
    mesh = replace(plan.mesh, shape=(plan.mesh.shape[axis],), bandwidth=(plan.mesh.bandwidth[axis],),
                   latency=(plan.mesh.latency[axis],))
    return replace(plan, mesh=mesh, nodes=nodes, edges=edges,
                   param_specs={k: project_spec(v, axis) for k, v in plan.param_specs.items()})
