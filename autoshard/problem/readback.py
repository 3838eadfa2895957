"""Read a solver choice back into a :class:`Plan`: per-node layouts, per-edge reshard steps, costs."""

from __future__ import annotations

from autoshard.cost.overlap import hidden_edges
from autoshard.frontend.graph import graph_signature
from autoshard.problem.build import ModelProblem
from autoshard.problem.candidates import expert_exchanges_of, operand_meta
from autoshard.frontend.graph import NodeKind
from autoshard.problem.plan import EdgeReshard, NodePlacement, Plan
from autoshard.sharding.exchange import Exchange
from autoshard.sharding.reshard import reshard_steps
from autoshard.sharding.rules import load_rules
from autoshard.sharding.strategy import OpStrategy, count_steps
from autoshard.sharding.spec import TensorSpec


def _local_attrs(mp: ModelProblem, name: str, out_spec: TensorSpec) -> dict:
    """Attribute overrides that make a shape-carrying op (view, expand ...) produce its local piece."""
    node = mp.candidates[name].node
    rule = load_rules().get(node.op or "")
    attr = rule.options.get("local_size_attr") if rule else None
    meta = node.tensor
    if attr is None or meta is None or out_spec.is_replicated:
        return {}
    local = list(out_spec.local_shape(meta.shape, mp.mesh.shape))
    if attr == "sizes":  # unflatten(dim, sizes): only the new dims' sizes; dim counts in the input
        count = len(node.attrs.get("sizes", ()))
        dim = node.attrs.get("dim", 0) % (len(meta.shape) - count + 1)
        return {attr: local[dim: dim + count]}
    return {attr: local}


def _exchanges(mp: ModelProblem, name: str, strategy: OpStrategy) -> tuple[Exchange, ...]:
    """The all-to-alls an expert-parallel strategy runs, as its node cost charged them."""
    if strategy.exchange_axis is None:
        return ()
    node = mp.graph[name]
    operands = [operand_meta(mp.graph, node, src) for src in node.inputs]
    backward = mp.options.mode == "training" and node.requires_grad
    return expert_exchanges_of(node, operands, strategy, mp.mesh.shape, mp.options.capacity_factor, backward)


def edge_cost(mp: ModelProblem, index: int | None, choice: list[int]) -> int:
    """The cost of problem edge ``index`` under ``choice`` (0 for edges the problem omits)."""
    if index is None:
        return 0
    u, v = mp.problem.edges[index]
    return int(mp.problem.edge_costs[index][choice[u], choice[v]])


def _segments(mp: ModelProblem, choice: list[int]) -> list[list[str]]:
    """The runs of consecutive graph nodes that ``choice`` recomputes: from the first to the last
    node of each recomputed block (a run is closed: every input from outside comes before it)."""
    names = list(mp.graph.nodes)
    order = mp.life.order
    return [names[order[block[0]]: order[block[-1]] + 1] for block in mp.recomputed_blocks(choice)]


def make_plan(mp: ModelProblem, choice: list[int], model: str = "", lower_bound: int | None = None,
              proved_optimal: bool = False) -> Plan:
    """The plan that ``choice`` (one strategy per graph node, or per problem node) describes."""
    choice = mp.complete(choice)
    nodes: dict[str, NodePlacement] = {}
    param_specs: dict[str, TensorSpec] = {}
    for i, name in enumerate(mp.names):
        cand = mp.candidates[name]
        strategy = cand.strategies[choice[i]]
        nodes[name] = NodePlacement(
            name=name,
            op=cand.node.op,
            module=cand.node.module,
            in_specs=strategy.in_specs,
            out_spec=strategy.out_spec,
            cost=cand.costs[choice[i]],
            local_attrs=_local_attrs(mp, name, strategy.out_spec),
            scale=strategy.scale,
            masked_operands=strategy.masked,
            count_steps=count_steps(strategy, cand.node.tensor.itemsize, mp.mesh.shape) if strategy.count_axes else (),
            exchange_axis=strategy.exchange_axis,
            exchanges=_exchanges(mp, name, strategy),
        )
        if cand.node.kind in (NodeKind.PARAM, NodeKind.BUFFER):
            param_specs[cand.node.qualname] = strategy.out_spec
    edges = []
    hidden = hidden_edges(mp.graph, mp.options.overlap)
    shape_of = mp.mesh.shape
    for e in mp.edges:
        src = nodes[e.src].out_spec
        dst = nodes[e.dst].in_specs[e.operand]
        if dst is None:  # an operand read only for its dtype/device: any layout will do
            edges.append(EdgeReshard(e.src, e.dst, e.operand, src, src, ()))
            continue
        steps = reshard_steps(src, dst, e.meta.shape, e.meta.itemsize, shape_of)
        grad_src = grad_dst = None
        grad_steps: tuple = ()
        if e.backward:
            dst_strategy = mp.strategy(e.dst, choice)
            grad_src, grad_dst = dst_strategy.grad_specs[e.operand], src.without_partial()
            grad_steps = reshard_steps(grad_src, grad_dst, e.meta.shape, e.meta.itemsize, shape_of)
        storage = mp.candidates[e.src].storage
        regather = bool(storage) and storage[choice[mp.names.index(e.src)]].regather \
            and mp.life.first_reader.get(e.src) == e.dst and steps != ()
        edges.append(EdgeReshard(e.src, e.dst, e.operand, src, dst, steps, grad_src, grad_dst, grad_steps,
                                 edge_cost(mp, e.index, choice), regather, (e.dst, e.operand) in hidden))
    return Plan(
        model=model,
        fingerprint=mp.fingerprint,
        mesh=mp.mesh,
        cost_model=mp.cost_model.name,
        mode=mp.options.mode,
        nodes=nodes,
        edges=edges,
        total_cost=mp.problem.cost(choice),
        cost_unit=mp.cost_model.unit,
        ticks_per_unit=mp.cost_model.ticks_per_unit,
        lower_bound=lower_bound,
        proved_optimal=proved_optimal,
        param_specs=param_specs,
        recompute=_segments(mp, choice),
        recompute_kept=[n for block in mp.recomputed_blocks(choice) for n in block if n in mp.blocks.saved],
        frontend=mp.graph.frontend,
        signature=graph_signature(mp.graph),
        capacity_factor=mp.options.capacity_factor,
    )
