"""The torchtitan-style plan for mixture-of-experts models, costed in our model (``--baseline torchtitan-moe``).

What torchtitan runs for MoE transformers (its Llama 4 / DeepSeek-V3 recipes): experts split
over one mesh axis with tokens sent to them by all-to-all (expert parallelism), FSDP over the
other (parameters stored sharded, gathered before use and again for backward:
``reshard_after_forward``, gradients reduce-scattered), tensor parallelism on attention:

- on a 1-D mesh: data parallelism for every op (the batch split), experts parallel on the same
  axis, every other parameter FSDP-sharded on it;
- on a 2-D mesh: the last (intra-node) axis is tensor-parallel for attention, the shared
  experts and the LM head (by module role, as torchtitan's plan names them: the output
  projections ``o_proj``/``down_proj``/... row-parallel, every other linear column-parallel) and
  expert-parallel for the experts; the router runs on tokens split over both axes; the first
  axis splits the batch and FSDP-shards every parameter.

Every other op takes the strategy that is cheapest given its producers. The plan is one point
of our search space, so a proved optimum never costs more.
"""

from __future__ import annotations

from autoshard.baselines import _incoming_cost
from autoshard.build import ModelProblem
from autoshard.graph import NodeKind
from autoshard.sharding.spec import TensorSpec


ROW_PARALLEL = ("o_proj", "out_proj", "down_proj", "wo", "w2", "c_proj")
"""Linear modules torchtitan runs row-parallel (the second of a pair); every other one is column-parallel."""


def _wanted(mp: ModelProblem, name: str) -> tuple[dict[str, tuple[int, ...]], int | None] | None:
    """(index assignment, exchange axis) torchtitan gives op ``name``, or None to leave it to the greedy pass."""
    cand = mp.candidates[name]
    inst, last = cand.instance, mp.mesh.ndim - 1
    if inst is None:
        return None
    every = tuple(range(mp.mesh.ndim))
    if inst.exchange is not None:
        tokens, experts = inst.exchange
        return {tokens: every, experts: (last,)}, last
    weights = [k for k, src in enumerate(cand.node.inputs)
               if mp.graph[src].kind == NodeKind.PARAM and inst.operands[k] is not None and len(inst.operands[k]) == 2]
    if not weights or not inst.contracted:
        return None
    batch = next((l for l in inst.output if l and l.startswith("b")), None)
    if mp.mesh.ndim == 1 or cand.node.module.endswith(".gate"):  # data parallel; the router on all tokens
        return ({batch: every} if batch else {}), None
    out_index, in_index = inst.operands[weights[0]]
    row = cand.node.module.rpartition(".")[2] in ROW_PARALLEL
    assignment = {in_index if row else out_index: (last,)}
    return ({**assignment, batch: every[:-1]} if batch else assignment), None


def _fsdp_storage(mp: ModelProblem, choice: list[int], axis: int) -> list[int]:
    """Every parameter stored as its owner reads it plus split over ``axis`` on its first free dim that
    divides, re-gathered for backward in training (FSDP2's ``reshard_after_forward``)."""
    index = {n: i for i, n in enumerate(mp.names)}
    training = mp.options.mode == "training"
    for name, cand in mp.candidates.items():
        if cand.storage is None or cand.storage[0].use is None:
            continue
        owner = mp.life.first_reader[name]
        use = mp.candidates[owner].strategies[choice[index[owner]]].in_specs[mp.graph[owner].inputs.index(name)]
        target = _sharded_on(use, cand.node.tensor.shape, axis, mp.mesh.shape)
        ranked = sorted((i for i, s in enumerate(cand.storage) if s.use == use),
                        key=lambda i: (cand.strategies[i].out_spec != target, cand.storage[i].regather != training))
        if ranked:
            choice[index[name]] = ranked[0]
    return choice


def _sharded_on(use: TensorSpec, shape: tuple[int, ...], axis: int, mesh_shape: tuple[int, ...]) -> TensorSpec:
    """``use`` with ``axis`` added to the first dim it divides (``use`` itself if it uses the axis)."""
    if axis in use.used_axes:
        return use
    for d, n in enumerate(shape):
        dims = list(use.dims)
        dims[d] = use.dims[d] + (axis,)
        candidate = TensorSpec(tuple(dims))
        if candidate.fits(shape, mesh_shape):
            return candidate
    return use


def torchtitan_moe_choice(mp: ModelProblem) -> list[int]:
    """The torchtitan-style MoE plan (module doc) as a strategy index per problem node."""
    choice: list[int | None] = [None] * len(mp.names)
    for i, name in enumerate(mp.names):
        cand = mp.candidates[name]
        if cand.node.kind not in (NodeKind.OP, NodeKind.OUTPUT):
            continue
        options = list(range(len(cand.strategies)))
        wanted = _wanted(mp, name) if cand.node.kind == NodeKind.OP else None
        if wanted is not None:
            assignment, exchange = wanted
            matching = [j for j in options if dict(cand.strategies[j].assignment) == assignment
                        and cand.strategies[j].exchange_axis == exchange]
            options = matching or options
        choice[i] = min(options, key=lambda j: _incoming_cost(mp, name, j, choice))
    for i, name in enumerate(mp.names):
        if choice[i] is None:  # inputs, parameters, buffers: as their first reader reads them
            consumers = [e for e in mp.edges if e.src == name and e.index is not None]
            cand = mp.candidates[name]
            wanted_spec = None
            if consumers:
                first = consumers[0]
                wanted_spec = mp.candidates[first.dst].strategies[choice[mp.names.index(first.dst)]].in_specs[first.operand]
            matches = [j for j, s in enumerate(cand.strategies) if s.out_spec == wanted_spec]
            choice[i] = matches[0] if matches else 0
    return mp.complete(_fsdp_storage(mp, [int(c) for c in choice], 0))
