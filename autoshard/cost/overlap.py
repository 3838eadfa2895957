"""The overlap rule: which collectives hide under compute. The cost model prices by it and the runtime runs by it.

With overlap on (``BuildOptions.overlap``: the device presets', as FSDP2 and DDP run; off with
``--no-overlap``), the traffic of a parameter to its *owner* (its first reader, at its first
operand) hides when the owner is an op of a repeated layer (``sharding/layers.py``):

- the forward gather is issued one layer ahead, during the previous layer's compute (layer 0's
  at the first layer's start), and waited where the owner reads it; the backward's gathers
  (recomputation, re-gather) likewise one layer ahead in the backward's order;
- its gradient's reduction is issued as soon as the gradient is ready and waited when the
  backward of the layer before it starts reducing (the last at the end of the backward), so it
  travels under that layer's backward.

The cost model (``problem/edges.py``) charges such an edge only what the owner's twin in the
neighbouring layer cannot hide, ``max(0, F - fwd) + max(0, B - bwd)``; every other collective
(activations, tensor parallelism, parameters outside the repeated layers) is charged in full
and runs blocking. The plan records the rule's verdict per edge (``EdgeReshard.hidden``), and
the executor issues exactly those collectives ahead (``runtime/overlap.py``).
"""

from __future__ import annotations

from autoshard.frontend.graph import NodeKind, OpGraph
from autoshard.sharding.layers import find_repeated_layers


def hidden_edges(graph: OpGraph, overlap: bool) -> frozenset[tuple[str, int]]:
    """``(owner, operand)`` of every parameter edge whose traffic hides under compute (module doc)."""
    repeated = find_repeated_layers(graph) if overlap else None
    if repeated is None:
        return frozenset()
    layers = repeated.nodes
    owned: set[str] = set()
    hidden: set[tuple[str, int]] = set()
    for node in graph:  # graph order: a parameter's first reader is its owner
        for operand, src in enumerate(node.inputs):
            if src in owned or graph[src].kind != NodeKind.PARAM:
                continue
            owned.add(src)
            if node.kind == NodeKind.OP and node.name in layers:
                hidden.add((node.name, operand))
    return frozenset(hidden)
