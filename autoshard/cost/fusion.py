"""What ``torch.compile`` (inductor) does to a step, as the cost model prices it (``--compile``).

Inductor leaves matmuls, convolutions and fused attention to their library kernels (extern
kernels) and fuses the memory-bound ops between them (pointwise ops, norms, softmax, losses,
gathers, copies) into kernels that make one pass over memory. The rule priced here:

- **regions**: what ``torch.compile`` wraps (the whole step, or each repeated layer alone as
  torchtitan compiles them); ops outside every region run eagerly, and no group spans two regions.
- **groups**: two memory-bound ops of one region fuse when one reads the other (through views) and no path
  between them runs through an extern kernel (else the fused kernel would wait on itself). With
  ``depth(n) = max_p depth(p) + [p an unfused op]`` over ``n``'s producers ``p`` (views pass their
  producer's depth on), a producer and its reader fuse iff their depths are equal (a path through
  an extern kernel raises the depth, so equal depths admit none); groups are the connected
  components of these pairs. Views belong to no group: they are resolved to the tensor they view.
- **bytes**: a fused op reads an operand from memory only when it comes from outside its group,
  once per group (at its first reader in the group), and writes its output only when something
  outside its group reads it (through views; the graph's outputs count). Its backward moves, by
  the same rule, the gradient of a written output, the operands read from outside that it saves
  (after the memory rule below: what its recomputation reads), and those operands' gradients. So
  a group costs

      forward  = (sum of its external inputs + its escaping outputs) / streaming bandwidth
      backward = (escaping outputs' gradients + saved external inputs + their gradients) / streaming bandwidth

  and extern kernels cost as before (``cost/compute.py``).
- **memory** (AOTAutograd's partition of the joint graph recomputes a fused group's values in its
  backward rather than saving them): a value read only inside its group is never materialised
  (no activation, no gradient, no temporaries); a fused op's temporaries are gone; what a group
  member saves that its group computes is replaced by the group's external inputs it is computed
  from (the readers of those inputs save them instead).

``tests/cost/test_fusion.py`` checks the rule against the kernels inductor generates on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from autoshard.cost.compute import ATTENTION_OPS, MATMUL_OPS
from autoshard.frontend.graph import EXPERTS_OP, NodeKind, OpGraph, OpNode, OpWork
from autoshard.sharding.layers import find_repeated_layers

COMPILE_SCOPES = ("model", "layers")
"""What ``torch.compile`` wraps: the whole step, or each repeated layer on its own (:func:`compiled_graph`)."""
EXTERN_OPS = MATMUL_OPS | ATTENTION_OPS | {EXPERTS_OP}
"""Ops inductor runs as library kernels (cuBLAS, FlashAttention, grouped GEMMs), never fused."""


@dataclass(frozen=True)
class Fusion:
    """The fusion of one graph: each fused op's group, and per fused op whether each operand is
    read from memory (it comes from outside the op's group, and no earlier member read it) and
    whether its output is written (something outside the group reads it)."""

    group: dict[str, int]
    reads: dict[str, tuple[bool, ...]]
    writes: frozenset[str]


def compiled_bytes(work: OpWork | None, in_bytes: Sequence[int], needs_grad: Sequence[bool],
                   out_bytes: int) -> tuple[int, int] | None:
    """(forward, backward) bytes a fused op (``work.fused``, set by :func:`compiled_graph`) moves,
    given its operands' and output's local bytes; None for an op that is not fused:

        forward  = sum_{k read} in_k + [writes] out
        backward = [writes] out (1 + [saves output]) + sum_{k read, saved} in_k + sum_{k read, needs grad} in_k
    """
    if work is None or work.fused is None:
        return None
    reads, writes = work.fused
    forward = sum(b for b, r in zip(in_bytes, reads) if r) + (out_bytes if writes else 0)
    backward = (out_bytes * (1 + work.saves_output) if writes else 0) + sum(
        b for k, (b, r) in enumerate(zip(in_bytes, reads)) if r and k in work.saved_operands) + sum(
        b for b, r, g in zip(in_bytes, reads, needs_grad) if r and g)
    return forward, backward


def materialised(work: OpWork | None) -> bool:
    """False for a fused op whose value only its own group reads (it never reaches memory)."""
    return work is None or work.fused is None or work.fused[1]


def is_view(node: OpNode) -> bool:
    """An op whose output shares an operand's storage."""
    return node.work is not None and node.work.alias_of is not None


def fusible(node: OpNode) -> bool:
    """A memory-bound op inductor generates code for (not a view, not an extern kernel, not unknown)."""
    return (node.kind == NodeKind.OP and node.op is not None and node.op not in EXTERN_OPS and not is_view(node)
            and node.work is not None and node.work.measured)


def view_sources(graph: OpGraph) -> dict[str, str]:
    """Each node's tensor: a view's is the tensor it views (through chains of views), any other node's its own."""
    source: dict[str, str] = {}
    for node in graph:
        source[node.name] = source[node.inputs[node.work.alias_of]] if is_view(node) else node.name
    return source


def fuse(graph: OpGraph, regions: Mapping[str, int] | None = None) -> Fusion:
    """The groups of ``graph``'s memory-bound ops and what each reads and writes (module doc);
    ``regions``: the compiled regions by node (None: the whole graph is one)."""
    source = view_sources(graph)
    region = (lambda name: 0) if regions is None else regions.get
    depth: dict[str, int] = {}
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for node in graph:
        producers = [graph[s] for s in node.inputs]
        depth[node.name] = max((depth[p.name] + (p.kind == NodeKind.OP and not fusible(p) and not is_view(p))
                                for p in producers), default=0)
        if fusible(node) and region(node.name) is not None:
            parent[node.name] = node.name
            for p in producers:
                q = source[p.name]
                if q in parent and depth[q] == depth[node.name] and region(q) == region(node.name):
                    parent[root(q)] = root(node.name)
    group = {name: root(name) for name in parent}
    escapes: set[str] = set()  # tensors (by source) read outside their group
    for node in graph:
        for src in node.inputs:
            q = source[src]
            if q in group and not is_view(node) and group.get(node.name) != group[q]:
                escapes.add(q)
    reads: dict[str, tuple[bool, ...]] = {}
    seen: set[tuple[str, str]] = set()
    for node in graph:
        if node.name not in group:
            continue
        flags = []
        for src in node.inputs:
            key = (group[node.name], source[src])
            flags.append(group.get(source[src]) != group[node.name] and key not in seen)
            seen.add(key)
        reads[node.name] = tuple(flags)
    numbers = {g: i for i, g in enumerate(dict.fromkeys(group.values()))}
    return Fusion({name: numbers[g] for name, g in group.items()}, reads, frozenset(escapes))


def compiled_graph(graph: OpGraph, scope: str = "model") -> OpGraph:
    """``graph`` as compiled code runs it: each fused op's ``work.fused`` set, and what it saves and
    allocates as the memory rule of the module doc says. ``scope``: ``model``, the whole step is
    compiled (``autoshard.train --compile``); ``layers``, each repeated layer on its own and the rest
    eager (torchtitan's ``apply_compile``: ``torch.compile`` per TransformerBlock)."""
    if scope not in COMPILE_SCOPES:
        raise ValueError(f"unknown compile scope {scope!r}; use one of {', '.join(COMPILE_SCOPES)}")
    regions = None
    if scope == "layers":
        repeated = find_repeated_layers(graph)
        regions = {} if repeated is None else {n: i for i, layer in enumerate(repeated.layers) for n in layer}
    fusion = fuse(graph, regions)
    source = view_sources(graph)
    saved: dict[str, set[int]] = {n.name: set(n.work.saved_operands) for n in graph if n.work is not None}
    saves_output = {n.name: n.work.saves_output for n in graph if n.work is not None}

    def save_inputs_of(name: str) -> None:
        """Save, at their readers, the external inputs group member ``name`` is computed from."""
        stack, seen = [name], set()
        while stack:
            member = stack.pop()
            if member in seen:
                continue
            seen.add(member)
            for k, src in enumerate(graph[member].inputs):
                q = source[src]
                if fusion.group.get(q) == fusion.group[name]:
                    stack.append(q)
                else:
                    saved[member].add(k)

    for name in fusion.reads:
        node = graph[name]
        for k in sorted(saved[name]):
            q = source[node.inputs[k]]
            if fusion.group.get(q) == fusion.group[name] and q not in fusion.writes:
                saved[name].discard(k)
                save_inputs_of(q)
        if saves_output[name] and name not in fusion.writes:
            saves_output[name] = False
            save_inputs_of(name)
    nodes = {}
    for node in graph:
        if node.name in fusion.reads:
            work = replace(node.work, saved_operands=tuple(sorted(saved[node.name])),
                           saves_output=saves_output[node.name], temporary_bytes=0, backward_temporary_bytes=0,
                           fused=(fusion.reads[node.name], node.name in fusion.writes))
            node = replace(node, work=work)
        nodes[node.name] = node
    return replace(graph, nodes=nodes)
