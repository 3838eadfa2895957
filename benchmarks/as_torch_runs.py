"""torchtitan's plan priced as torch runs it, not as our runtime would: causal attention on split
query rows as torch's load-balanced ring attention with its gradients' fp32 exchanges
(``cost/ring.py``), a module's input
redistributed once for all the linears reading it, and under async TP each tensor-parallel
collective micro-pipelined with the matmuls torch's pass fuses it with (``cost/async_tp.py``).
``reality.py`` prices every published row with ``plan_ticks(..., as_torch=True)``."""

from __future__ import annotations

from autoshard.cost.async_tp import fused_exposed, fuses
from autoshard.cost.compute import causal_split_load
from autoshard.cost.float8 import activation_itemsize, compute_dtype
from autoshard.cost.memory import local_bytes
from autoshard.cost.ring import gradient_ring_seconds, merge_bytes, ring_load
from autoshard.frontend.graph import TensorMeta
from autoshard.problem.build import ModelEdge, ModelProblem
from autoshard.problem.candidates import Candidate
from autoshard.problem.edges import EdgePrices
from autoshard.sharding.reshard import ALL_GATHER, REDUCE_SCATTER, Step, reshard_steps
from autoshard.sharding.spec import TensorSpec


def ring_attentions(mp: ModelProblem, choice: list[int]) -> list[tuple[int, int]]:
    """(node index, ring size) of each causal attention whose query rows ``choice`` splits over
    ``p >= 2`` devices: what torch's ``context_parallel`` runs as ring attention."""
    found = []
    for i, name in enumerate(mp.names):
        cand = mp.candidates[name]
        node, strategy = cand.node, cand.strategies[choice[i]]
        if node.op != "scaled_dot_product_attention" or not node.attrs.get("is_causal") or node.tensor is None:
            continue
        parts = mp.mesh.axes_size(strategy.in_specs[0].dims[-2])
        if parts >= 2:
            found.append((i, parts))
    return found


def ring_node_ticks(mp: ModelProblem, choice: list[int]) -> list[int]:
    """Each node's ticks under ``choice`` as torch's ``context_parallel`` runs torchtitan's FSDP x CP
    plan (``cost/ring.py``): a causal attention whose query rows are split over ``p`` devices does
    an even share of the causal work (load-balanced chunks; our runtime's contiguous rows leave the
    last device ``causal_split_load(p)`` times it), plus the ring's fp32 merges, once more in a
    recomputed forward. Every other node as our model prices it."""
    ticks = [int(c[s]) for c, s in zip(mp.problem.node_costs, choice)]
    device = mp.cost_model.device
    for i, parts in ring_attentions(mp, choice):
        cand, query = mp.candidates[mp.names[i]], mp.candidates[mp.names[i]].node.tensor
        elements = local_bytes(cand.strategies[choice[i]].out_spec, query, mp.mesh) // query.itemsize
        forward, backward = merge_bytes(elements, parts, query.itemsize)
        passes = 2 if cand.reruns is not None and cand.reruns[choice[i]] else 1
        merges = mp.cost_model.ticks((passes * forward + backward) / device.streaming_bandwidth)
        ticks[i] = round(ticks[i] * ring_load(parts) / causal_split_load(parts)) + merges
    return ticks


def ring_exchange_ticks(mp: ModelProblem, choice: list[int]) -> int:
    """Ticks the ring attentions' backward exchanges of fp32 key and value gradients leave exposed
    under ``choice`` (``cost/ring.py``: ``gradient_ring_seconds``), on the slowest link of the axes
    splitting the sequence: all of them where the step is compiled (the ring traced into the graph),
    else what each step's share of the attention's backward (its even share of the causal work, as
    ``ring_node_ticks``) does not hide. The keys' and values' all-gathers are the plan's own edges."""
    total = 0.0
    for i, parts in ring_attentions(mp, choice):
        cand, j = mp.candidates[mp.names[i]], choice[i]
        axes = cand.strategies[j].in_specs[0].dims[-2]
        latency, bandwidth = max(mp.mesh.latency[a] for a in axes), min(mp.mesh.bandwidth[a] for a in axes)
        query, key = cand.node.tensor, mp.graph[cand.node.inputs[1]].tensor
        elements = local_bytes(cand.strategies[j].out_spec, query, mp.mesh) // query.itemsize * key.numel // query.numel
        hidden = None
        if mp.options.compile is None:
            forward = cand.forward_costs[j] * (2 if cand.reruns is not None and cand.reruns[j] else 1)
            backward = (int(mp.problem.node_costs[i][j]) - forward) * ring_load(parts) / causal_split_load(parts)
            hidden = backward / parts / mp.cost_model.ticks_per_unit
        total += gradient_ring_seconds(elements, parts, latency, bandwidth, hidden)
    return mp.cost_model.ticks(total)


def gathered_once_ticks(mp: ModelProblem, choice: list[int]) -> int:
    """The edges' ticks under ``choice`` with one reshard per producer and layout read, as
    torchtitan's tensor-parallel plan runs it: a module's input is redistributed once
    (``PrepareModuleInput``, ``SequenceParallel``) for all the linears that read it (wq, wk, wv; w1,
    w3), its gradient reduced once, where our runtime reshards on every reader's edge. A group of
    edges from one producer to one layout costs its dearest edge; under async TP, what one shared
    reshard leaves exposed (``shared_async_ticks``)."""
    groups: dict[tuple[str, TensorSpec], list[ModelEdge]] = {}
    for edge in mp.edges:
        if edge.index is not None:
            read = mp.candidates[edge.dst].strategies[choice[mp.problem.edges[edge.index][1]]].in_specs[edge.operand]
            groups.setdefault((edge.src, read), []).append(edge)
    prices = EdgePrices(mp.mesh, mp.cost_model, mp.options.precision)
    total = 0
    for members in groups.values():
        if mp.options.async_tp and mp.candidates[members[0].src].storage is None:
            sole = sum(src == members[0].src for src, _ in groups) == 1
            total += shared_async_ticks(mp, prices, members, choice, sole)
        else:
            total += max(int(mp.problem.edge_costs[e.index][tuple(choice[n] for n in mp.problem.edges[e.index])])
                         for e in members)
    counted = {e.index for members in groups.values() for e in members}
    return total + sum(int(m[choice[a], choice[b]]) for i, ((a, b), m) in enumerate(zip(mp.problem.edges,
                                                                                       mp.problem.edge_costs))
                       if i not in counted)


def shared_async_ticks(mp: ModelProblem, prices: EdgePrices, members: list[ModelEdge], choice: list[int],
                       sole: bool) -> int:
    """What one reshard of a producer's output, read in one layout by the ``members``' consumers,
    costs under async TP as torch runs it (``cost/async_tp.py``): its forward an all-gather fused
    with every consuming bias-free linear (one ``fused_all_gather_matmul``) or a reduce-scatter
    fused with the producing one (``sole``: the product's only reader), again where a consumer
    reruns; its backward on the sum of the members' input gradients, in full where more than one
    writes it, else a reduce-scatter fused with that writer's input-gradient product or an
    all-gather fused with the producer's; any other reshard in full."""
    src = mp.candidates[members[0].src]
    i = choice[mp.problem.edges[members[0].index][0]]
    out = src.strategies[i].out_spec
    meta = members[0].meta
    forward = backward = 0
    readers, writers, again = [], [], False
    for edge in members:
        dst = mp.candidates[edge.dst]
        j = choice[mp.problem.edges[edge.index][1]]
        fwd, bwd = prices.reshard_matrices(src, dst, edge.operand, edge.meta, edge.backward)
        forward, backward = max(forward, int(fwd[i, j])), max(backward, int(bwd[i, j]))
        readers.append((edge, dst, j))
        writers += [(edge, dst, j)] if edge.backward else []
        again |= dst.reruns is not None and bool(dst.reruns[j])
    edge, dst, j = readers[0]
    cast = activation_itemsize(dst.node) if edge.operand == 0 and not out.partial else None
    steps = reshard_steps(out, dst.strategies[j].in_specs[edge.operand], meta.shape, cast or meta.itemsize,
                          mp.mesh.shape)
    consumers = [(d, k, 0) for e, d, k in readers if e.operand == 0 and fuses(d.node)]
    producer = [(src, i, 0)] if sole and fuses(src.node) else []
    forward_left = min(_fused(mp, steps, meta, ALL_GATHER, forward, consumers, len(consumers) < len(readers)),
                       _fused(mp, steps, meta, REDUCE_SCATTER, forward, producer))
    backward_left = backward
    if len(writers) == 1:
        edge, dst, j = writers[0]
        grad = dst.strategies[j].grad_specs[edge.operand]
        cast = activation_itemsize(src.node) if not grad.partial else None
        steps = reshard_steps(grad, out.without_partial(), meta.shape, cast or meta.itemsize, mp.mesh.shape)
        writer = [(dst, j, 1)] if edge.operand == 0 and fuses(dst.node) else []
        reader = [(src, i, 1)] if fuses(src.node) else []
        backward_left = min(_fused(mp, steps, meta, REDUCE_SCATTER, backward, writer),
                            _fused(mp, steps, meta, ALL_GATHER, backward, reader))
    return forward_left * (2 if again else 1) + backward_left


def _fused(mp: ModelProblem, steps: tuple[Step, ...], meta: TensorMeta, kind: str, ticks: int,
           products: list[tuple[Candidate, int, int]], ragged: bool = False) -> int:
    """``fused_exposed`` of a reshard of a tensor of ``meta`` with ``products`` (candidate, strategy,
    0: its forward product, 1: its input-gradient product, half its backward)."""
    gemms = [(c.flops[k][0] if role == 0 else c.flops[k][1] // 2, compute_dtype(c.node.work, c.node.tensor.dtype))
             for c, k, role in products]
    return fused_exposed(steps, meta.shape, mp.mesh.shape, kind, ticks, gemms, mp.cost_model.device,
                         mp.cost_model.ticks_per_unit, ragged)


def plan_ticks(mp: ModelProblem, choice: list[int], as_torch: bool) -> tuple[list[int], int]:
    """(each node's ticks, the edges' total) of ``choice``: as our model prices it (our runtime), or
    with ``as_torch`` as torch runs torchtitan's plan: causal attention on split rows as its ring
    attention (``ring_node_ticks``) with its gradients' exchanges (``ring_exchange_ticks``), a
    module's input gathered once (``gathered_once_ticks``)."""
    if not as_torch:
        nodes = [int(c[s]) for c, s in zip(mp.problem.node_costs, choice)]
        return nodes, sum(int(m[choice[a], choice[b]]) for (a, b), m in zip(mp.problem.edges, mp.problem.edge_costs))
    return ring_node_ticks(mp, choice), gathered_once_ticks(mp, choice) + ring_exchange_ticks(mp, choice)
