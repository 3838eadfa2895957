"""Plan -> PyTorch tensor parallelism: ``parallelize_module`` with Colwise/Rowwise/SequenceParallel, as Python.

PyTorch's own API shards whole modules: an ``nn.Linear`` whose weight is split on its output
features is ``ColwiseParallel`` (output sharded on the last dim), on its input features
``RowwiseParallel`` (output a partial sum, reduced to ``output_layouts``), and an
``nn.LayerNorm`` that runs on a sequence-sharded input is ``SequenceParallel``. Each style
reshards only at its module's boundary: its input from ``input_layouts`` to the layout it needs,
its output to ``output_layouts``; everything in between runs on local tensors.

A plan maps to it when it is expressible that way, which :func:`export_dtensor` checks edge by
edge on a 1-D mesh: every parameter is laid out as its module's style stores it (replicated
outside styled modules), every forward reshard sits at a styled module's input or output,
nothing outside styled modules needs local shape arguments, scaling or masking, and the model's
inputs and outputs are replicated. DTensor derives the backward itself, so gradient steps are
not consulted. When the plan does not map, the export says why instead of printing code that
would compute something else.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from autoshard.graph import NodeKind, OpGraph, OpNode
from autoshard.plan import EdgeReshard, Plan
from autoshard.sharding.spec import TensorSpec

COLWISE, ROWWISE, SEQUENCE = "ColwiseParallel", "RowwiseParallel", "SequenceParallel"


class NotMappable(Exception):
    """Why the plan has no torch.distributed.tensor.parallel equivalent."""


@dataclass(frozen=True)
class DTensorExport:
    """The plan as Python source defining ``apply_tensor_parallel(model, device_mesh)``, or why not."""

    source: str | None
    reason: str = ""


@dataclass
class _Style:
    """One styled module: its style and the layouts at its boundary (None: the style's default)."""

    kind: str
    input_layout: TensorSpec | None = None
    output_layout: TensorSpec | None = None


def _sharded_dims(spec: TensorSpec) -> list[int]:
    return [d for d, axes in enumerate(spec.dims) if axes]


def _placement(spec: TensorSpec, where: str) -> str:
    """``Replicate()`` or ``Shard(d)`` (``Shard(-1)`` for the last dim) for a 1-D spec."""
    dims = _sharded_dims(spec)
    if spec.partial:
        raise NotMappable(f"{where} is a partial sum, which no style leaves between modules")
    if not dims:
        return "Replicate()"
    return f"Shard({-1 if dims[0] == spec.ndim - 1 else dims[0]})"


def _shards(spec: TensorSpec | None, dim: int) -> bool:
    return spec is not None and not spec.partial and _sharded_dims(spec) == [dim % spec.ndim]


def _style_of(node: OpNode, graph: OpGraph, plan: Plan, model: nn.Module) -> tuple[str, _Style] | None:
    """(module path, style) when ``node`` is the op of an nn.Linear / nn.LayerNorm the plan shards."""
    if node.op not in ("linear", "layer_norm") or len(node.inputs) < 2 or graph[node.inputs[1]].kind != NodeKind.PARAM:
        return None
    path = graph[node.inputs[1]].qualname.rpartition(".")[0]
    module = model.get_submodule(path)
    specs = [plan.param_specs[graph[src].qualname] for src in node.inputs[1:]]
    place = plan.nodes[node.name]
    if node.op == "linear" and isinstance(module, nn.Linear):
        weight, bias = specs[0], specs[1] if len(specs) > 1 else None
        if _shards(weight, 0) and (bias is None or _shards(bias, 0)):
            return path, _Style(COLWISE)
        if _shards(weight, 1) and (bias is None or bias.is_replicated):
            return path, _Style(ROWWISE)
    if node.op == "layer_norm" and isinstance(module, nn.LayerNorm) and all(s.is_replicated for s in specs):
        dims = _sharded_dims(place.in_specs[0])
        if len(dims) == 1 and not place.in_specs[0].partial:
            return path, _Style(SEQUENCE, input_layout=place.in_specs[0])
    return None


def _styles(plan: Plan, graph: OpGraph, model: nn.Module) -> dict[str, _Style]:
    """The style of every sharded module, with boundary layouts; raises NotMappable."""
    if plan.mesh.ndim != 1:
        raise NotMappable(f"mesh {plan.mesh.label} is {plan.mesh.ndim}-D; the styles shard over one mesh dimension")
    styles: dict[str, _Style] = {}
    styled: dict[str, str] = {}
    for node in graph:
        found = _style_of(node, graph, plan, model) if node.kind == NodeKind.OP else None
        if found is None:
            continue
        path, style = found
        if path in styles and styles[path].kind != style.kind:
            raise NotMappable(f"module {path} is called with two different shardings")
        styles.setdefault(path, style)
        styled[node.name] = path
    _check_state(plan, graph, styled)
    _check_nodes(plan, graph, styled)
    for edge in plan.edges:
        _place_edge(edge, graph, styles, styled)
    return styles


def _check_nodes(plan: Plan, graph: OpGraph, styled: dict[str, str]) -> None:
    """Whole inputs and outputs; no local shapes, scaling or masking outside styled modules."""
    for node in graph:
        place = plan.nodes.get(node.name)
        if place is None:
            continue
        if node.kind == NodeKind.INPUT and not place.out_spec.is_replicated:
            raise NotMappable(f"input {node.name} is fed sharded ({place.out_spec.format(1)}); the styles take whole inputs")
        if node.kind == NodeKind.OUTPUT and not all(s is None or s.is_replicated for s in place.in_specs):
            raise NotMappable("the plan leaves an output sharded; the exported model returns whole outputs")
        if node.kind == NodeKind.OP and node.name not in styled and (
                place.local_attrs or place.scale != 1 or place.masked_operands):
            raise NotMappable(f"{node.name} ({node.op}) runs with local shapes or a partial-sum correction "
                              "outside any Linear/LayerNorm, which the model's own code would not apply")


def _place_edge(edge: EdgeReshard, graph: OpGraph, styles: dict[str, _Style], styled: dict[str, str]) -> None:
    """Attribute an edge's reshard to a style's output or input layout, or raise NotMappable."""
    if graph[edge.src].kind in (NodeKind.PARAM, NodeKind.BUFFER):
        if edge.steps:
            raise NotMappable(f"{graph[edge.src].qualname} is resharded before use ({edge.src_spec.format(1)}->"
                              f"{edge.dst_spec.format(1)}); a style keeps parameters in place")
        return
    src, dst = styles.get(styled.get(edge.src, "")), styles.get(styled.get(edge.dst, ""))
    arriving = edge.src_spec
    if src is not None and src.kind != SEQUENCE:
        _set_layout(src, "output_layout", edge.dst_spec, f"output of {styled[edge.src]}")
        arriving = edge.dst_spec
    elif edge.steps and not (dst is not None and dst.kind != SEQUENCE and edge.operand == 0):
        raise NotMappable(f"edge {edge.src} -> {edge.dst} reshards {edge.src_spec.format(1)}->"
                          f"{edge.dst_spec.format(1)} away from any Linear input or output")
    if dst is not None and edge.operand == 0:
        _check_input(dst, edge.dst_spec, styled[edge.dst])
        if dst.kind == SEQUENCE and arriving != dst.input_layout:
            raise NotMappable(f"{styled[edge.dst]} gets {arriving.format(1)}, not its sequence-sharded input")
        if dst.kind != SEQUENCE:
            _set_layout(dst, "input_layout", arriving, f"input of {styled[edge.dst]}")
    elif src is None and edge.src_spec.partial:
        raise NotMappable(f"{edge.src} is a partial sum outside any RowwiseParallel Linear")


def _check_state(plan: Plan, graph: OpGraph, styled: dict[str, str]) -> None:
    """Parameters and buffers outside styled modules must be replicated."""
    owned = {graph[src].qualname for name in styled for src in graph[name].inputs[1:]}
    for name, spec in plan.param_specs.items():
        if name not in owned and not spec.is_replicated:
            raise NotMappable(f"{name} is stored {spec.format(1)} but belongs to no Linear/LayerNorm a style shards")


def _check_input(style: _Style, required: TensorSpec, path: str) -> None:
    """The layout the plan runs the module on must be the one its style computes on."""
    wanted = {COLWISE: TensorSpec.replicated(required.ndim),
              ROWWISE: TensorSpec(((),) * (required.ndim - 1) + ((0,),)),
              SEQUENCE: style.input_layout}[style.kind]
    if required != wanted:
        raise NotMappable(f"{path} ({style.kind}) needs its input as {wanted.format(1)}, the plan gives it "
                          f"{required.format(1)}")


def _set_layout(style: _Style, attr: str, spec: TensorSpec, where: str) -> None:
    current = getattr(style, attr)
    if current is not None and current != spec:
        raise NotMappable(f"the {where} is needed both as {current.format(1)} and as {spec.format(1)}")
    setattr(style, attr, spec)


def _arguments(style: _Style, path: str) -> str:
    """Constructor arguments that differ from the style's defaults."""
    if style.kind == SEQUENCE:
        dim = _sharded_dims(style.input_layout)[0]
        return ("" if dim == 1 else f"sequence_dim={dim}, ") + "use_local_output=True"
    defaults = {COLWISE: ("Replicate()", "Shard(-1)"), ROWWISE: ("Shard(-1)", "Replicate()")}[style.kind]
    args = []
    for name, spec, default in (("input_layouts", style.input_layout, defaults[0]),
                                ("output_layouts", style.output_layout, defaults[1])):
        text = _placement(spec, f"the {name[:-8]} of {path}") if spec is not None else default
        if text != default:
            args.append(f"{name}={text}")
    return ", ".join(args)


def export_dtensor(plan: Plan, graph: OpGraph, model: nn.Module) -> DTensorExport:
    """The plan as ``apply_tensor_parallel(model, device_mesh)`` source, or the reason it does not map."""
    try:
        styles = _styles(plan, graph, model)
        entries = [f'        "{path}": {style.kind}({_arguments(style, path)}),' for path, style in styles.items()]
    except NotMappable as reason:
        return DTensorExport(None, str(reason))
    used = " ".join(entries)
    placements = [name for name in ("Replicate", "Shard") if f"{name}(" in used]
    lines = [f"from torch.distributed.tensor import {', '.join(placements)}"] if placements else []
    kinds = sorted({style.kind for style in styles.values()})
    lines += [f"from torch.distributed.tensor.parallel import {', '.join([*kinds, 'parallelize_module'])}", "", "",
              "def apply_tensor_parallel(model, device_mesh):",
              f'    """{plan.model or "The model"}\'s autoshard plan on mesh {plan.mesh.label} as PyTorch tensor parallelism."""',
              "    return parallelize_module(model, device_mesh, {", *entries, "    })"]
    return DTensorExport("\n".join(lines) + "\n", "")
