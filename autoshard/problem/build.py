"""OpGraph + rules + mesh + cost model -> ShardingProblem (plain data the solver core understands).

Decision nodes are the graph's tensors (``candidates.py``: inputs, parameters, buffers, ops, the
output). Every (producer -> consumer operand) pair is an edge whose cost matrix holds the price
of the forward reshard from the producer's layout to the layout the consumer's strategy needs;
in training it adds the backward reshard of the gradient, from the consumer's gradient layout
to the producer's (so a replicated weight feeding a batch-sharded matmul pays the data-parallel
gradient all-reduce, and a column-parallel input pays Megatron's "f" all-reduce). The edge from
a parameter to its owner allows only the owner strategies that read the parameter's use layout
``U``, and charges the gathers from the stored layout ``L`` (twice when it is re-gathered for
backward) and the gradient's way back to ``L`` (a reduce-scatter under FSDP storage).

Overlapped parameter traffic (``BuildOptions.overlap``: which edges hide is ``cost/overlap.py``'s
rule, which the runtime follows too) is priced in ``edges.py``.

Memory (``cost/memory.py``) comes as items: bytes per strategy of one node over one interval of
the step. The problem (IOPDDL form) gives each node one interval, so a node's first item is its
own usage and every further item becomes an auxiliary node with the same strategies, tied to
its owner by an edge that forbids every pair but equal strategies (zero cost): the reductions
merge it back into its owner (functional merging carries memory), so it costs the solver little.
"""

from __future__ import annotations

import contextlib
import time
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import cached_property
from typing import Iterator, Mapping

import numpy as np

from autoshard.problem.candidates import Candidate, CandidateBuilder, LocalFlops, operand_meta
from autoshard.problem.edges import EdgePrices, reader_counts
from autoshard.problem.memory_nodes import memory_nodes
from autoshard.problem.restrict import apply_boundary, apply_pins, pin_expert_parallel
from autoshard.problem.reshard_copies import (CopiesBuilder, ReshardCopies, StepTimes, handed_savers, negligible,
                                              without_handed)
from autoshard.problem.repeated import repeated_layers
from autoshard.problem.tallies import recompute_tally
from autoshard.cost.communication import CostModel
from autoshard.cost.devices import Device
from autoshard.cost.float8 import RECIPES as FLOAT8_RECIPES, float8_graph
from autoshard.cost.fusion import COMPILE_SCOPES, compiled_graph
from autoshard.cost.lifetimes import Lifetimes, lifetimes, view_spans
from autoshard.cost.memory import PRECISIONS, MemoryItem, microbatched_items, out_metas
from autoshard.cost.recompute import NO_BLOCKS, RECOMPUTE_POLICIES, Blocks, layer_blocks
from autoshard.errors import AutoshardError
from autoshard.frontend.graph import EXPERTS_OP, NodeKind, OpGraph, TensorMeta, fingerprint
from autoshard.solver.model.problem import ShardingProblem
from autoshard.cost.overlap import hidden_edges
from autoshard.sharding.layers import find_repeated_layers
from autoshard.sharding.mesh import Mesh
from autoshard.sharding.strategy import OpStrategy
from autoshard.sharding.spec import TensorSpec

MODES = ("inference", "training")

_DEADLINE: ContextVar[float | None] = ContextVar("build_deadline", default=None)


class BuildTimeout(AutoshardError):
    """The time limit passed while a problem was being built (no plan exists yet)."""


@contextlib.contextmanager
def build_deadline(at: float | None) -> Iterator[None]:
    """Builds inside end with :class:`BuildTimeout` once ``time.monotonic()`` passes ``at`` (None:
    no limit), checked node by node, so a build never runs past the caller's time limit."""
    token = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _on_time(done: int, total: int, what: str) -> None:
    """Raise :class:`BuildTimeout` when the deadline of :func:`build_deadline` has passed."""
    at = _DEADLINE.get()
    if at is not None and time.monotonic() > at:
        raise BuildTimeout(f"the time limit passed while building the problem ({what} of {done:,} of {total:,} "
                           f"nodes done, no plan yet): raise --timeout")


@dataclass(frozen=True)
class BuildOptions:
    """What to optimise for: mode, memory budget (bytes per device), pinned layouts, search space.

    ``slapo_space`` reproduces Slapo autoshard's search space: only the last two dims of a
    tensor are sharded, and every matmul-like op (one with a contracted index) is split.
    ``precision`` sets the bytes of parameters, gradients and optimizer state (cost/memory.py).
    ``compile``: the step runs under torch.compile, the whole ``model`` or each repeated ``layers``
    alone (``cost/fusion.py``); ``float8``: torchao's Float8
    training of the linears with this scaling recipe (``cost/float8.py``); ``async_tp``: tensor
    parallelism's collectives overlap the matmuls beside them (``cost/async_tp.py``).
    ``recompute``: in training under a memory budget, each repeated layer may be recomputed under
    this policy (``full``, ``selective`` or ``none``: cost/recompute.py); without a budget
    recomputing only costs, so it is not offered.
    ``capacity_factor`` scales what expert-sharded ops are charged over balanced routing
    (sharding/exchange.py); ``expert_parallel`` pins every mixture-of-experts op to the layouts
    that exchange tokens over that mesh axis. ``overlap``: FSDP2 runs the parameters: the traffic of
    repeated layers hides under the neighbouring layer's compute, and every parameter pays FSDP2's
    copies (``edges.py``). ``memory_budget`` bounds the live
    bytes; ``device_budget`` is the device memory it was derived from (``Device.live_limit``), for
    messages. A pipeline stage (autoshard/pipeline) holds ``in_flight`` microbatches at its
    fullest and, with ``accumulate``, sums gradients over them (``cost/memory.microbatched_items``);
    ``receive_link`` (bytes/s, seconds) carries what it receives from the stage before;
    ``boundary`` fixes the layouts it receives and sends tensors in (by name), as its neighbours hold them;
    ``kept_over`` > 0: it keeps its parameters gathered over that many microbatches, one gather and
    one gradient reduction per step (``edges.py``, ``cost/memory.param_items``).
    """

    mode: str = "inference"
    memory_budget: int | None = None
    pins: Mapping[str, str] = field(default_factory=dict)
    slapo_space: bool = False
    optimizer_slots: int = 2
    precision: str = "as-is"
    recompute: str = "full"
    compile: str | None = None
    float8: str | None = None
    async_tp: bool = False
    capacity_factor: float = 1.0
    expert_parallel: int | None = None
    overlap: bool = False
    device_budget: int | None = None
    in_flight: Fraction = Fraction(1)
    accumulate: bool = False
    receive_link: tuple[float, float] | None = None
    boundary: Mapping[str, TensorSpec] = field(default_factory=dict)
    kept_over: int = 0


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
    """The ShardingProblem of one model plus what is needed to read its solutions back.

    Problem nodes ``0 .. len(names)-1`` are the graph tensors ``names``; then come auxiliary memory
    nodes, ``aux_owner[j]`` the index of the node whose strategy auxiliary node ``len(names) + j``
    repeats, then the nodes of the edges' reshard copies (``reshards``, ``problem/memory_nodes.py``).
    """

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
    life: Lifetimes
    items: list[MemoryItem]
    aux_owner: list[int] = field(default_factory=list)
    blocks: Blocks = NO_BLOCKS
    distinct_candidates: int = 0
    distinct_matrices: int = 0
    reshards: list[ReshardCopies] = field(default_factory=list)

    def strategy(self, name: str, choice: list[int]) -> OpStrategy:
        """The strategy ``choice`` gives node ``name``."""
        return self.candidates[name].strategies[choice[self.names.index(name)]]

    def complete(self, choice: list[int]) -> list[int]:
        """A choice over ``names`` extended to the auxiliary nodes: each memory node repeats its owner,
        each edge's copies' node takes what the edge's ends leave it (``reshard_copies.py``)."""
        head = list(choice[: len(self.names)])
        full = head + [head[owner] for owner in self.aux_owner]
        for c in self.reshards:
            full += [self._reduced(c, head)] * len(c.intervals)
        return full

    def _reduced(self, copies: ReshardCopies, head: list[int]) -> int:
        return copies.choose(head[self.positions[copies.src]], head[self.positions[copies.dst]])

    @cached_property
    def positions(self) -> dict[str, int]:
        """The problem node of each of ``names``."""
        return {n: i for i, n in enumerate(self.names)}

    def with_storage_of_users(self, choice: list[int]) -> list[int]:
        """``choice`` made consistent (for choices not made by the solver: baselines, random plans):
        every block recomputes as its first node says, and every parameter's storage matches its
        owner's strategy (the same stored layout used as the owner reads it if possible, else
        stored as the owner reads it)."""
        fixed = list(choice[: len(self.names)])
        index = {n: i for i, n in enumerate(self.names)}
        first_of: dict[int, bool] = {}
        for name, block in self.blocks.block_of.items():  # one recompute choice per block: its first node's
            cand = self.candidates.get(name)
            if cand is None or cand.recompute is None:
                continue
            half = len(cand.strategies) // 2
            flag = first_of.setdefault(block, cand.recompute[fixed[index[name]]])
            fixed[index[name]] = fixed[index[name]] % half + (half if flag else 0)
        for name, cand in self.candidates.items():
            owner = self.life.first_reader.get(name)
            if cand.storage is None or owner not in index or cand.storage[0].use is None:
                continue
            operand = self.graph[owner].inputs.index(name)
            owned = self.candidates[owner]
            use = owned.strategies[fixed[index[owner]]].in_specs[operand]
            again = owned.recompute[fixed[index[owner]]] if owned.recompute is not None else None
            stored = cand.strategies[fixed[index[name]]].out_spec
            fits = [i for i, s in enumerate(cand.storage) if s.use == use and not s.regather
                    and (cand.recompute is None or cand.recompute[i] == again)]
            same = [i for i in fits if cand.strategies[i].out_spec == stored]
            exact = [i for i in fits if cand.strategies[i].out_spec == use]
            if same or exact or fits:
                fixed[index[name]] = (same or exact or fits)[0]
        return self.complete(fixed)

    def recomputed_blocks(self, choice: list[int]) -> list[list[str]]:
        """The op nodes of every block ``choice`` recomputes, block by block in graph order."""
        chosen: dict[int, list[str]] = {}
        index = {n: i for i, n in enumerate(self.names)}
        for name, block in self.blocks.block_of.items():
            cand = self.candidates.get(name)
            if cand is not None and cand.recompute is not None and cand.recompute[choice[index[name]]]:
                chosen.setdefault(block, []).append(name)
        order = self.life.order
        return [sorted(names, key=order.__getitem__) for _, names in sorted(chosen.items())]

    def memory_at(self, choice: list[int], time: int) -> dict[str, int]:
        """Bytes in use at ``time`` under ``choice``, by what they are (parameter, activation ...)."""
        index = {n: i for i, n in enumerate(self.names)}
        totals: dict[str, int] = {}
        for item in self.items:
            if item.interval[0] <= time < item.interval[1]:
                totals[item.what] = totals.get(item.what, 0) + item.usage[choice[index[item.owner]]]
        for copies in self.reshards:
            key = self._reduced(copies, list(choice))
            for item in copies.items:
                if item.interval[0] <= time < item.interval[1]:
                    totals[item.what] = totals.get(item.what, 0) + item.usage[key]
        return totals


def step_graph(graph: OpGraph, options: BuildOptions, device: Device) -> OpGraph:
    """``graph`` as the step runs it: fused where compiled (``cost/fusion.py``), its linears in
    Float8 where asked (``cost/float8.py``); one line for a recipe or device that cannot."""
    if options.compile is not None:
        if options.compile not in COMPILE_SCOPES:
            raise AutoshardError(f"--compile {options.compile!r} is unknown: use one of {', '.join(COMPILE_SCOPES)}")
        graph = compiled_graph(graph, options.compile)
    if options.float8 is None:
        return graph
    if options.float8 not in FLOAT8_RECIPES:
        raise AutoshardError(f"--float8 {options.float8!r} is unknown: use one of {', '.join(FLOAT8_RECIPES)}")
    if device.peak_flops["fp8"] <= device.peak_flops["bf16"]:
        raise AutoshardError(f"--float8: {device.name} has no faster float8 tensor cores (fp8 peak = bf16 peak): "
                             f"choose a device with them (--device h100, h200 or b200) or drop --float8")
    return float8_graph(graph, options.float8)


def build_problem(graph: OpGraph, mesh: Mesh, cost_model: CostModel, options: BuildOptions = BuildOptions(),
                  local_flops: LocalFlops | None = None) -> ModelProblem:
    """Build the ShardingProblem of ``graph`` on ``mesh`` under ``cost_model`` (``local_flops``:
    torch's flop count of an op's local pieces; without it, the op's flops split evenly)."""
    if options.mode not in MODES:
        raise AutoshardError(f"--mode {options.mode!r} is unknown: use one of {', '.join(MODES)}")
    if options.precision not in PRECISIONS:
        raise AutoshardError(f"--precision {options.precision!r} is unknown: use one of {', '.join(PRECISIONS)}")
    if not options.capacity_factor >= 1.0:
        raise AutoshardError(f"--capacity-factor {options.capacity_factor} is below 1: routing sends at least the "
                             f"balanced share of tokens (every routed token is computed), so use 1.0 or more")
    graph = step_graph(graph, options, cost_model.device)
    training = options.mode == "training"
    outputs = [src for n in graph if n.kind == NodeKind.OUTPUT for src in n.inputs]
    if training and any(n.kind == NodeKind.PARAM for n in graph) and not any(graph[s].requires_grad for s in outputs):
        raise AutoshardError("--mode training, but no output depends on a trainable parameter (frozen ones, "
                             "requires_grad=False, are not trained): plan --mode inference, or unfreeze what should train")
    life = lifetimes(graph, training)
    repeated = find_repeated_layers(graph)
    hidden = hidden_edges(graph, options.overlap)
    if options.recompute not in RECOMPUTE_POLICIES:
        raise AutoshardError(f"--recompute {options.recompute!r} is unknown: use one of {', '.join(RECOMPUTE_POLICIES)}")
    blocks = layer_blocks(graph, repeated, frozenset({EXPERTS_OP}), options.recompute) \
        if training and options.memory_budget is not None else NO_BLOCKS
    least = negligible(graph)
    handed = handed_savers(graph, life, blocks, least) if training else {}
    times = StepTimes(life, without_handed(life, handed), blocks, handed, view_spans(graph, life, training), mesh,
                      training, least)
    life = times.base  # what a handed saver keeps, its edge's copies' node charges
    builder = CandidateBuilder(graph, mesh, cost_model, life, training, options.precision, options.optimizer_slots,
                               options.slapo_space, local_flops, blocks, options.capacity_factor,
                               options.receive_link, options.kept_over > 0)
    candidates: dict[str, Candidate] = {}
    wanted = [n for n in graph if n.kind == NodeKind.OUTPUT or out_metas(n)]
    for done, node in enumerate(sorted(wanted, key=lambda n: n.kind == NodeKind.PARAM)):
        _on_time(done, len(wanted), "strategies")
        candidates[node.name] = builder.build(node, candidates)
    candidates = {n.name: candidates[n.name] for n in wanted}
    if options.in_flight != 1 or options.accumulate:
        for name, cand in candidates.items():
            stored = cand.node.kind in (NodeKind.PARAM, NodeKind.BUFFER)
            cand.items = microbatched_items(cand.items, life, options.in_flight - 1, stored)
    apply_pins(candidates, options.pins, mesh)
    if options.boundary:
        apply_boundary(candidates, options.boundary)
    if options.expert_parallel is not None:
        pin_expert_parallel(candidates, options.expert_parallel, mesh)
    names = list(candidates)
    index = {n: i for i, n in enumerate(names)}
    prices = EdgePrices(mesh, cost_model, options.precision, fsdp2=options.overlap, kept_over=options.kept_over)
    prices.async_tp = options.async_tp
    readers = reader_counts(graph, candidates)
    edges: list[ModelEdge] = []
    copies: list[ReshardCopies] = []
    copier = CopiesBuilder(times)
    pairs: list[tuple[int, int]] = []
    matrices: list[np.ndarray] = []
    for done, node in enumerate(graph):
        if node.name not in candidates:
            continue
        _on_time(done, len(graph), "edges")
        dst = candidates[node.name]
        for operand, src in enumerate(node.inputs):
            meta = operand_meta(graph, node, src)
            if src not in candidates or meta is None or operand >= len(dst.strategies[0].in_specs):
                continue
            if dst.strategies[0].in_specs[operand] is None:
                edges.append(ModelEdge(src, node.name, operand, meta, False, None))
                continue
            backward = training and graph.gradient_flows(node, operand, meta)
            owner = candidates[src].storage is not None and life.first_reader.get(src) == node.name \
                and node.inputs.index(src) == operand and candidates[src].storage[0].use is not None
            matrix = prices.matrix(candidates[src], dst, operand, meta, backward, owner, blocks.same(src, node.name),
                                   owner and (node.name, operand) in hidden, readers[src] == 1)
            edges.append(ModelEdge(src, node.name, operand, meta, backward, len(pairs)))
            pairs.append((index[src], index[node.name]))
            matrices.append(matrix)
            reduced = None if owner else copier.copies(candidates[src], dst, operand, meta)
            if reduced is not None and (options.in_flight != 1 or options.accumulate):
                reduced = replace(reduced, items=tuple(microbatched_items(reduced.items, life, options.in_flight - 1,
                                                                          False)))
            copies += [reduced] if reduced is not None else []
    extra = memory_nodes(names, candidates, copies)
    problem = ShardingProblem(
        node_costs=[np.array(candidates[n].costs, dtype=np.int64) for n in names] + extra.costs,
        node_usages=extra.usages,
        intervals=extra.intervals,
        edges=pairs + extra.edges,
        edge_costs=matrices + extra.matrices,
        usage_limit=options.memory_budget,
        name=getattr(graph, "name", "") or "model",
        node_names=names + extra.names,
        tallies=recompute_tally(names, candidates, blocks, life, extra.aux_owner),
        layers=repeated_layers(repeated, names, candidates),
    )
    items = [item for n in names for item in candidates[n].items]
    return ModelProblem(graph, mesh, cost_model, options, names, candidates, edges, problem,
                        _warnings(builder.unsupported, candidates, mesh), fingerprint(graph), life, items,
                        extra.aux_owner, blocks, len(builder.cache), len(prices.matrices), copies)


def _warnings(unsupported, candidates: dict[str, Candidate], mesh: Mesh) -> list[str]:
    """Ops kept replicated for want of a rule, and meshes that divide nothing."""
    warnings = []
    if unsupported:
        listed = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in unsupported.most_common())
        warnings.append(f"no sharding rule for {listed}: kept replicated (add a rule in specs/ops.toml to shard them)")
    ops = [c for c in candidates.values() if c.node.kind == NodeKind.OP]
    if mesh.size > 1 and ops and all(len(c.strategies) == 1 for c in ops):
        warnings.append(f"mesh {mesh.label} cuts no shardable dim of this model (each is too small for it): the plan is replicated "
                        f"(choose a mesh whose axis sizes divide the batch, sequence or hidden sizes)")
    return warnings
