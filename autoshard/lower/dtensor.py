"""Plan -> PyTorch-native parallelism, as torchtitan-style Python: a DeviceMesh, parallelize_module, fully_shard.

A plan maps to PyTorch's own APIs when each mesh axis plays one role those APIs know:

- **tensor parallel** (at most one axis, named ``tp``): the plan projected onto it is a set of
  ``parallelize_module`` styles (``lower.tp_styles``): Colwise/Rowwise Linears and Embeddings,
  sequence-parallel LayerNorms, every reshard at a styled module's boundary;
- **data parallel** (``dp``, or ``dp0``, ``dp1`` ... for several, which FSDP2 runs as HSDP over
  their sub-mesh): every model input is cut on its batch dim, parameters are replicated (or
  stored sharded and gathered before each use), and the only forward communication on the axis
  gathers outputs or reduces the loss at the very end (slices of replicated values are free).
  This is ``fully_shard`` on the axis, per repeated block and on the root, as torchtitan wraps
  a transformer. FSDP stores the parameters sharded where our plan may keep them replicated
  (DDP); the forward and the gradients are the same, and FSDP averages gradients over the axis,
  which matches a loss that is a mean over the batch;
- **replica** (``replica``): the plan does nothing on the axis; its ranks compute the same batch.

To decide, the plan is projected onto each axis (:func:`project`): every layout keeps only that
axis, every reshard only its steps on that axis, and an op's explicit local size, scale or mask
counts only when that axis causes it. A local size the model infers itself (``-1`` in its view,
as Hugging Face and torchtitan models write head counts) never counts, and neither does one on
a data-parallel axis: FSDP hands each rank its own batch slice and the model's code runs on it.

Only what depends on a parameter is held to the plan. Tensors computed from inputs, buffers
and constants alone (position ids, masks, rotary tables) are computed natively by the model's
own code from what it is fed: whole along the tensor-parallel axis, the rank's batch slice
along a data-parallel one. The plan may slice, shard or gather them differently (it prices
where they are cheapest); their reshards are dropped from the projection. This is safe or
loud: such a tensor meets the plan's layouts only inside ops, where a layout the native code
does not have is a shape mismatch, not a wrong number. The model's inputs must reach the
parameter-dependent ops batch-cut along data-parallel axes and whole along the tensor one.
The export emits ``build_mesh`` (``init_device_mesh`` with named dims), ``parallelize(model,
mesh)``, and ``loss_context()``: ``loss_parallel()`` when the plan leaves the logits sharded on the
vocabulary (the loss must then run on the DTensor inside it), else a null context. When a plan
does not map, the export is one line naming the first axis, edge or tensor that does not and why.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn

from autoshard.frontend.graph import NodeKind, OpGraph, OpNode
from autoshard.lower.tp_styles import NotMappable, Style, style_arguments, tp_styles
from autoshard.problem.plan import NodePlacement, Plan
from autoshard.sharding.layers import find_repeated_layers
from autoshard.sharding.reshard import ALL_GATHER, SLICE, Step
from autoshard.sharding.rules import load_rules
from autoshard.sharding.spec import TensorSpec

TP, DP, REPLICA = "tp", "dp", "replica"


@dataclass(frozen=True)
class DTensorExport:
    """The plan as Python source (``build_mesh``, ``parallelize``, ``loss_context``), or why it does not map."""

    source: str | None
    reason: str = ""


def _project_spec(spec: TensorSpec | None, axis: int) -> TensorSpec | None:
    """The layout seen along one mesh axis, as a 1-D spec."""
    if spec is None:
        return None
    return TensorSpec(tuple((0,) if axis in axes else () for axes in spec.dims),
                      frozenset({0}) if axis in spec.partial else frozenset())


def _project_steps(steps: tuple[Step, ...], axis: int) -> tuple[Step, ...]:
    return tuple(replace(s, axis=0, before=_project_spec(s.before, axis), after=_project_spec(s.after, axis))
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
            place, in_specs=tuple(_project_spec(s, axis) for s in place.in_specs),
            out_spec=_project_spec(place.out_spec, axis),
            local_attrs=place.local_attrs if held and axis in explicit_size_axes(graph[name], place) else {},
            scale=place.scale if partial else 1, masked_operands=place.masked_operands if partial else ())
    edges = []
    for e in plan.edges:
        src, dst = _project_spec(e.src_spec, axis), _project_spec(e.dst_spec, axis)
        held = e.src in dependent
        edges.append(replace(e, src_spec=src if held else dst, dst_spec=dst,
                             steps=_project_steps(e.steps, axis) if held else (),
                             grad_src_spec=_project_spec(e.grad_src_spec, axis),
                             grad_dst_spec=_project_spec(e.grad_dst_spec, axis),
                             grad_steps=_project_steps(e.grad_steps, axis)))
    mesh = replace(plan.mesh, shape=(plan.mesh.shape[axis],), bandwidth=(plan.mesh.bandwidth[axis],),
                   latency=(plan.mesh.latency[axis],))
    return replace(plan, mesh=mesh, nodes=nodes, edges=edges,
                   param_specs={k: _project_spec(v, axis) for k, v in plan.param_specs.items()})


def _is_idle(view: Plan, dependent: frozenset[str]) -> bool:
    """Nothing that depends on a parameter is sharded or partial, and nothing moves, along the axis."""
    specs = [view.nodes[name].out_spec for name in dependent if name in view.nodes]
    specs += [e.dst_spec for e in view.edges if e.src in dependent]
    return all(s is None or s.is_replicated for s in specs) and not any(e.steps for e in view.edges)


def _check_inputs(view: Plan, graph: OpGraph, dependent: frozenset[str], role: str, axis: int) -> None:
    """Inputs reach parameter-dependent ops batch-cut along a data axis, whole along the tensor axis."""
    for edge in view.edges:
        if graph[edge.src].kind != NodeKind.INPUT or edge.dst not in dependent:
            continue
        if role == DP and edge.dst_spec.dims[:1] != ((0,),):
            raise NotMappable(f"input {edge.src} reaches {edge.dst} as {edge.dst_spec.format(1)} along mesh axis "
                              f"{axis}, which shards no weight: only data parallelism maps there (fully_shard, each "
                              "rank its own batch slice)")
        if role == TP and not edge.dst_spec.is_replicated:
            raise NotMappable(f"input {edge.src} reaches {edge.dst} as {edge.dst_spec.format(1)} along the "
                              f"tensor-parallel axis {axis}; the styles take whole inputs")


def _stores_sharded_weights(view: Plan, graph: OpGraph) -> bool:
    """Some parameter is used in a sharded layout (not merely stored sharded and gathered for use)."""
    return any(graph[e.src].kind == NodeKind.PARAM and not e.dst_spec.is_replicated for e in view.edges)


def _check_data_parallel(view: Plan, graph: OpGraph, axis: int) -> None:
    """The plan along ``axis`` is data parallelism (see module doc); raises NotMappable."""
    where = f"mesh axis {axis}, which shards no weight"
    for edge in view.edges:
        if graph[edge.dst].kind == NodeKind.OUTPUT:
            continue
        for step in edge.steps:
            if step.kind == SLICE or (step.kind == ALL_GATHER and graph[edge.src].kind == NodeKind.PARAM):
                continue
            raise NotMappable(f"edge {edge.src} -> {edge.dst} runs {step.kind} along {where} "
                              f"({edge.src_spec.format(1)}->{edge.dst_spec.format(1)}); only data parallelism maps "
                              "there, and fully_shard keeps every activation on its rank's batch slice")


def axis_roles(plan: Plan, graph: OpGraph, model: nn.Module) -> tuple[list[str], dict[str, Style]]:
    """Each mesh axis's role (tp / dp / replica) and the tensor-parallel styles; raises NotMappable."""
    roles: list[str] = []
    styles: dict[str, Style] = {}
    dependent = parameter_dependent(graph)
    for axis in range(plan.mesh.ndim):
        view = project(plan, graph, axis, dependent)
        if plan.mesh.shape[axis] == 1 or _is_idle(view, dependent):
            roles.append(REPLICA)
            continue
        role = TP if _stores_sharded_weights(view, graph) else DP
        if role == TP and TP in roles:
            raise NotMappable(f"mesh axes {roles.index(TP)} and {axis} both shard weights; parallelize_module "
                              "shards over one tensor-parallel axis")
        _check_inputs(view, graph, dependent, role, axis)
        if role == TP:
            try:
                styles = tp_styles(view, graph, model)
            except NotMappable as why:
                raise NotMappable(f"mesh axis {axis} (tensor parallel): {why}") from None
        else:
            _check_data_parallel(view, graph, axis)
        roles.append(role)
    return roles, styles


def _mesh_names(roles: list[str]) -> list[str]:
    counts = {role: roles.count(role) for role in roles}
    seen: dict[str, int] = {}
    names = []
    for role in roles:
        seen[role] = seen.get(role, 0) + 1
        names.append(role if counts[role] == 1 else f"{role}{seen[role] - 1}")
    return names


def _parallelize_lines(roles: list[str], names: list[str], styles: dict[str, Style], graph: OpGraph) -> list[str]:
    """The body of ``parallelize(model, mesh)``."""
    lines = []
    if styles:
        lines.append(f'    parallelize_module(model, mesh["{names[roles.index(TP)]}"], {{')
        lines += [f'        "{path}": {style.kind}({style_arguments(style, path)}),' for path, style in styles.items()]
        lines.append("    })")
    dp = [name for name, role in zip(names, roles) if role == DP]
    if dp:
        sub = f'mesh["{dp[0]}"]' if len(dp) == 1 else f"mesh[({', '.join(repr(n) for n in dp)})]"
        layers = find_repeated_layers(graph)
        if layers is not None:
            lines += [f'    for block in model.get_submodule("{layers.container}"):',
                      f"        fully_shard(block, mesh={sub})"]
        lines.append(f"    fully_shard(model, mesh={sub})")
    return lines + ["    return model"]


def _source(plan: Plan, roles: list[str], styles: dict[str, Style], graph: OpGraph) -> str:
    names = _mesh_names(roles)
    body = _parallelize_lines(roles, names, styles, graph)
    vocab_sharded = any(style.dtensor_output for style in styles.values())
    used = "\n".join(body)
    imports = ["from torch.distributed.device_mesh import init_device_mesh"]
    if "fully_shard(" in used:
        imports.append("from torch.distributed.fsdp import fully_shard")
    placements = [name for name in ("Replicate", "Shard") if f"{name}(" in used]
    if placements:
        imports.append(f"from torch.distributed.tensor import {', '.join(placements)}")
    tp_names = sorted({style.kind for style in styles.values()}) + (["loss_parallel"] if vocab_sharded else [])
    if styles:
        imports.append(f"from torch.distributed.tensor.parallel import {', '.join([*tp_names, 'parallelize_module'])}")
    if not vocab_sharded:
        imports.insert(0, "from contextlib import nullcontext")
    described = ", ".join(f'"{n}" ({r})' for n, r in zip(names, roles))
    data = ("each data-parallel rank gets its own slice of the batch; fully_shard averages gradients over them, "
            "so compute each rank's loss as a mean over its slice" if DP in roles else "every rank gets the whole batch")
    lines = [
        f'"""{plan.model or "The model"}\'s autoshard plan on mesh {plan.mesh.label} in PyTorch\'s own APIs '
        f'(torchtitan style).',
        "",
        f"Mesh dims: {described}; {data}.",
        '"""',
        "",
        *imports,
        "",
        "",
        'def build_mesh(device_type="cuda"):',
        f'    """The {plan.mesh.label} device mesh with named dims (call on every rank)."""',
        f"    return init_device_mesh(device_type, {tuple(plan.mesh.shape)!r}, mesh_dim_names={tuple(names)!r})",
        "",
        "",
        "def parallelize(model, mesh):",
        '    """Shard ``model`` in place as the plan does; returns it."""',
        *body,
        "",
        "",
        "def loss_context():",
        '    """Run the loss and its backward inside this context."""',
        "    return loss_parallel()" if vocab_sharded else "    return nullcontext()",
    ]
    return "\n".join(lines) + "\n"


def export_dtensor(plan: Plan, graph: OpGraph, model: nn.Module) -> DTensorExport:
    """The plan as torchtitan-style source, or the reason it does not map."""
    split_experts = [n.module for n in plan.nodes.values() if n.op == "moe_experts" and n.in_specs[3].dims[0]]
    if split_experts:  # torchtitan's ExpertParallel needs its own MoE modules, not transformers' experts
        return DTensorExport(None, f"{split_experts[0]} runs its experts split over devices (expert routing), which "
                                   "no parallelize_module style expresses for transformers' experts modules; run the "
                                   "JSON plan with autoshard.run")
    try:
        roles, styles = axis_roles(plan, graph, model)
    except NotMappable as reason:
        return DTensorExport(None, str(reason))
    return DTensorExport(_source(plan, roles, styles, graph))
