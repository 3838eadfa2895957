"""Activation recomputation (checkpointing) of whole blocks: which tensors it frees, and when.

A block is a run of op nodes (a repeated layer) that may be *recomputed*: its forward runs as
usual, but the tensors autograd would save inside it are dropped at once and recomputed, by a
second forward of the block, when the backward reaches it (``torch.utils.checkpoint``). So for
a tensor ``x`` produced in a recomputed block ``β`` (on the timeline of ``cost/lifetimes.py``):

- it lives from its producer to its last forward reader, or to the backward of the last saver
  outside ``β`` (the checkpoint keeps what leaves the block: its outputs);
- if savers inside ``β`` need it, it lives again from the recomputation, at the backward of the
  block's last node ``B(last(β))``, to the backward of the earliest-in-forward of them;
- what an op saves besides operands and output lives from ``B(last(β))`` to its own backward;
- what enters the block from another op outside it (the residual stream) is kept by the
  checkpoint from the end of its forward reads to ``B(last(β))`` (``checkpoint_readers``), once
  when several blocks read it (a mask): to the recomputation of the first of them, the last to come;
- the block's forward runs twice: its nodes' forward compute, and the forward reshards of the
  edges into them, are charged again (``candidates.py``, ``build.py``).

The decision is one per block; every node of the block carries it (its strategies are doubled,
keep then recompute) and the edges inside a block forbid disagreeing pairs, so the problem
stays in the IOPDDL form. Pure functions of the graph and the lifetimes.

Policies (``RECOMPUTE_POLICIES``): ``full`` recomputes every op of the block; ``selective`` is
torchtitan's op-level policy (selective activation checkpointing): a recomputed block keeps the
outputs of fused attention and of every other matrix multiply by a weight (the 1st, 3rd, ... in
forward order; ``Blocks.saved``), which are neither dropped nor run again (kept at least until
the block's recomputation, which reads them); every other op is recomputed as above. ``none`` offers no recomputation.

A compiled block (its memory-bound ops fused, ``cost/fusion.py``) is partitioned by AOTAutograd
over the joint graph, which keeps and recomputes only what the backward reads: a value the policy
keeps stays only if an op of the block saves it (a row-parallel output read only by the residual
add is dropped), and an op the backward does not need, directly or to recompute another, is
neither kept nor run again (``Blocks.idle``).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoshard.cost.compute import ATTENTION_OPS
from autoshard.cost.fusion import view_sources
from autoshard.cost.lifetimes import Lifetimes
from autoshard.frontend.graph import NodeKind, OpGraph
from autoshard.sharding.layers import RepeatedLayers

Interval = tuple[int, int]
RECOMPUTE_POLICIES = ("full", "selective", "none")
WEIGHT_MATMULS = frozenset({"linear", "mm"})
"""The ops that run as ``aten.mm`` by a weight, which the selective policy counts."""


@dataclass(frozen=True)
class Blocks:
    """The recomputable blocks: the block of every op node in one, each block's last node, the ops
    a recomputed block keeps (``saved``), and those a compiled one neither keeps nor runs again (``idle``)."""

    block_of: dict[str, int]
    last: tuple[str, ...]
    saved: frozenset[str] = frozenset()
    idle: frozenset[str] = frozenset()

    def reruns(self, name: str) -> bool:
        """True when recomputing the block of ``name`` runs its forward again (it is neither kept nor idle)."""
        return name in self.block_of and name not in self.saved and name not in self.idle

    def same(self, a: str, b: str) -> bool:
        """True when nodes ``a`` and ``b`` are in one block (their recompute choices must agree)."""
        return a in self.block_of and self.block_of.get(a) == self.block_of.get(b)

    def recompute_start(self, life: Lifetimes, name: str) -> int:
        """The slot where the block of ``name`` is recomputed: its last node's backward."""
        return life.backward(self.last[self.block_of[name]])


NO_BLOCKS = Blocks({}, ())


def layer_blocks(graph: OpGraph, layers: RepeatedLayers | None, kept_ops: frozenset[str] = frozenset(),
                 policy: str = "full") -> Blocks:
    """One block per repeated layer (its op nodes that require grad); a layer holding an op of
    ``kept_ops`` (ops whose re-run the executor does not replay, e.g. expert exchanges) is never
    recomputed. ``policy``: which ops a recomputed block keeps (module doc)."""
    if layers is None or policy == "none":
        return NO_BLOCKS
    block_of: dict[str, int] = {}
    last: list[str] = []
    saved: set[str] = set()
    idle: set[str] = set()
    order = {name: t for t, name in enumerate(graph.nodes)}
    for names in layers.layers:
        ops = sorted((n for n in names if graph[n].kind == NodeKind.OP and graph[n].requires_grad),
                     key=order.__getitem__)
        if not ops or any(graph[n].op in kept_ops for n in ops):
            continue
        for n in ops:
            block_of[n] = len(last)
        last.append(ops[-1])
        kept = set()
        if policy == "selective":
            matmuls = [n for n in ops if graph[n].op in WEIGHT_MATMULS]
            kept = set(matmuls[::2]) | {n for n in ops if graph[n].op in ATTENTION_OPS}
        if any(graph[n].work is not None and graph[n].work.fused is not None for n in ops):
            needed = backward_reads(graph, ops, kept)
            kept &= needed
            idle.update(n for n in ops if n not in needed)
        saved.update(kept)
    return Blocks(block_of, tuple(last), frozenset(saved), frozenset(idle))


def backward_reads(graph: OpGraph, ops: list[str], kept: set[str]) -> set[str]:
    """The ops of a compiled block whose values its backward needs: those an op of the block saves
    (through views), and, for each of them not ``kept``, the block's ops it is recomputed from."""
    members = set(ops)
    source = view_sources(graph)
    needed: set[str] = set()
    stack = [source[graph[n].inputs[k]] for n in ops if graph[n].work is not None
             for k in graph[n].work.saved_operands]
    stack += [n for n in ops if graph[n].work is not None and graph[n].work.saves_output]
    while stack:
        name = stack.pop()
        if name not in members or name in needed:
            continue
        needed.add(name)
        if name not in kept:
            stack += [source[src] for src in graph[name].inputs]
    return needed


def checkpoint_readers(graph: OpGraph, blocks: Blocks) -> dict[str, list[int]]:
    """Per op node, the operands it is the first in its block to read that another op outside the
    block produced: what the block's checkpoint keeps until its recomputation.

    A tensor that several blocks read (a causal mask, rotary tables) is kept once, not once per
    block: it is charged on its first reader in the first block that reads it, whose
    recomputation comes last in the backward, so that one window covers every other block's."""
    readers: dict[str, list[int]] = {}
    seen: set[str] = set()
    for node in graph:
        block = blocks.block_of.get(node.name)
        if block is None:
            continue
        for k, src in enumerate(node.inputs):
            producer = graph[src]
            if producer.kind == NodeKind.OP and blocks.block_of.get(src) != block and src not in seen:
                seen.add(src)
                readers.setdefault(node.name, []).append(k)
    return readers


def value_windows(name: str, life: Lifetimes, blocks: Blocks) -> list[Interval]:
    """Where the value of op node ``name`` lives when its block is recomputed."""
    start, read_end = life.read[name]
    outside = [life.backward(s) + 1 for s in life.savers.get(name, ()) if not blocks.same(s, name)]
    inside = [life.backward(s) + 1 for s in life.savers.get(name, ()) if blocks.same(s, name)]
    forward_end = max([read_end, *outside])
    windows = [(start, forward_end)]
    again = blocks.recompute_start(life, name)
    if inside and max(inside) > max(forward_end, again):
        windows.append((max(forward_end, again), max(inside)))
    return windows


def saved_window(name: str, life: Lifetimes, blocks: Blocks) -> Interval:
    """What op ``name`` saves for backward, besides operands and output, once recomputed."""
    return blocks.recompute_start(life, name), life.backward(name) + 1


def recomputed_forward(name: str, life: Lifetimes, blocks: Blocks) -> Interval:
    """The slot in which op ``name`` runs its forward again (its temporaries live then too)."""
    again = blocks.recompute_start(life, name)
    return again, again + 1
