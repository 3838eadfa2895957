"""Find identical repeated layers (``h.0``, ``h.1`` ... of a ModuleList) in a traced graph.

Two layers are identical when their nodes, taken in graph order, have the same kind, op,
attributes, shapes and dtypes, and their operands point to the same positions: inside the
layer, in the previous layer (the chained residual stream), or to the same node outside all
layers (a shared attention mask). The solver can then treat the layers as one transfer
function applied L times instead of L independent sub-problems.

The layers' indices may skip (a device of an interleaved pipeline runs ``layers.0-7`` and
``layers.16-23``): a layer after a gap is matched as the first one is, its entry operands from outside.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from autoshard.frontend.graph import OpGraph, OpNode

_INDEXED = re.compile(r"^(?P<prefix>.*?)\.(?P<index>\d+)(?:\.|$)")


@dataclass(frozen=True)
class RepeatedLayers:
    """Aligned node names of identical layers (``layers[i][k]`` is node k of layer i)."""

    container: str
    layers: tuple[tuple[str, ...], ...]

    @property
    def count(self) -> int:
        """Number of layers."""
        return len(self.layers)

    @property
    def nodes(self) -> frozenset[str]:
        """Every node of every layer."""
        return frozenset(name for layer in self.layers for name in layer)


def _layer_of(module: str) -> tuple[str, int] | None:
    match = _INDEXED.match(module)
    return (match["prefix"], int(match["index"])) if match else None


def _signature(graph: OpGraph, nodes: list[OpNode], previous: dict[str, int], position: dict[str, int]) -> tuple:
    """What must be equal between two layers, with operands as positions, not names."""
    parts = []
    for node in nodes:
        refs = []
        for src in node.inputs:
            if src in position:
                refs.append(("here", position[src]))
            elif src in previous:
                refs.append(("prev", previous[src]))
            else:
                refs.append(("outside", src))
        attrs = tuple(sorted((k, repr(v)) for k, v in node.attrs.items()))
        parts.append((node.kind, node.op, repr(node.out), attrs, tuple(refs)))
    return tuple(parts)


def _matches_first(first: tuple, later: tuple) -> bool:
    """Layer 0 equals a later layer except that its entry operands come from outside, not ``prev``."""
    if len(first) != len(later):
        return False
    for x, y in zip(first, later):
        if x[:4] != y[:4] or len(x[4]) != len(y[4]):
            return False
        if any(r != s and not (r[0] == "outside" and s[0] == "prev") for r, s in zip(x[4], y[4])):
            return False
    return True


def find_repeated_layers(graph: OpGraph) -> RepeatedLayers | None:
    """The longest run of consecutive identical layers of one container, or None."""
    groups: dict[str, dict[int, list[OpNode]]] = {}
    for node in graph:
        found = _layer_of(node.module)
        if found:
            groups.setdefault(found[0], {}).setdefault(found[1], []).append(node)
    best: RepeatedLayers | None = None
    for container, by_index in groups.items():
        indices = sorted(by_index)
        chained = [j > 0 and indices[j] == indices[j - 1] + 1 for j in range(len(indices))]
        positions = [{n.name: k for k, n in enumerate(by_index[i])} for i in indices]
        sigs = [_signature(graph, by_index[i], positions[j - 1] if chained[j] else {}, positions[j])
                for j, i in enumerate(indices)]
        ref = next((j for j, c in enumerate(chained) if c), None)
        if ref is None:
            continue
        count = 0
        while count < len(indices) and (sigs[count] == sigs[ref] if chained[count]
                                        else _matches_first(sigs[count], sigs[ref])):
            count += 1
        if count >= 2 and (best is None or count > best.count):
            best = RepeatedLayers(container, tuple(tuple(n.name for n in by_index[i]) for i in indices[:count]))
    return best
