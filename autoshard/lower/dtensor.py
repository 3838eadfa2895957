"""Plan -> PyTorch-native parallelism, as torchtitan-style Python: a DeviceMesh, parallelize_module,
checkpoint_wrapper, fully_shard.

The plan is read one mesh axis at a time (``lower.project``: its 1-D view along the axis), and
each axis gets the role PyTorch's APIs give a mesh dimension:

- **tensor parallel** (at most one axis, named ``tp``): the view is a set of ``parallelize_module``
  styles (``lower.tp_styles``): Colwise/Rowwise Linears and Embeddings, sequence-parallel
  LayerNorms, every reshard at a styled module's boundary. Between styled modules the axis may
  cut the batch, as the LLM plans do (a column-parallel embedding hands each rank its batch slice,
  the layers run data parallel, a column-parallel ``lm_head`` gathers the batch again): the
  parameters used there are ``fully_shard`` on the axis too;
- **data parallel** (``dp``, or ``dp0``, ``dp1`` ... for several, which FSDP2 runs as HSDP over
  their sub-mesh): every model input is cut on its batch dim, parameters are replicated or stored
  sharded and gathered before each use, and the only forward communication gathers outputs or
  reduces the loss at the very end. This is ``fully_shard`` on the axis, per repeated block and on
  the root, as torchtitan wraps a transformer (FSDP stores sharded what the plan may keep
  replicated: the forward and the gradients are the same);
- **replica** (``replica``): the plan does nothing on the axis; its ranks compute the same batch.

- **sequence parallel** (``sp``, at most one axis): the repeated blocks on the rank's slice of the
  sequence, attention split by heads through all-to-alls, the MLP column/row-parallel on the
  gathered sequence (``lower.sequence``, for transformers' models).

An axis whose view has no such form (expert routing, attention split by query rows,
``lower.context``; a second axis that shards weights for use) runs as replicas, and the source says so in a comment naming the choice and why, so the rest of the
plan still exports and runs: a plan never fails to export. Per repeated block (``lower.blocks``):
``checkpoint_wrapper`` (full, or torchtitan's selective op policy) where the plan recomputes,
and ``reshard_after_forward`` as it keeps or re-gathers the parameters. Gradients:
``fully_shard`` sums them over its ranks (``set_gradient_divide_factor(1.0)``) and each rank's
loss is its share of the whole batch's (``loss_share``: the mean over the rows it holds divided
by the number of batch slices, torchtitan's normalisation by the global token count), which
holds alike for parameters that data parallelism reduces and for the styled ones, whose
gradients DTensor sums over the ranks.

Only what depends on a parameter is held to the plan; the model's own code computes position
ids, masks and rotary tables from what it is fed (``lower.project``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from autoshard.frontend.graph import NodeKind, OpGraph
from autoshard.lower.blocks import memory_units
from autoshard.lower.context import HEADS, attention_split
from autoshard.lower.native_source import render
from autoshard.lower.project import parameter_dependent, project
from autoshard.lower.roles import DP, REPLICA, SP, TP, NativeLayout
from autoshard.lower.sequence import sequence_axis
from autoshard.lower.tp_styles import NotMappable, batch_cut, tp_styles
from autoshard.problem.plan import Plan
from autoshard.sharding.reshard import ALL_GATHER, SLICE

@dataclass(frozen=True)
class DTensorExport:
    """The plan as Python source (``build_mesh``, ``parallelize``, ``loss_context``, ``loss_share``), and
    the choices it could not express (also comments in the source)."""

    source: str
    notes: tuple[str, ...] = ()


def _is_idle(view: Plan, dependent: frozenset[str]) -> bool:
    """Nothing that depends on a parameter is sharded or partial, and nothing moves, along the axis."""
    specs = [view.nodes[name].out_spec for name in dependent if name in view.nodes]
    specs += [e.dst_spec for e in view.edges if e.src in dependent]
    return all(s is None or s.is_replicated for s in specs) and not any(e.steps for e in view.edges)


def _check_inputs(view: Plan, graph: OpGraph, dependent: frozenset[str], role: str) -> None:
    """Inputs reach parameter-dependent ops batch-cut along a data axis, whole along the tensor axis."""
    for edge in view.edges:
        if graph[edge.src].kind != NodeKind.INPUT or edge.dst not in dependent:
            continue
        if role == DP and not batch_cut(edge.dst_spec):
            raise NotMappable(f"input {edge.src} reaches {edge.dst} as {edge.dst_spec.format(1)}, where the axis "
                              "shards no weight: only data parallelism maps there (fully_shard, each rank its own "
                              "batch slice)")
        if role == TP and not edge.dst_spec.is_replicated:
            raise NotMappable(f"input {edge.src} reaches {edge.dst} as {edge.dst_spec.format(1)} on an axis that "
                              "shards weights; the styles take whole inputs")


def _check_data_parallel(view: Plan, graph: OpGraph) -> None:
    """Along a data axis activations stay on the rank's batch slice: only slices and parameter gathers."""
    for edge in view.edges:
        if graph[edge.dst].kind == NodeKind.OUTPUT:
            continue
        for step in edge.steps:
            if not (step.kind == SLICE or (step.kind == ALL_GATHER and graph[edge.src].kind == NodeKind.PARAM)):
                raise NotMappable(f"edge {edge.src} -> {edge.dst} runs {step.kind} ({edge.src_spec.format(1)}->"
                                  f"{edge.dst_spec.format(1)}) where the axis shards no weight; fully_shard keeps "
                                  "every activation on its rank's batch slice")


def _role(view: Plan, graph: OpGraph, model: nn.Module, dependent: frozenset[str], layout: NativeLayout,
          axis: int) -> str:
    """The axis's role; a tensor-parallel axis records its styles, its FSDP use and its loss slices in
    ``layout``. Raises NotMappable."""
    if any(n.op == "moe_experts" and n.in_specs[3].dims[0] for n in view.nodes.values()):
        raise NotMappable("it runs experts split over devices (expert routing), which no parallelize_module style "
                          "expresses for transformers' experts modules")
    split = attention_split(view, graph, dependent)
    if split is not None and split.kind == HEADS and layout.sequence is None:
        try:
            layout.sequence = sequence_axis(view, graph, model, dependent, split.module)
        except NotMappable as why:
            raise NotMappable(f"{split.description}; the sequence-parallel export does not fit it: {why}") from None
        return SP
    if split is not None:
        raise NotMappable(split.description)
    used_sharded = any(graph[e.src].kind == NodeKind.PARAM and not e.dst_spec.is_replicated for e in view.edges)
    role = TP if used_sharded else DP
    _check_inputs(view, graph, dependent, role)
    if role == DP:
        _check_data_parallel(view, graph)
        return DP
    axis_styles = tp_styles(view, graph, model)
    if TP in layout.roles:
        raise NotMappable(f"it shards weights for use ({', '.join(axis_styles.styles)}) as mesh axis "
                          f"{layout.roles.index(TP)} does; parallelize_module shards over one tensor-parallel axis")
    layout.sliced_inputs = _sliced_inputs(view, graph, dependent)
    layout.styles = axis_styles.styles
    batch = any(batch_cut(view.nodes[n].out_spec) for n in dependent
                if n in view.nodes and graph[n].kind == NodeKind.OP)
    if batch or axis_styles.gathered:
        layout.fsdp_axes.append(axis)
    layout.loss_slices *= view.mesh.shape[0] if axis_styles.loss_cut else 1
    return TP


def _sliced_inputs(view: Plan, graph: OpGraph, dependent: frozenset[str]) -> tuple[bool, ...]:
    """Per model input, whether the plan reads it as the rank's batch slice where it meets the
    parameter-dependent ops through the model's own code (labels sliced for a batch-cut loss), on an
    axis whose styled modules take whole inputs; raises NotMappable when it reads it both ways."""
    edges_from: dict[str, list] = {}
    for edge in view.edges:
        edges_from.setdefault(edge.src, []).append(edge)
    sliced = []
    for node in (n for n in graph if n.kind == NodeKind.INPUT):
        seen, todo, layouts = {node.name}, [node.name], set()
        while todo:
            for edge in edges_from.get(todo.pop(), ()):
                if edge.dst in dependent:
                    layouts.add(batch_cut(edge.dst_spec))
                elif edge.dst not in seen:
                    seen.add(edge.dst)
                    todo.append(edge.dst)
        if len(layouts) > 1:
            raise NotMappable(f"input {node.name} is read both whole and as the rank's batch slice")
        sliced.append(layouts == {True})
    return tuple(sliced)


def native_layout(plan: Plan, graph: OpGraph, model: nn.Module) -> NativeLayout:
    """Each axis's role (an axis with no PyTorch form becomes a replica, with a note), styles, FSDP axes,
    memory units and loss slices."""
    layout = NativeLayout([])
    dependent = parameter_dependent(graph)
    for axis, size in enumerate(plan.mesh.shape):
        view = project(plan, graph, axis, dependent)
        if size == 1 or _is_idle(view, dependent):
            layout.roles.append(REPLICA)
            continue
        try:
            role = _role(view, graph, model, dependent, layout, axis)
        except NotMappable as why:
            layout.roles.append(REPLICA)
            layout.notes.append(f"mesh axis {axis} ({size} devices): {why}; PyTorch has no API for that, so its "
                                "ranks compute as replicas here (run the JSON plan with autoshard.run for the rest)")
            continue
        if role == DP:  # every rank computes its batch slice: the loss's rows too
            layout.fsdp_axes.append(axis)
            layout.loss_slices *= size
        layout.roles.append(role)
    styled = {f"{path}.{name}" for path in layout.styles for name, _ in model.get_submodule(path).named_parameters()}
    fsdp_on_tp = TP in layout.roles and layout.roles.index(TP) in layout.fsdp_axes  # styled ones left out
    sharded = {n.qualname for n in graph if n.kind == NodeKind.PARAM} - (styled if fsdp_on_tp else set())
    sharded = sharded if layout.fsdp_axes else set()
    layout.units = memory_units(plan, graph, sharded)
    if not layout.fsdp_axes and any(e.regather for e in plan.edges):
        layout.notes.append("the plan re-gathers parameters for backward, which only fully_shard does, and no axis "
                            "runs fully_shard here: they stay whole")
    return layout


def export_dtensor(plan: Plan, graph: OpGraph, model: nn.Module) -> DTensorExport:
    """The plan as torchtitan-style source; choices PyTorch has no API for are notes (comments in it)."""
    layout = native_layout(plan, graph, model)
    return DTensorExport(render(plan, layout), tuple(layout.notes))
