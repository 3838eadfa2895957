"""One mesh axis of a plan as PyTorch tensor-parallel styles (ColwiseParallel, RowwiseParallel, SequenceParallel).

PyTorch's ``parallelize_module`` shards whole modules: an ``nn.Linear`` whose weight is split on
its output features is ``ColwiseParallel`` (output sharded on the last dim), on its input
features ``RowwiseParallel`` (output a partial sum, reduced to ``output_layouts``); an
``nn.Embedding`` split on its embedding dim is ``ColwiseParallel``; an ``nn.LayerNorm`` that runs
on a sequence-sharded input is ``SequenceParallel``. Each style reshards only at its module's
boundary: its input from ``input_layouts`` to the layout it computes on, its output to
``output_layouts``; everything in between runs on local tensors with the model's own code.

:func:`tp_styles` reads a plan projected onto one axis (a 1-D plan, see ``lower.project``) and
checks, edge by edge, that it is expressible that way: every parameter is laid out as its
module's style stores it, or replicated, or stored sharded and gathered whole for an op that runs
on the rank's batch slice (``fully_shard`` on the axis: :attr:`AxisStyles.gathered`); every
forward reshard sits at a styled module's input or output (a batch slice there, ``Shard(0)``, is
how a style hands over to the data-parallel layers between styled modules), or slices a whole
tensor; nothing outside styled modules needs an explicit local size, a scale or a mask, except
on the rank's batch slice (the model's code sizes its views from what it gets) and the loss's
mean over it (the rank's share, ``loss_share``). Outputs leave whole or as the rank's batch
slice, except logits left sharded on their last dim by a ColwiseParallel module, which stay a
DTensor for ``loss_parallel``. DTensor derives the backward itself, so gradient steps are not
consulted. Otherwise :class:`NotMappable` names the first edge or tensor that does not map.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from torch import nn

from autoshard.frontend.graph import NodeKind, OpGraph, OpNode
from autoshard.problem.plan import EdgeReshard, Plan
from autoshard.sharding.reshard import ALL_GATHER, SLICE
from autoshard.sharding.rules import load_rules
from autoshard.sharding.spec import TensorSpec

COLWISE, ROWWISE, SEQUENCE = "ColwiseParallel", "RowwiseParallel", "SequenceParallel"
# op -> (module types it may style, operand of the weight, operand of the activation)
STYLED_OPS: dict[str, tuple[tuple[type[nn.Module], ...], int, int]] = {
    "linear": ((nn.Linear,), 1, 0),
    "embedding": ((nn.Embedding,), 0, 1),
    "layer_norm": ((nn.LayerNorm,), 1, 0),
}


class NotMappable(Exception):
    """Why the plan has no torch.distributed equivalent."""


@dataclass
class Style:
    """One styled module: its style, the operand its input arrives on, the layouts at its boundary
    (None: the style's default), and whether its output stays a DTensor (for loss_parallel)."""

    kind: str
    activation: int
    input_layout: TensorSpec | None = None
    output_layout: TensorSpec | None = None
    dtensor_output: bool = False


@dataclass
class AxisStyles:
    """One axis as PyTorch runs it: the styled modules by path, the parameters stored sharded and
    gathered whole for ops on the rank's batch slice (what ``fully_shard`` on the axis does), and
    whether the model's output leaves unstyled as the rank's batch slice or its share of a loss."""

    styles: dict[str, Style] = field(default_factory=dict)
    gathered: set[str] = field(default_factory=set)
    loss_cut: bool = False


def sharded_dims(spec: TensorSpec) -> list[int]:
    """Tensor dims the spec shards."""
    return [d for d, axes in enumerate(spec.dims) if axes]


def batch_cut(spec: TensorSpec | None) -> bool:
    """The 1-D spec holds the rank's slice of the batch: dim 0 sharded, nothing else, no partial sum."""
    return spec is not None and not spec.partial and spec.ndim > 0 and sharded_dims(spec) == [0]


def placement(spec: TensorSpec, where: str) -> str:
    """``Replicate()`` or ``Shard(d)`` (``Shard(-1)`` for the last dim) for a 1-D spec."""
    dims = sharded_dims(spec)
    if spec.partial:
        raise NotMappable(f"{where} is a partial sum, which no style leaves between modules")
    if not dims:
        return "Replicate()"
    return f"Shard({-1 if dims[0] == spec.ndim - 1 else dims[0]})"


def _shards(spec: TensorSpec | None, dim: int) -> bool:
    return spec is not None and not spec.partial and sharded_dims(spec) == [dim % spec.ndim]


def _style_of(node: OpNode, graph: OpGraph, plan: Plan, model: nn.Module,
              uses: dict[tuple[str, int], TensorSpec]) -> tuple[str, Style] | None:
    """(module path, style) when ``node`` is the op of a module a style can shard the way the plan uses
    its parameters (``uses``: the layout each operand is read in)."""
    types, weight_at, activation = STYLED_OPS.get(node.op or "", ((), 0, 0))
    if not types or len(node.inputs) <= max(weight_at, activation) or graph[node.inputs[weight_at]].kind != NodeKind.PARAM:
        return None
    path = graph[node.inputs[weight_at]].qualname.rpartition(".")[0]
    if not isinstance(model.get_submodule(path), types):
        return None
    weight = uses[node.name, weight_at]
    extra = [uses[node.name, k] for k, src in enumerate(node.inputs)
             if k not in (weight_at, activation) and graph[src].kind == NodeKind.PARAM]
    if node.op == "linear":
        if _shards(weight, 0) and all(_shards(s, 0) for s in extra):
            return path, Style(COLWISE, activation)
        if _shards(weight, 1) and all(s.is_replicated for s in extra):
            return path, Style(ROWWISE, activation)
    if node.op == "embedding" and _shards(weight, 1):
        return path, Style(COLWISE, activation)
    if node.op == "layer_norm" and weight.is_replicated and all(s.is_replicated for s in extra):
        arriving = plan.nodes[node.name].in_specs[activation]
        if len(sharded_dims(arriving)) == 1 and not arriving.partial and not batch_cut(arriving):
            return path, Style(SEQUENCE, activation, input_layout=arriving)
    return None


def tp_styles(plan: Plan, graph: OpGraph, model: nn.Module) -> AxisStyles:
    """The style of every module a 1-D ``plan`` shards, with boundary layouts; raises NotMappable."""
    axis = AxisStyles()
    styled: dict[str, str] = {}
    uses = {(e.dst, e.operand): e.dst_spec for e in plan.edges}
    plan = _defer_batch_gathers(plan, graph, model, uses)
    for node in graph:
        found = _style_of(node, graph, plan, model, uses) if node.kind == NodeKind.OP else None
        if found is None:
            continue
        path, style = found
        if path in axis.styles and axis.styles[path].kind != style.kind:
            raise NotMappable(f"module {path} is called with two different shardings")
        axis.styles.setdefault(path, style)
        styled[node.name] = path
    axis.gathered = _check_state(plan, graph, styled, model)
    reshaped = _gathered_after_views(plan, graph, axis.styles, styled)
    _check_nodes(plan, graph, styled, reshaped)
    for edge in plan.edges:
        if edge.src not in reshaped and edge.dst not in reshaped:
            _place_edge(edge, graph, axis.styles, styled)
    outputs = [e for e in plan.edges if graph[e.dst].kind == NodeKind.OUTPUT and e.src not in {*styled, *reshaped}]
    axis.loss_cut = any(batch_cut(e.src_spec) or e.src_spec.partial for e in outputs)
    return axis


def _cut_batch(spec: TensorSpec) -> TensorSpec:
    return TensorSpec(((0,),) + spec.dims[1:])


def _defer_batch_gathers(plan: Plan, graph: OpGraph, model: nn.Module,
                         uses: dict[tuple[str, int], TensorSpec]) -> Plan:
    """The plan with each gather of the batch that feeds, through row-wise elementwise ops only, a styled
    module's input (``model.norm``'s last multiply before ``lm_head``) moved to that input. The values are
    the same; the ops in between run on the rank's batch slice, as the model's code runs them between
    styled modules, and their parameters' gradients are reduced as data parallelism's."""
    edges = list(plan.edges)
    nodes = dict(plan.nodes)
    into = {(e.dst, e.src): k for k, e in enumerate(edges)}
    for k, edge in enumerate(edges):
        if not (edge.steps and batch_cut(edge.src_spec) and edge.dst_spec.is_replicated and edge.dst_spec.ndim > 0
                and graph[edge.src].kind == NodeKind.OP and all(s.kind == ALL_GATHER for s in edge.steps)):
            continue
        chain, name = [], edge.dst
        while _style_of(graph[name], graph, plan, model, uses) is None:
            rule, users = load_rules().get(graph[name].op or ""), graph.users(name)
            if rule is None or rule.kind != "elementwise" or len(users) != 1 or nodes[name].out_spec is None \
                    or nodes[name].out_spec.ndim != edge.dst_spec.ndim or not nodes[name].out_spec.is_replicated:
                break
            chain.append(name)
            name = users[0].name
        else:
            if not chain or into.get((name, chain[-1])) is None:
                continue
            last = into[(name, chain[-1])]
            edges[k] = replace(edge, dst_spec=edge.src_spec, steps=())
            edges[last] = replace(edges[last], src_spec=_cut_batch(edges[last].src_spec), steps=edge.steps)
            for n in chain:
                place = nodes[n]
                inputs = graph[n].inputs
                nodes[n] = replace(place, out_spec=_cut_batch(place.out_spec), in_specs=tuple(
                    _cut_batch(s) if s is not None and (j == edge.operand and n == edge.dst or inputs[j] in chain)
                    else s for j, s in enumerate(place.in_specs)))
    return replace(plan, nodes=nodes, edges=edges)


def _gathered_after_views(plan: Plan, graph: OpGraph, styles: dict[str, Style], styled: dict[str, str]) -> set[str]:
    """Views and slices between a ColwiseParallel output and the reshard that makes it whole or cuts it
    on the batch, as in ``lm_head`` -> ``flatten`` -> all-gather -> cross-entropy. They move no data, so
    resharding before them is the same collective: the module's output layout becomes the reshard's
    target and the views run on it, as the model's own code does. Returns the views; each must be its
    producer's only consumer."""
    views: set[str] = set()
    for edge in plan.edges:
        if not edge.steps or edge.src in styled or not (edge.dst_spec.is_replicated or batch_cut(edge.dst_spec)):
            continue
        chain, node = [], graph[edge.src]
        while node.kind == NodeKind.OP and _moves_no_data(node, plan) and len(graph.users(node.name)) == 1 \
                and node.inputs:
            chain.append(node.name)
            node = graph[node.inputs[0]]
        style = styles.get(styled.get(node.name, ""))
        if chain and style is not None and style.kind == COLWISE and len(graph.users(node.name)) == 1:
            _set_layout(style, "output_layout", edge.dst_spec, f"output of {styled[node.name]}")
            views.update(chain)
    return views


def _moves_no_data(node: OpNode, plan: Plan) -> bool:
    """A view, or a slice along a dim the plan does not shard (``logits[:, :-1]``): resharding before it
    runs the same collective on the same rows."""
    rule = load_rules().get(node.op or "")
    place = plan.nodes[node.name]
    unsharded_slice = rule is not None and rule.kind == "slice" and place.in_specs[:1] == (place.out_spec,)
    return unsharded_slice or (rule is not None and rule.kind == "view")


def _feeds_output_only(graph: OpGraph, name: str) -> bool:
    users = graph.users(name)
    return bool(users) and all(graph[u].kind == NodeKind.OUTPUT for u in users)


def _check_nodes(plan: Plan, graph: OpGraph, styled: dict[str, str], reshaped: set[str]) -> None:
    """No local shapes, scaling or masking outside styled modules, but for views of gathered outputs
    (they run whole), sizes on the rank's batch slice and the loss's mean over it."""
    for node in graph:
        place = plan.nodes.get(node.name)
        if node.kind != NodeKind.OP or place is None or node.name in styled or node.name in reshaped:
            continue
        if place.local_attrs and not batch_cut(place.out_spec):
            raise NotMappable(f"{node.name} ({node.op}) needs an explicit size ({', '.join(place.local_attrs)}) on "
                              "the tensor-parallel axis outside any styled module, which the model's own code "
                              "would not apply")
        if (place.scale != 1 or place.masked_operands) and not _feeds_output_only(graph, node.name):
            raise NotMappable(f"{node.name} ({node.op}) needs a partial-sum correction on the tensor-parallel axis "
                              "outside any styled module, which the model's own code would not apply")


def _place_edge(edge: EdgeReshard, graph: OpGraph, styles: dict[str, Style], styled: dict[str, str]) -> None:
    """Attribute an edge's reshard to a style's output or input layout, or raise NotMappable."""
    src, dst = styles.get(styled.get(edge.src, "")), styles.get(styled.get(edge.dst, ""))
    if graph[edge.src].kind in (NodeKind.PARAM, NodeKind.BUFFER):
        if edge.steps and (dst is not None or any(step.kind != ALL_GATHER for step in edge.steps)):
            raise NotMappable(f"{graph[edge.src].qualname} is resharded before use ({edge.src_spec.format(1)}->"
                              f"{edge.dst_spec.format(1)}); a style keeps parameters in place")
        return
    if graph[edge.dst].kind == NodeKind.OUTPUT:
        _place_output(edge, src, styled.get(edge.src, edge.src))
        return
    arriving = edge.src_spec
    if src is not None and src.kind != SEQUENCE:
        _set_layout(src, "output_layout", edge.dst_spec, f"output of {styled[edge.src]}")
        arriving = edge.dst_spec
    elif edge.steps and not (dst is not None and dst.kind != SEQUENCE and edge.operand == dst.activation) \
            and not all(step.kind == SLICE for step in edge.steps):
        raise NotMappable(f"edge {edge.src} -> {edge.dst} reshards {edge.src_spec.format(1)}->"
                          f"{edge.dst_spec.format(1)} away from any styled module's input or output")
    if dst is not None and edge.operand == dst.activation:
        _check_input(dst, edge.dst_spec, styled[edge.dst])
        if dst.kind == SEQUENCE and arriving != dst.input_layout:
            raise NotMappable(f"{styled[edge.dst]} gets {arriving.format(1)}, not its sequence-sharded input")
        if dst.kind != SEQUENCE:
            _set_layout(dst, "input_layout", arriving, f"input of {styled[edge.dst]}")
    elif src is None and edge.src_spec.partial and not _feeds_output_only(graph, edge.src):
        raise NotMappable(f"{edge.src} is a partial sum outside any RowwiseParallel Linear")


def _place_output(edge: EdgeReshard, src: Style | None, where: str) -> None:
    """An output leaves whole, as the rank's batch slice (a loss: its share of the mean), or as the
    last-dim-sharded DTensor of a ColwiseParallel module (loss_parallel)."""
    if src is None and (batch_cut(edge.src_spec) or edge.src_spec.partial):
        return
    if edge.dst_spec.is_replicated:
        if src is not None and src.kind != SEQUENCE:
            _set_layout(src, "output_layout", edge.dst_spec, f"output of {where}")
        elif edge.steps:
            raise NotMappable(f"the output {edge.src} is gathered from {edge.src_spec.format(1)} outside any styled "
                              "module")
        return
    if src is not None and src.kind == COLWISE and _shards(edge.dst_spec, -1) and not edge.steps:
        _set_layout(src, "output_layout", edge.dst_spec, f"output of {where}")
        src.dtensor_output = True
        return
    raise NotMappable(f"the plan leaves output {edge.src} as {edge.dst_spec.format(1)}; the exported model returns "
                      "whole outputs, the rank's batch slice, or logits sharded on their last dim by a "
                      "ColwiseParallel module")


def _check_state(plan: Plan, graph: OpGraph, styled: dict[str, str], model: nn.Module) -> set[str]:
    """Parameters outside styled modules are replicated, or stored sharded and gathered whole for ops
    on the rank's batch slice (returned: fully_shard on the axis runs them); buffers stay whole."""
    owned = {graph[src].qualname for name in styled for src in graph[name].inputs if graph[src].kind == NodeKind.PARAM}
    gathered: set[str] = set()
    for node in (n for n in graph if n.kind == NodeKind.PARAM and n.qualname not in owned):
        name, spec = node.qualname, plan.param_specs[node.qualname]
        uses = [e for e in plan.edges if e.src == node.name]
        batch = all(batch_cut(plan.nodes[e.dst].out_spec) or plan.nodes[e.dst].out_spec.partial for e in uses)
        if spec.is_replicated and all(e.dst_spec.is_replicated for e in uses):
            continue
        owner = name.rpartition(".")[0]
        if all(e.dst_spec.is_replicated for e in uses):
            if not batch:
                user = next(plan.nodes[e.dst] for e in uses if not batch_cut(plan.nodes[e.dst].out_spec))
                raise NotMappable(f"{name} is stored {spec.format(1)} and gathered whole for {user.name} ({user.op}), "
                                  f"which runs as {user.out_spec.format(1)}, not on the rank's batch slice (where "
                                  "fully_shard would reduce its gradient as data parallelism's)")
            gathered.add(name)
            continue
        kind = type(model.get_submodule(owner)).__name__ if owner else type(model).__name__
        raise NotMappable(f"{name} is used {next(e.dst_spec for e in uses if not e.dst_spec.is_replicated).format(1)}"
                          f", but its module {owner} ({kind}) is not an nn.Linear / nn.Embedding / nn.LayerNorm "
                          "sharded the way a ColwiseParallel / RowwiseParallel / SequenceParallel style shards it")
    return gathered


def _check_input(style: Style, required: TensorSpec, path: str) -> None:
    """The layout the plan runs the module on must be the one its style computes on."""
    wanted = {COLWISE: TensorSpec.replicated(required.ndim),
              ROWWISE: TensorSpec(((),) * (required.ndim - 1) + ((0,),)),
              SEQUENCE: style.input_layout}[style.kind]
    if required != wanted:
        raise NotMappable(f"{path} ({style.kind}) needs its input as {wanted.format(1)}, the plan gives it "
                          f"{required.format(1)}")


def _set_layout(style: Style, attr: str, spec: TensorSpec, where: str) -> None:
    current = getattr(style, attr)
    if current is not None and current != spec:
        raise NotMappable(f"the {where} is needed both as {current.format(1)} and as {spec.format(1)}")
    setattr(style, attr, spec)


def style_arguments(style: Style, path: str) -> str:
    """Constructor arguments that differ from the style's defaults."""
    if style.kind == SEQUENCE:
        dim = sharded_dims(style.input_layout)[0]
        return ("" if dim == 1 else f"sequence_dim={dim}, ") + "use_local_output=True"
    defaults = {COLWISE: ("Replicate()", "Shard(-1)"), ROWWISE: ("Shard(-1)", "Replicate()")}[style.kind]
    args = []
    for name, spec, default in (("input_layouts", style.input_layout, defaults[0]),
                                ("output_layouts", style.output_layout, defaults[1])):
        text = placement(spec, f"the {name[:-8]} of {path}") if spec is not None else default
        if text != default:
            args.append(f"{name}={text}")
    if style.dtensor_output:
        args.append("use_local_output=False")
    return ", ".join(args)
