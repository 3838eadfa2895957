"""The plan torchtitan runs, costed in our model (``--baseline torchtitan``).

torchtitan's recipes (LLaMA-3 dense; Llama 4 / DeepSeek-V3 mixture of experts) combine:

- FSDP2 on the data axis: every parameter stored as its owner reads it plus split over that
  axis, gathered before its forward use, freed, gathered again for backward
  (``reshard_after_forward``: in the repeated layers; the final norm and output projection,
  wrapped last, keep theirs), its gradient reduce-scattered;
- on a 2-D mesh, tensor parallelism on the last (intra-node) axis by module role, as torchtitan's
  plan names them: the output projections (``o_proj``/``down_proj``/...) row-parallel, every
  other linear column-parallel; the ops between them take the strategy cheapest given their
  producers, which is the sequence-parallel norm (reduce-scatter into it, all-gather out);
- experts (mixture of experts) parallel over the last axis with tokens sent by all-to-all, the
  router on tokens split over every axis; on a 1-D mesh data parallelism everywhere;
- activation checkpointing: every repeated layer recomputed in backward under the problem's
  policy (``--recompute full``, or ``selective``: torchtitan's op-level policy), where the
  problem offers recomputation (training under a memory budget, ``cost/recompute.py``); a
  gathered parameter of a recomputed layer is then gathered again for the recompute.

The plan is one point of our search space, so a proved optimum never costs more.
"""

from __future__ import annotations

from autoshard.problem.baselines.megatron import Producers
from autoshard.problem.build import ModelProblem
from autoshard.frontend.graph import NodeKind
from autoshard.sharding.layers import find_repeated_layers
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


def fsdp_storage(mp: ModelProblem, choice: list[int], axis: int | tuple[int, ...]) -> list[int]:
    """Every parameter stored as its owner reads it plus split over ``axis`` (one mesh axis, or
    several: torchtitan's data-parallel shard mesh spanning them) on the first dim where a gather
    over them alone restores the use layout, re-gathered for backward in training where
    torchtitan reshards after forward: in the repeated layers, not in the final norm and output
    projection it wraps last (in a recomputed layer the recompute gathers it again anyway)."""
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    index = {n: i for i, n in enumerate(mp.names)}
    training = mp.options.mode == "training"
    repeated = find_repeated_layers(mp.graph)
    in_layers = repeated.nodes if repeated else frozenset()
    for name, cand in mp.candidates.items():
        if cand.storage is None or cand.storage[0].use is None:
            continue
        owner = mp.life.first_reader[name]
        owned = mp.candidates[owner]
        use = owned.strategies[choice[index[owner]]].in_specs[mp.graph[owner].inputs.index(name)]
        again = owned.recompute[choice[index[owner]]] if owned.recompute is not None else None
        ranked = sorted((i for i, s in enumerate(cand.storage) if s.use == use
                         and (cand.recompute is None or cand.recompute[i] == again)),
                        key=lambda i: (_fsdp_rank(cand.strategies[i].out_spec, use, axes),
                                       cand.storage[i].regather != (training and owner in in_layers)))
        if ranked:
            choice[index[name]] = ranked[0]
    return choice


def _fsdp_rank(stored: TensorSpec, use: TensorSpec, axes: tuple[int, ...]) -> int:
    """0 for ``use`` split over ``axes`` on dim 0, d for them on dim d, a large rank for any other
    layout (larger still when ``stored`` is not ``use``)."""
    if set(axes) & use.used_axes or stored.partial or stored.used_axes != use.used_axes | set(axes):
        return 1 << 20 if stored != use else 1 << 19
    return next((d for d, split in enumerate(stored.dims) if set(axes) <= set(split)), 1 << 18)


def torchtitan_choice(mp: ModelProblem, fsdp_axes: tuple[int, ...] = (0,)) -> list[int]:
    """torchtitan's plan (module doc) as a strategy index per problem node, FSDP over ``fsdp_axes``
    (default the first mesh axis; torchtitan's ``dp_shard`` may span every axis but the
    tensor-parallel last one)."""
    choice: list[int | None] = [None] * len(mp.names)
    producers = Producers(mp)
    for i, name in enumerate(mp.names):
        cand = mp.candidates[name]
        if cand.node.kind not in (NodeKind.OP, NodeKind.OUTPUT):
            continue
        options = list(range(len(cand.strategies)))
        if cand.recompute is not None:  # full activation checkpointing
            options = [j for j in options if cand.recompute[j]]
        wanted = _wanted(mp, name) if cand.node.kind == NodeKind.OP else None
        if wanted is not None:
            assignment, exchange = wanted
            matching = [j for j in options if dict(cand.strategies[j].assignment) == assignment
                        and cand.strategies[j].exchange_axis == exchange]
            options = matching or options
        choice[i] = producers.cheapest(name, options, choice)
    for i, name in enumerate(mp.names):
        if choice[i] is None:  # inputs, parameters, buffers: as their first reader reads them
            wanted_spec = producers.wanted_spec(name, choice)
            matches = [j for j, s in enumerate(mp.candidates[name].strategies) if s.out_spec == wanted_spec]
            choice[i] = matches[0] if matches else 0
    return mp.complete(fsdp_storage(mp, [int(c) for c in choice], fsdp_axes))
