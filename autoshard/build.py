"""OpGraph + rules + mesh + cost model -> ShardingProblem (plain data the solver core understands).

Decision nodes are the graph's tensors: model inputs (replicated as given in inference; in
training a data loader feeds each device the slice the plan wants, so inputs take any layout),
parameters and buffers (one strategy per storage layout), ops (one strategy per rule assignment, see
``rules.py``) and the output (gathered in inference; in training left where the loss needs it). Every (producer -> consumer operand) pair is an
edge whose cost matrix holds the price of the forward reshard from the producer's output
layout to the layout the consumer's strategy needs; in training mode it adds the price of
the backward reshard of the gradient, from the consumer's gradient layout to the producer's
output layout (so a replicated weight feeding a batch-sharded matmul pays the data-parallel
gradient all-reduce, and a column-parallel input pays Megatron's "f" all-reduce).

Node costs are local compute (x3 in training: forward plus two backward matmuls). Memory is
per-device bytes: activations live from definition to last use (inference) or to their
backward use (training), parameters for the whole step, with gradients and optimizer state
in training.
"""

from __future__ import annotations

import difflib
import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from autoshard.cost.communication import CostModel
from autoshard.errors import AutoshardError
from autoshard.graph import NodeKind, OpGraph, OpNode, TensorMeta
from autoshard.sharding.mesh import Mesh
from autoshard.problem import ShardingProblem
from autoshard.sharding.reshard import reshard_steps
from autoshard.sharding.rules import (OpInstance, OpStrategy, RuleError, count_steps, instantiate, load_rules,
                                      replicated_strategy, strategies, tensor_layouts)
from autoshard.sharding.spec import TensorSpec

ALIASING_KINDS = frozenset({"view", "permute", "expand", "getitem", "select", "slice", "split"})
MODES = ("inference", "training")


@dataclass(frozen=True)
class BuildOptions:
    """What to optimise for: mode, memory budget (bytes per device), pinned layouts, search space.

    ``slapo_space`` reproduces Slapo autoshard's search space: only the last two dims of a
    tensor are sharded, and every matmul-like op (one with a contracted index) is split.
    """

    mode: str = "inference"
    memory_budget: int | None = None
    pins: Mapping[str, str] = field(default_factory=dict)
    slapo_space: bool = False
    optimizer_slots: int = 2


@dataclass
class Candidate:
    """A graph tensor as a decision node: its strategies and their own cost and memory."""

    node: OpNode
    strategies: list[OpStrategy]
    costs: list[int]
    usages: list[int]
    instance: OpInstance | None = None


@dataclass(frozen=True)
class ModelEdge:
    """A producer -> consumer-operand edge; ``index`` is its position in the problem (None: free)."""

    src: str
    dst: str
    operand: int
    meta: TensorMeta
    backward: bool
    index: int | None


@dataclass
class ModelProblem:
    """The ShardingProblem of one model plus what is needed to read its solutions back."""

    graph: OpGraph
    mesh: Mesh
    cost_model: CostModel
    options: BuildOptions
    names: list[str]
    candidates: dict[str, Candidate]
    edges: list[ModelEdge]
    problem: ShardingProblem
    warnings: list[str]
    fingerprint: str
    distinct_candidates: int = 0
    distinct_matrices: int = 0

    def strategy(self, name: str, choice: list[int]) -> OpStrategy:
        """The strategy ``choice`` gives node ``name``."""
        return self.candidates[name].strategies[choice[self.names.index(name)]]


def _operand_meta(graph: OpGraph, node: OpNode, src: str) -> TensorMeta | None:
    producer = graph[src]
    if node.op == "getitem" and isinstance(producer.out, tuple):
        element = producer.out[node.attrs.get("index", 0)]
        return element if isinstance(element, TensorMeta) else None
    return producer.tensor


def _out_metas(node: OpNode) -> list[TensorMeta]:
    if isinstance(node.out, TensorMeta):
        return [node.out]
    if isinstance(node.out, tuple):
        return [m for m in node.out if isinstance(m, TensorMeta)]
    return []


def _local_bytes(spec: TensorSpec | None, meta: TensorMeta | None, mesh: Mesh) -> int:
    if spec is None or meta is None or spec.ndim != len(meta.shape):
        return 0
    return math.prod(spec.local_shape(meta.shape, mesh.shape)) * meta.itemsize


class _Builder:
    """Holds the caches used while building one problem."""

    def __init__(self, graph: OpGraph, mesh: Mesh, cost_model: CostModel, options: BuildOptions) -> None:
        if options.mode not in MODES:
            raise AutoshardError(f"--mode {options.mode!r} is unknown: use one of {', '.join(MODES)}")
        self.graph, self.mesh, self.cost_model, self.options = graph, mesh, cost_model, options
        self.rules = load_rules()
        self.allowed = (lambda d, r: d >= r - 2) if options.slapo_space else None
        self.reshard_cache: dict[tuple, int] = {}
        self.candidate_cache: dict[object, Candidate] = {}
        self.matrix_cache: dict[tuple, np.ndarray] = {}
        self.unsupported: Counter[str] = Counter()
        self.training = options.mode == "training"
        # In training a parameter's value is counted in the layout its first consumer reads it in
        # (the storage node holds its gradient and optimizer state): a weight stored sharded but
        # gathered for use then costs its full size, so plans cannot hide gathered weights.
        self.value_owner: dict[str, str] = {}
        if self.training:
            for node in graph:
                for src in node.inputs:
                    if graph[src].kind == NodeKind.PARAM and node.kind == NodeKind.OP:
                        self.value_owner.setdefault(src, node.name)

    def reshard_ticks(self, src: TensorSpec, dst: TensorSpec, meta: TensorMeta) -> int:
        """Price of turning ``src`` into ``dst`` for a tensor of ``meta``."""
        key = (src, dst, meta.shape, meta.itemsize)
        if key not in self.reshard_cache:
            steps = reshard_steps(src, dst, meta.shape, meta.itemsize, self.mesh.shape)
            self.reshard_cache[key] = self.cost_model.ticks(sum(self.cost_model.step_cost(s, meta.shape) for s in steps))
        return self.reshard_cache[key]

    def candidate(self, node: OpNode) -> Candidate:
        """Strategies, costs and memory of one graph node; identical nodes (repeated layers) share them."""
        operands = tuple(_operand_meta(self.graph, node, s) for s in node.inputs)
        owned = tuple(k for k, src in enumerate(node.inputs) if self.value_owner.get(src) == node.name)
        key = (node.kind, node.op, node.out, operands, repr(sorted(node.attrs.items())), node.requires_grad,
               owned, node.name in self.value_owner)
        if node.kind == NodeKind.OUTPUT or node.op is None and node.kind == NodeKind.OP:
            key = node.name  # outputs and unknown ops are not shared (their warnings name them)
        if key not in self.candidate_cache:
            self.candidate_cache[key] = self._candidate(node)
        found = self.candidate_cache[key]
        if node.kind == NodeKind.OP and found.instance is None:
            self.unsupported[node.op or node.target] += 1
        return Candidate(node, found.strategies, found.costs, found.usages, found.instance)

    def _candidate(self, node: OpNode) -> Candidate:
        metas = _out_metas(node)
        if node.kind == NodeKind.OUTPUT:
            return self.output_candidate(node)
        if node.kind == NodeKind.INPUT and not self.training:
            spec = TensorSpec.replicated(len(metas[0].shape)) if metas else TensorSpec(())
            return Candidate(node, [OpStrategy((), (), spec, ())], [0], [_local_bytes(spec, node.tensor, self.mesh)])
        if node.kind in (NodeKind.PARAM, NodeKind.BUFFER, NodeKind.INPUT):
            layouts = tensor_layouts(node.tensor.shape, self.mesh.shape, self.allowed)
            factor = 1
            if self.training and node.kind == NodeKind.PARAM:
                factor = self.options.optimizer_slots + (1 if node.name in self.value_owner else 2)
            return Candidate(node, [OpStrategy((), (), s, ()) for s in layouts], [0] * len(layouts),
                             [factor * _local_bytes(s, node.tensor, self.mesh) for s in layouts])
        operands = [_operand_meta(self.graph, node, s) for s in node.inputs]
        out_shape = metas[0].shape if metas else ()
        instance, options = None, []
        rule = self.rules.get(node.op or "")
        if rule is not None and metas:
            try:
                instance = instantiate(rule, operands, out_shape, node.attrs)
                options = strategies(instance, self.mesh.shape, self.allowed)
                if self.options.slapo_space and instance.contracted:
                    options = [s for s in options if s.degree > 1]
            except RuleError:
                instance, options = None, []
        if not options:
            options = [replicated_strategy(operands, len(out_shape))]
        flops = instance.flops if instance is not None else sum(m.numel for m in metas)
        aliasing = rule is not None and rule.kind in ALIASING_KINDS
        costs, usages = [], []
        owned = [k for k, src in enumerate(node.inputs) if self.value_owner.get(src) == node.name]
        for s in options:
            traffic = sum(_local_bytes(spec, m, self.mesh) for spec, m in zip(s.in_specs, operands))
            out_bytes = sum(_local_bytes(s.out_spec, m, self.mesh) for m in metas)
            seconds = 0.0 if aliasing else self.cost_model.compute_cost(flops / s.degree, traffic + out_bytes)
            costs.append(self.cost_model.ticks(seconds * (3 if self.training and node.requires_grad else 1))
                         + self.count_ticks(s, metas))
            values = sum(_local_bytes(s.in_specs[k], operands[k], self.mesh) for k in owned if k < len(s.in_specs))
            usages.append((0 if aliasing else out_bytes) + values)
        return Candidate(node, options, costs, usages, instance)

    def count_ticks(self, strategy: OpStrategy, metas: list[TensorMeta]) -> int:
        """Price of a mean loss's valid-target count all-reduce (forward only: the count has no gradient)."""
        if not strategy.count_axes or not metas:
            return 0
        steps = count_steps(strategy, metas[0].itemsize, self.mesh.shape)
        return self.cost_model.ticks(sum(self.cost_model.step_cost(step, ()) for step in steps))

    def output_candidate(self, node: OpNode) -> Candidate:
        """Outputs are gathered (replicated) in inference; in training the first output may stay in
        any layout, since the loss is computed where it lives (data-parallel or vocab-parallel)."""
        metas = [self.graph[s].tensor for s in node.inputs]
        base = tuple(None if m is None else TensorSpec.replicated(len(m.shape)) for m in metas)
        layouts = [base[0]] if not self.training or not base or base[0] is None else \
            tensor_layouts(metas[0].shape, self.mesh.shape, self.allowed)
        options = [OpStrategy((), (spec,) + base[1:], TensorSpec(()), (spec,) + base[1:]) for spec in layouts]
        return Candidate(node, options, [0] * len(options), [0] * len(options))

    def apply_pins(self, candidates: dict[str, Candidate]) -> None:
        """Keep only the strategies whose output layout is the pinned one."""
        by_qualname = {c.node.qualname: c for c in candidates.values() if c.node.qualname}
        for name, text in self.options.pins.items():
            cand = by_qualname.get(name) or candidates.get(name)
            if cand is None:
                known = sorted(set(by_qualname) | set(candidates))
                close = difflib.get_close_matches(name, known, n=3)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                raise AutoshardError(f"--pin {name}={text}: no tensor or node named {name!r}{hint}")
            meta = cand.node.tensor
            if meta is None:
                raise AutoshardError(f"--pin {name}={text}: {name!r} is not a single tensor")
            spec = TensorSpec.parse(text, len(meta.shape), self.mesh.ndim)
            if not spec.fits(meta.shape, self.mesh.shape):
                raise AutoshardError(f"--pin {name}={text}: shape {list(meta.shape)} does not divide by mesh "
                                     f"{self.mesh.label} as {text}; pick a spec whose sharded dims divide")
            keep = [i for i, s in enumerate(cand.strategies) if s.out_spec == spec]
            if not keep:
                raise AutoshardError(f"--pin {name}={text}: no strategy of {cand.node.op or cand.node.kind.value} "
                                     f"{name!r} produces {text}; allowed: "
                                     f"{', '.join(sorted({s.out_spec.format(self.mesh.ndim) for s in cand.strategies}))}")
            cand.strategies = [cand.strategies[i] for i in keep]
            cand.costs = [cand.costs[i] for i in keep]
            cand.usages = [cand.usages[i] for i in keep]

    def edge_matrix(self, src: Candidate, dst: Candidate, operand: int, meta: TensorMeta, backward: bool) -> np.ndarray:
        """Cost of every (producer strategy, consumer strategy) pair on one edge (shared across layers)."""
        key = (id(src.strategies), id(dst.strategies), operand, meta, backward)
        if key not in self.matrix_cache:
            matrix = self._edge_matrix(src, dst, operand, meta, backward)
            matrix.flags.writeable = False  # shared by every identical edge: nobody may edit it in place
            self.matrix_cache[key] = matrix
        return self.matrix_cache[key]

    def _edge_matrix(self, src: Candidate, dst: Candidate, operand: int, meta: TensorMeta, backward: bool) -> np.ndarray:
        outs = sorted({s.out_spec for s in src.strategies})
        ins = sorted({s.in_specs[operand] for s in dst.strategies})
        fwd = np.array([[self.reshard_ticks(a, b, meta) for b in ins] for a in outs], dtype=np.int64)
        matrix = fwd[np.ix_([outs.index(s.out_spec) for s in src.strategies],
                            [ins.index(s.in_specs[operand]) for s in dst.strategies])]
        if backward:
            grads = sorted({s.grad_specs[operand] for s in dst.strategies})
            expected = sorted({s.out_spec.without_partial() for s in src.strategies})
            bwd = np.array([[self.reshard_ticks(g, e, meta) for g in grads] for e in expected], dtype=np.int64)
            matrix = matrix + bwd[np.ix_([expected.index(s.out_spec.without_partial()) for s in src.strategies],
                                         [grads.index(s.grad_specs[operand]) for s in dst.strategies])]
        return matrix


def _intervals(graph: OpGraph, names: list[str], training: bool) -> list[tuple[int, int]]:
    """Half-open liveness of every decision node on a forward (then backward) timeline."""
    order = {name: t for t, name in enumerate(graph.nodes)}
    horizon = len(order)
    last_use = dict(order)
    for node in graph:
        for src in node.inputs:
            last_use[src] = max(last_use[src], order[node.name])
    result = []
    for name in names:
        node, t = graph[name], order[name]
        if node.kind in (NodeKind.PARAM, NodeKind.BUFFER):
            result.append((0, 2 * horizon + 1 if training else horizon + 1))
        elif training:
            result.append((t, 2 * horizon - t + 1))
        else:
            result.append((t, last_use[name] + 1))
    return result


def graph_signature(graph: OpGraph) -> list[str]:
    """One ``name:op:shape`` line per node: what a plan is valid for (hashed by :func:`fingerprint`)."""
    return [f"{n.name}:{n.op}:{getattr(n.tensor, 'shape', None)}" for n in graph]


def fingerprint(graph: OpGraph) -> str:
    """A short hash of the graph's node names, ops and shapes: plans are only valid for one model."""
    return hashlib.sha256(";".join(graph_signature(graph)).encode()).hexdigest()[:16]


def build_problem(graph: OpGraph, mesh: Mesh, cost_model: CostModel, options: BuildOptions = BuildOptions()) -> ModelProblem:
    """Build the ShardingProblem of ``graph`` on ``mesh`` under ``cost_model``."""
    builder = _Builder(graph, mesh, cost_model, options)
    candidates: dict[str, Candidate] = {}
    for node in graph:
        if node.kind == NodeKind.OUTPUT or _out_metas(node):
            candidates[node.name] = builder.candidate(node)
    builder.apply_pins(candidates)
    names = list(candidates)
    index = {n: i for i, n in enumerate(names)}
    edges: list[ModelEdge] = []
    pairs: list[tuple[int, int]] = []
    matrices: list[np.ndarray] = []
    for node in graph:
        if node.name not in candidates:
            continue
        dst = candidates[node.name]
        for operand, src in enumerate(node.inputs):
            meta = _operand_meta(graph, node, src)
            if src not in candidates or meta is None or operand >= len(dst.strategies[0].in_specs):
                continue
            if dst.strategies[0].in_specs[operand] is None:
                edges.append(ModelEdge(src, node.name, operand, meta, False, None))
                continue
            backward = (builder.training and graph[src].requires_grad and meta.is_float
                        and operand not in node.no_grad_operands)
            matrix = builder.edge_matrix(candidates[src], dst, operand, meta, backward)
            edges.append(ModelEdge(src, node.name, operand, meta, backward, len(pairs)))
            pairs.append((index[src], index[node.name]))
            matrices.append(matrix)
    problem = ShardingProblem(
        node_costs=[np.array(candidates[n].costs, dtype=np.int64) for n in names],
        node_usages=[np.array(candidates[n].usages, dtype=np.int64) for n in names],
        intervals=_intervals(graph, names, builder.training),
        edges=pairs,
        edge_costs=matrices,
        usage_limit=options.memory_budget,
        name=getattr(graph, "name", "") or "model",
        node_names=names,
    )
    warnings = []
    if builder.unsupported:
        listed = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in builder.unsupported.most_common())
        warnings.append(f"no sharding rule for {listed}: kept replicated (add a rule in specs/ops.toml to shard them)")
    ops = [c for c in candidates.values() if c.node.kind == NodeKind.OP]
    if mesh.size > 1 and ops and all(len(c.strategies) == 1 for c in ops):
        warnings.append(f"mesh {mesh.label} divides no shardable dim of this model: the plan is replicated "
                        f"(choose a mesh whose axis sizes divide the batch, sequence or hidden sizes)")
    return ModelProblem(graph, mesh, cost_model, options, names, candidates, edges, problem, warnings,
                        fingerprint(graph), len(builder.candidate_cache), len(builder.matrix_cache))
