"""Every graph tensor as a decision node: its strategies, their compute cost and their memory items.

- **ops**: one strategy per assignment of mesh axes to the indices of the op's rule
  (``sharding/rules.py``); cost = forward (+ backward in training) seconds of the local work
  (``cost/compute.py``, torch's flop counts); memory = ``cost/memory.op_items``.
- **parameters**: one strategy per (stored layout ``L``, layout ``U`` its owner — the first op
  reading it — uses, keep or re-gather). ``U`` is ``L`` or coarser, reached from ``L`` by
  all-gathers only (FSDP / ZeRO-3 storage): storing a layout coarser than the use is never
  better (same traffic, more memory), so it is not offered. Re-gathering (training only) frees
  the use copy between the owner's forward and backward and gathers it again for backward.
- **buffers** and **inputs**: one strategy per layout (inputs are replicated in inference);
  the **output**: gathered in inference, any layout in training (the loss reads it where it is).

An op without a rule keeps one replicated strategy (and is named in a warning).

Ops that route tokens to experts (a rule with an ``exchange`` pair, ``moe_experts``) split their
flops evenly (a device's share depends on the routing, not on its local shapes); a strategy
that splits the experts is charged ``capacity_factor`` times its share (the busiest device sets
the pace), and an expert-parallel one its all-to-alls too (``sharding/exchange.py``).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from autoshard.cost.communication import CostModel
from autoshard.cost.compute import causal_split_load, op_times
from autoshard.cost.float8 import compute_dtype, with_casts
from autoshard.cost.fusion import compiled_bytes
from autoshard.cost.lifetimes import Lifetimes
from autoshard.cost.memory import (MemoryItem, ParamStorage, local_bytes, out_metas, param_precision,
                                   recompute_variants, state_items)
from autoshard.cost.recompute import NO_BLOCKS, Blocks, checkpoint_readers
from autoshard.frontend.graph import RECEIVED, NodeKind, OpGraph, OpNode, OpWork, TensorMeta
from autoshard.problem.retimed import RetimedItems, RetimedParams

LocalFlops = Callable[[OpNode, Sequence[tuple[int, ...]]], tuple[int, int]]
"""(op node, local operand shapes) -> (forward, backward) flops of one device's piece
(``frontend.profile.LocalFlops``: torch's counter); without it the global flops are split evenly."""
from autoshard.sharding.mesh import Mesh
from autoshard.sharding.reshard import ALL_GATHER, reshard_steps
from autoshard.sharding.rules import OpInstance, RuleError, instantiate, load_rules, strategies, tensor_layouts
from autoshard.sharding.strategy import OpStrategy, count_steps, replicated_strategy
from autoshard.sharding.exchange import Exchange, expert_exchanges
from autoshard.sharding.spec import TensorSpec


@dataclass
class Candidate:
    """A graph tensor as a decision node: its strategies, their own cost, and its memory items;
    for ops the (forward, backward) flops each strategy runs per device and the cost of its
    forward alone; ``recompute[s]``: strategy s recomputes the node's block (cost/recompute.py),
    ``reruns[s]``: and runs the node's forward again (not so for what the policy keeps)."""

    node: OpNode
    strategies: list[OpStrategy]
    costs: list[int]
    items: list[MemoryItem] = field(default_factory=list)
    instance: OpInstance | None = None
    storage: list[ParamStorage] | None = None
    flops: list[tuple[int, int]] | None = None
    forward_costs: list[int] | None = None
    recompute: list[bool] | None = None
    reruns: list[bool] | None = None

    @property
    def usages(self) -> list[int]:
        """Bytes of all its memory items added up, per strategy (a size for tie-breaking)."""
        return [sum(item.usage[s] for item in self.items) for s in range(len(self.strategies))]

    def keep(self, indices: list[int]) -> None:
        """Restrict to the strategies at ``indices`` (pins)."""
        self.strategies = [self.strategies[i] for i in indices]
        self.costs = [self.costs[i] for i in indices]
        self.items = [MemoryItem(m.owner, m.what, m.interval, tuple(m.usage[i] for i in indices)) for m in self.items]
        if self.storage is not None:
            self.storage = [self.storage[i] for i in indices]
        for attr in ("flops", "forward_costs", "recompute", "reruns"):
            if getattr(self, attr) is not None:
                setattr(self, attr, [getattr(self, attr)[i] for i in indices])


def operand_meta(graph: OpGraph, node: OpNode, src: str) -> TensorMeta | None:
    """The tensor operand ``src`` gives ``node`` (an element of a tuple for ``getitem``)."""
    producer = graph[src]
    if node.op == "getitem" and isinstance(producer.out, tuple):
        element = producer.out[node.attrs.get("index", 0)]
        return element if isinstance(element, TensorMeta) else None
    return producer.tensor


def gathers_only(stored: TensorSpec, use: TensorSpec, meta: TensorMeta, mesh: Mesh) -> bool:
    """True when ``use`` is reached from ``stored`` by all-gathers alone (``stored`` refines it)."""
    steps = reshard_steps(stored, use, meta.shape, meta.itemsize, mesh.shape)
    return bool(steps) and all(s.kind == ALL_GATHER for s in steps)


_OPS: dict[tuple, Candidate] = {}
"""Op candidates (strategies, compute costs, flops; no memory items) shared by every build in the
process (pipeline stages), keyed by the op's sharing key and all that ``CandidateBuilder._op``
reads of its builder (``CandidateBuilder.config``)."""


class CandidateBuilder:
    """Computes candidates node by node; identical nodes (repeated layers, and other builds' ops) share theirs."""

    def __init__(self, graph: OpGraph, mesh: Mesh, cost_model: CostModel, life: Lifetimes, training: bool,
                 precision: str, optimizer_slots: int, slapo_space: bool, local_flops: LocalFlops | None = None,
                 blocks: Blocks = NO_BLOCKS, capacity_factor: float = 1.0,
                 receive_link: tuple[float, float] | None = None, keep_gathered: bool = False) -> None:
        self.graph, self.mesh, self.cost_model, self.life = graph, mesh, cost_model, life
        self.receive_link, self.keep_gathered = receive_link, keep_gathered
        self.local_flops, self.blocks = local_flops, blocks
        self.capacity_factor = capacity_factor
        self.doubled: dict[tuple[int, bool], tuple[list[OpStrategy], list[int], list[tuple[int, int]], list[bool],
                                                   list[bool]]] = {}
        self.training, self.precision, self.optimizer_slots = training, precision, optimizer_slots
        self.slapo_space = slapo_space
        self.allowed = (lambda d, r: d >= r - 2) if slapo_space else None
        self.rules = load_rules()
        self.cache: dict[object, Candidate] = {}
        self.storage_cache: dict[object, list[tuple[TensorSpec, ParamStorage]]] = {}
        # Identical parameters (repeated layers) share their strategy, cost, storage and recompute
        # lists, so the edge prices keyed by those lists' identities are computed once for all.
        self.param_lists: dict[object, tuple[list[OpStrategy], list[int], list[ParamStorage], list[bool] | None]] = {}
        self.unsupported: Counter[str] = Counter()
        self.first_readers: dict[str, list[int]] | None = None
        self.config = (mesh, repr(cost_model), training, slapo_space, capacity_factor, local_flops is None)
        self.retimed = RetimedItems(life, mesh, training)
        self.retimed_params = RetimedParams(life, mesh, precision, training, optimizer_slots, keep_gathered)

    def build(self, node: OpNode, built: dict[str, Candidate]) -> Candidate:
        """The candidate of ``node``; ``built`` holds those of the nodes before it (a parameter's
        owner comes after the parameter, so parameters are built last)."""
        if node.kind == NodeKind.OUTPUT:
            return self._output(node)
        if node.kind == NodeKind.PARAM:
            return self._param(node, built)
        operands = tuple(operand_meta(self.graph, node, s) for s in node.inputs)
        grads = tuple(self.graph[s].requires_grad for s in node.inputs)
        life_key = (self.life.value.get(node.name), self.life.gradient.get(node.name)) if node.kind != NodeKind.OP \
            else (self.life.base[node.name] == node.name,)
        key = (node.kind, node.op, node.out, operands, grads, repr(sorted(node.attrs.items())), node.requires_grad,
               node.no_grad_operands, node.work, life_key)
        if node.kind == NodeKind.OP and node.op is None:
            key = node.name  # unknown ops are not shared (their warnings name them)
        if key not in self.cache and node.kind == NodeKind.OP and node.op is not None:
            shared = (self.config, key)
            if shared not in _OPS:
                _OPS[shared] = self._op(node, operands)
            self.cache[key] = _OPS[shared]
        elif key not in self.cache:
            self.cache[key] = self._op(node, operands) if node.kind == NodeKind.OP else self._state(node)
        found = self.cache[key]
        if node.kind == NodeKind.OP and found.instance is None:
            self.unsupported[node.op or node.target] += 1
        return self._for(node, found)

    def _for(self, node: OpNode, found: Candidate) -> Candidate:
        """A shared candidate re-labelled for ``node`` (its memory items carry node-specific times);
        in a recomputable block, with every strategy twice: keep, then recompute."""
        if node.kind != NodeKind.OP:
            items = [MemoryItem(node.name, m.what, m.interval, m.usage) for m in found.items]
            return Candidate(node, found.strategies, found.costs, items, found.instance, found.storage, found.flops)
        if node.name not in self.blocks.block_of:
            return Candidate(node, found.strategies, found.costs, self._op_items(node, found.strategies),
                             found.instance, flops=found.flops, forward_costs=found.forward_costs)
        reruns = self.blocks.reruns(node.name)
        key = (id(found.strategies), reruns)
        if key not in self.doubled:  # shared by identical nodes, so their edge matrices are shared too
            k = len(found.strategies)
            again = [c + f for c, f in zip(found.costs, found.forward_costs)] if reruns else found.costs
            self.doubled[key] = (found.strategies * 2, found.costs + again, found.flops * 2,
                                 [False] * k + [True] * k, [False] * k + [reruns] * k)
        strategies, costs, flops, recompute, rerun = self.doubled[key]
        k = len(found.strategies)
        kept = self.blocks.recompute_start(self.life, node.name) + 1 if node.name in self.blocks.saved else None
        again = self._op_items(node, found.strategies, self.blocks if reruns else None, kept)
        items = recompute_variants(self._op_items(node, found.strategies),
                                   again + self._checkpointed_inputs(node, found.strategies), k, k)
        return Candidate(node, strategies, costs, items, found.instance, flops=flops,
                         forward_costs=found.forward_costs * 2, recompute=recompute, reruns=rerun)

    def _op_items(self, node: OpNode, options: list[OpStrategy], recomputed: Blocks | None = None,
                  kept_until: int | None = None) -> list[MemoryItem]:
        return self.retimed.items(node, options, recomputed, self._gathered_keys(node, options), kept_until)

    def _checkpointed_inputs(self, node: OpNode, options: list[OpStrategy]) -> list[MemoryItem]:
        """What a recomputed block keeps of its inputs from outside (the residual stream), charged
        on their first reader in the block, in its layout, from the end of their forward reads to
        the block's recomputation (their producers' own windows cover the forward). An input that
        an op of the block saves (a fused norm saves its input) is held to that op's backward by
        its producer's window already, so it is not charged twice."""
        if self.first_readers is None:
            self.first_readers = checkpoint_readers(self.graph, self.blocks)
        items = []
        again = self.blocks.recompute_start(self.life, node.name) + 1
        for k in self.first_readers.get(node.name, ()):
            src = node.inputs[k]
            start = self.life.read[src][1]
            if start < again and not any(self.blocks.same(s, node.name) for s in self.life.savers.get(src, ())):
                meta = operand_meta(self.graph, node, src)
                items.append(MemoryItem(node.name, "checkpointed input", (start, again),
                                        tuple(local_bytes(s.in_specs[k], meta, self.mesh) for s in options)))
        return items

    def _gathered_keys(self, node: OpNode, options: list[OpStrategy]) -> list[int] | None:
        """Bytes of the keys and values an attention with split query rows reads gathered, per
        strategy (their gradients are held so in its backward); None for other ops."""
        rule = self.rules.get(node.op or "")
        if rule is None or "causal_rows" not in rule.options or not (self.training and node.requires_grad):
            return None
        metas = [operand_meta(self.graph, node, src) for src in node.inputs[1:3]]
        return [sum(local_bytes(s.in_specs[k], m, self.mesh) for k, m in zip((1, 2), metas))
                if dict(s.assignment).get(rule.options["causal_rows"]) else 0 for s in options]

    def _state(self, node: OpNode) -> Candidate:
        """A buffer (one strategy per layout) or a model input (replicated in inference)."""
        if node.kind == NodeKind.INPUT and not self.training:
            layouts = [TensorSpec.replicated(len(node.tensor.shape)) if node.tensor is not None else TensorSpec(())]
        else:
            layouts = tensor_layouts(node.tensor.shape, self.mesh.shape, self.allowed)
        costs = [self._transfer(node, s) for s in layouts] if node.attrs.get(RECEIVED) else [0] * len(layouts)
        return Candidate(node, [OpStrategy((), (), s, ()) for s in layouts], costs,
                         state_items(node, layouts, self.life, self.mesh))

    def _transfer(self, node: OpNode, layout: TensorSpec) -> int:
        """Receiving a pipeline stage's input in ``layout`` point to point, and sending its gradient
        back in training: ``latency + local bytes / bandwidth`` each way on the pipeline's link."""
        if self.receive_link is None:
            raise ValueError(f"{node.name} is received from another pipeline stage, but no link was given")
        bandwidth, latency = self.receive_link
        one_way = latency + local_bytes(layout, node.tensor, self.mesh) / bandwidth
        return self.cost_model.ticks(one_way * (2 if self.training and node.requires_grad else 1))

    def _param(self, node: OpNode, built: dict[str, Candidate]) -> Candidate:
        """Storage strategies (L, U, keep | re-gather) against the owner's use layouts."""
        meta = node.tensor
        layouts = tensor_layouts(meta.shape, self.mesh.shape, self.allowed)
        owner_name = self.life.first_reader.get(node.name)
        owner = built.get(owner_name) if owner_name is not None else None
        operand = owner.node.inputs.index(node.name) if owner is not None else -1
        saved = owner is not None and owner.node.work is not None and operand in owner.node.work.saved_operands \
            and owner.node.requires_grad
        if owner is None or owner.node.kind != NodeKind.OP or owner.strategies[0].in_specs[operand] is None:
            key: tuple = (meta, None)
            options = [(l, ParamStorage(None)) for l in layouts]
            owner = None
        else:
            key = (meta, id(owner.strategies), operand, saved)
            if key not in self.storage_cache:
                self.storage_cache[key] = self._storage_options(meta, layouts, owner.strategies, operand, saved)
            options = self.storage_cache[key]

        def items_of(chosen: list[tuple[TensorSpec, ParamStorage]], recomputed: Blocks | None) -> list[MemoryItem]:
            return self.retimed_params.items(key, node, [l for l, _ in chosen], [s for _, s in chosen],
                                             owner.node if owner else None, saved, recomputed)

        items = items_of(options, None)
        mirrors = owner is not None and owner.recompute is not None  # mirrors its owner's block choice
        if mirrors:
            again = [(l, s) for l, s in options if not s.regather]  # recomputing re-gathers anyway
            items = recompute_variants(items, items_of(again, self.blocks), len(options), len(again))
        shared_key = (key, mirrors, node.requires_grad)
        if shared_key not in self.param_lists:
            recompute = [False] * len(options) + [True] * len(again) if mirrors else None
            every = options + again if mirrors else options
            self.param_lists[shared_key] = ([OpStrategy((), (), l, ()) for l, _ in every],
                                            [self._optimizer_ticks(node, l) for l, _ in every],
                                            [s for _, s in every], recompute)
        strategies, costs, storage, recompute = self.param_lists[shared_key]
        return Candidate(node, strategies, costs, items, storage=storage, recompute=recompute)

    def _optimizer_ticks(self, node: OpNode, layout: TensorSpec) -> int:
        """The AdamW step over the parameter's local piece in ``layout`` (0 outside training, for
        frozen parameters, and on devices without an optimizer figure)."""
        if not (self.training and node.requires_grad and self.optimizer_slots and self.cost_model.charges_compute):
            return 0
        state = param_precision(self.precision, node.tensor.itemsize).optimizer
        seconds = self.cost_model.device.optimizer_seconds(local_bytes(layout, node.tensor, self.mesh, state))
        return self.cost_model.ticks(seconds)

    def _storage_options(self, meta: TensorMeta, layouts: list[TensorSpec], owner: list[OpStrategy],
                         operand: int, saved: bool) -> list[tuple[TensorSpec, ParamStorage]]:
        """Every (stored layout, use) pair with ``use`` one of the owner's operand layouts; gathered
        again for backward as well only where the owner saves it (else its copy dies in forward)
        and the stage does not keep its parameters gathered over the step."""
        options = []
        for use in sorted({s.in_specs[operand] for s in owner}):
            for stored in layouts:
                if stored == use:
                    options.append((stored, ParamStorage(use)))
                elif gathers_only(stored, use, meta, self.mesh):
                    options.append((stored, ParamStorage(use)))
                    if self.training and saved and not self.keep_gathered:
                        options.append((stored, ParamStorage(use, regather=True)))
        return options

    def _op(self, node: OpNode, operands: tuple[TensorMeta | None, ...]) -> Candidate:
        """Rule strategies with their compute cost (forward, plus backward in training)."""
        metas = out_metas(node)
        out_shape = metas[0].shape if metas else ()
        instance, options = None, []
        rule = self.rules.get(node.op or "")
        if rule is not None and metas:
            try:
                instance = instantiate(rule, operands, out_shape, node.attrs)
                options = strategies(instance, self.mesh.shape, self.allowed)
                if self.slapo_space and instance.contracted:
                    options = [s for s in options if s.degree > 1]
            except RuleError:
                instance, options = None, []
        if not options:
            options = [replicated_strategy(operands, len(out_shape))]
        needs = [self.training and node.requires_grad and m is not None and self.graph.gradient_flows(node, k, m)
                 for k, m in enumerate(operands)]
        dtype = metas[0].dtype if metas else "float32"
        costs, flops, forward = [], [], []
        routed = instance is not None and instance.exchange is not None
        causal = bool(node.attrs.get("is_causal"))
        for s in options:
            work = node.work if routed else self._local_work(node, operands, s)
            flops.append((0, 0) if work is None else (work.flops // s.degree, work.backward_flops // s.degree))
            exchange = self._exchange_ticks(node, operands, s, instance, self.training) if routed else 0
            exchange_forward = self._exchange_ticks(node, operands, s, instance, False) if routed else 0
            if not self.cost_model.charges_compute:
                costs.append(exchange)
                forward.append(exchange_forward)
                continue
            ins = [local_bytes(spec, m, self.mesh) for spec, m in zip(s.in_specs, operands)]
            out = sum(local_bytes(s.out_spec, m, self.mesh) for m in metas[:1]) + sum(
                m.nbytes // max(1, s.degree) for m in metas[1:])
            times = op_times(work, s.degree, ins, needs, out, compute_dtype(node.work, dtype), self.cost_model.device,
                             node.op, causal, compiled_bytes(node.work, ins, needs, out))
            times = with_casts(times, node.work, ins, out, self.cost_model.device)
            load = self.capacity_factor if routed and dict(s.assignment).get(instance.exchange[1]) else 1.0
            if causal and rule is not None and "causal_rows" in rule.options:
                load *= causal_split_load(self.mesh.axes_size(dict(s.assignment).get(rule.options["causal_rows"], ())))
            costs.append(self.cost_model.ticks((times.forward + times.backward) * load) + exchange
                         + self._count_ticks(s, metas))
            forward.append(self.cost_model.ticks(times.forward * load) + exchange_forward)
        return Candidate(node, options, costs, [], instance, flops=flops, forward_costs=forward)

    def _count_ticks(self, strategy: OpStrategy, metas: list[TensorMeta]) -> int:
        """Price of a mean loss's valid-target count all-reduce (forward only: the count has no gradient)."""
        if not strategy.count_axes or not metas:
            return 0
        steps = count_steps(strategy, metas[0].itemsize, self.mesh.shape)
        return self.cost_model.ticks(sum(self.cost_model.step_cost(step, ()) for step in steps))

    def _exchange_ticks(self, node: OpNode, operands: tuple[TensorMeta | None, ...], s: OpStrategy,
                        instance: OpInstance, backward: bool) -> int:
        """The all-to-alls of an expert-parallel strategy (forward, and backward if asked), priced
        as single-axis steps (0 without one)."""
        exchanges = expert_exchanges_of(node, operands, s, self.mesh.shape, self.capacity_factor,
                                        backward and node.requires_grad)
        return sum(self.cost_model.ticks(self.cost_model.step_cost(x.step(), (1, x.in_bytes))) for x in exchanges)

    def _local_work(self, node: OpNode, operands: tuple[TensorMeta | None, ...], s: OpStrategy) -> OpWork | None:
        """The op's work with the flops of one device's pieces (``local_flops``), as ``op_times``
        expects them: multiplied back by the degree it divides by."""
        work = node.work
        if work is None or self.local_flops is None or not (work.flops or work.backward_flops) \
                or any(m is None or spec is None for m, spec in zip(operands, s.in_specs)):
            return work
        shapes = [spec.local_shape(m.shape, self.mesh.shape) for spec, m in zip(s.in_specs, operands)]
        forward, backward = self.local_flops(node, shapes)
        if forward < 0:
            return work
        return replace(work, flops=forward * s.degree, backward_flops=backward * s.degree)

    def _output(self, node: OpNode) -> Candidate:
        """Outputs are gathered (replicated) in inference; in training the first output may stay in
        any layout, since the loss is computed where it lives (data-parallel or vocab-parallel), and
        on a pipeline stage (``receive_link`` given) so may every output, each sent on as it lies
        (an interleaved device sends one tensor per stage it holds)."""
        metas = [self.graph[s].tensor for s in node.inputs]
        free = len(metas) if self.receive_link is not None else 1
        per_operand = [[None] if m is None else tensor_layouts(m.shape, self.mesh.shape, self.allowed)
                       if self.training and k < free else [TensorSpec.replicated(len(m.shape))]
                       for k, m in enumerate(metas)]
        options = [OpStrategy((), specs, TensorSpec(()), specs) for specs in itertools.product(*per_operand)]
        return Candidate(node, options, [0] * len(options))


def expert_exchanges_of(node: OpNode, operands: Sequence[TensorMeta | None], s: OpStrategy, mesh_shape: tuple[int, ...],
                        capacity_factor: float, backward: bool) -> tuple[Exchange, ...]:
    """The exchanges strategy ``s`` of an experts node (operands hidden, top-k index, weights,
    gate_up, ...) runs: none unless it has an ``exchange_axis``."""
    if s.exchange_axis is None:
        return ()
    hidden, index, experts = operands[0], operands[1], operands[3]
    local_hidden = s.in_specs[0].local_shape(hidden.shape, mesh_shape)
    local_experts = s.in_specs[3].local_shape(experts.shape, mesh_shape)[0]
    return expert_exchanges(local_hidden, hidden.itemsize, index.shape[1], experts.shape[0], local_experts,
                            s.exchange_axis, mesh_shape[s.exchange_axis], capacity_factor, backward)
