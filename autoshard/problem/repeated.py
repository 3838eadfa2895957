"""A model's repeated layers as the solver sees them (``ShardingProblem.layers``): the problem nodes
of each identical layer in corresponding order, where every layer offers the same strategies."""

from __future__ import annotations

from autoshard.problem.candidates import Candidate
from autoshard.sharding.layers import RepeatedLayers


def repeated_layers(found: RepeatedLayers | None, names: list[str],
                    candidates: dict[str, Candidate]) -> list[tuple[int, ...]]:
    """Problem node indices (``names``' positions) of each of the ``found`` layers, at the
    positions where every layer has a problem node with the same strategy list; none without them."""
    if found is None:
        return []
    index = {name: i for i, name in enumerate(names)}
    first = found.layers[0]
    keep = [k for k in range(len(first))
            if all(layer[k] in index for layer in found.layers)
            and all(_same(candidates[layer[k]], candidates[first[k]]) for layer in found.layers[1:])]
    if not keep:
        return []
    return [tuple(index[layer[k]] for k in keep) for layer in found.layers]


def _same(a: Candidate, b: Candidate) -> bool:
    """The two nodes offer the same strategies in the same order (repeated layers share the list)."""
    return a.strategies is b.strategies or a.strategies == b.strategies
