"""Hand-written reference plans, costed in the same model as ours (``--baseline megatron``).

Megatron-LM / torchtitan tensor parallelism: linears whose input is not sharded on its feature
dim are column-parallel (weight split on its output features), linears that consume such a
sharded feature dim are row-parallel (weight split on its input features, output all-reduced),
so attention heads and MLP hidden units end up split. On meshes with more than one axis the
last (intra-node) axis is the tensor-parallel one and the others shard the batch (data
parallelism). Every other op takes the strategy that is cheapest given its producers; every
parameter is stored in the layout its first consumer reads. The result is one point of our
search space, so a proved optimum can never cost more.
"""

from __future__ import annotations

from autoshard.problem.build import ModelProblem
from autoshard.frontend.graph import NodeKind


def _incoming_cost(mp: ModelProblem, name: str, strategy: int, choice: list[int | None]) -> int:
    """Own cost plus the edges from producers already decided."""
    total = mp.candidates[name].costs[strategy]
    index = {n: i for i, n in enumerate(mp.names)}
    for e in mp.edges:
        if e.dst == name and e.index is not None and choice[index[e.src]] is not None:
            u, v = mp.problem.edges[e.index]
            total += int(mp.problem.edge_costs[e.index][choice[u], strategy])
    return total


def _megatron_assignment(mp: ModelProblem, name: str, choice: list[int | None]) -> dict[str, tuple[int, ...]] | None:
    """Column- or row-parallel index assignment for a linear-like op with a parameter weight, else None."""
    cand = mp.candidates[name]
    inst = cand.instance
    if inst is None or not inst.contracted:
        return None
    node = cand.node
    weights = [k for k, src in enumerate(node.inputs)
               if mp.graph[src].kind == NodeKind.PARAM and inst.operands[k] is not None and len(inst.operands[k]) == 2]
    if not weights:
        return None
    weight = inst.operands[weights[0]]
    activation = next((k for k in range(len(node.inputs)) if k not in weights and inst.operands[k]), None)
    if activation is None:
        return None
    tp = mp.mesh.ndim - 1
    row_index = next((l for l in weight if l in inst.contracted), None)
    col_index = next((l for l in weight if l in inst.output), None)
    src = node.inputs[activation]
    src_choice = choice[mp.names.index(src)]
    feature_sharded = False
    if src_choice is not None:
        spec = mp.candidates[src].strategies[src_choice].out_spec
        feature_sharded = bool(spec.dims) and tp in spec.dims[-1]
    assign: dict[str, tuple[int, ...]] = {}
    target = row_index if feature_sharded else col_index
    if target is not None:
        assign[target] = (tp,)
    batch = [l for l in inst.output if l and l.startswith("b")]
    if tp > 0 and batch:
        assign[batch[0]] = tuple(range(tp))
    return assign


def megatron_choice(mp: ModelProblem) -> list[int]:
    """The Megatron-style plan as a strategy index per problem node."""
    choice: list[int | None] = [None] * len(mp.names)
    for i, name in enumerate(mp.names):
        cand = mp.candidates[name]
        if cand.node.kind not in (NodeKind.OP, NodeKind.OUTPUT):
            continue
        options = range(len(cand.strategies))
        wanted = _megatron_assignment(mp, name, choice)
        if wanted is not None:
            matching = [j for j in options if dict(cand.strategies[j].assignment) == wanted]
            if not matching:  # e.g. the batch does not divide: keep only the tensor-parallel part
                tp_only = {k: v for k, v in wanted.items() if v == (mp.mesh.ndim - 1,)}
                matching = [j for j in options if dict(cand.strategies[j].assignment) == tp_only]
            options = matching or options
        choice[i] = min(options, key=lambda j: _incoming_cost(mp, name, j, choice))
    for i, name in enumerate(mp.names):
        if choice[i] is not None:
            continue
        cand = mp.candidates[name]
        consumers = [e for e in mp.edges if e.src == name and e.index is not None]
        if consumers:
            first = consumers[0]
            wanted_spec = mp.candidates[first.dst].strategies[choice[mp.names.index(first.dst)]].in_specs[first.operand]
            matches = [j for j, s in enumerate(cand.strategies) if s.out_spec == wanted_spec]
            if matches:
                choice[i] = min(matches, key=lambda j: cand.usages[j])
                continue
        choice[i] = 0
    return mp.with_storage_of_users([int(c) for c in choice])

