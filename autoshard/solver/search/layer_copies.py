"""Whole-layer copies: a change a new best plan makes to one of a model's repeated layers, tried on
the others.

A model's repeated layers (``ShardingProblem.layers``: node tuples in corresponding order, each
position offering the same strategies in every layer) take the same plan wherever their
surroundings agree, yet neighbourhood search changes one layer at a time (its neighbourhoods are
smaller than a layer), so each of ``L`` identical layers waits for its own discovery of the same
move. When a new best plan ``x`` differs from the last one in the nodes of layer ``a``, this tries
``copy_{a->B}(x)``: layer ``a``'s strategies on every layer of ``B`` (the nodes of ``a``'s
positions), first onto all other layers at once, else onto each in turn, keeping each copy that
lowers the cost and fits:

    x <- copy_{a->b}(x)   where   cost(copy_{a->b}(x)) < cost(x)  and  copy_{a->b}(x) fits,

each copy followed by the nodes outside the layers tied to the copied ones (an edge's reshard
copies, a memory node mirroring its owner: their strategy follows from their neighbours'), where
the copy made an edge of theirs forbidden: each *unit* of them (the nodes joined by repeat edges,
square matrices forbidden off the diagonal, which must take one strategy together) takes its
cheapest strategy given its other neighbours (:data:`FOLLOW_PASSES` passes). Every candidate is evaluated exactly; a copy only guides the search, any ``layers`` is
valid.
"""

from __future__ import annotations

import numpy as np

from autoshard.solver.core.evaluation import FlatProblem
from autoshard.solver.model.problem import FORBIDDEN, ShardingProblem

FOLLOW_PASSES = 2
"""Passes over the tied nodes after a copy: a tie's strategy follows from its neighbours, so a
second pass only matters along a chain of ties."""
ONE_BY_ONE = 64
"""Most copies onto single layers tried after one new best plan (each is one exact evaluation)."""


class LayerCopies:
    """The copies of one problem (module docstring): its layers as arrays, the units each layer
    node ties (with their edges to other nodes and their summed costs) for the follow step, and
    the exact evaluation ``flat``."""

    def __init__(self, problem: ShardingProblem, flat: FlatProblem) -> None:
        self.problem, self.flat = problem, flat
        self.layers = [np.asarray(layer, dtype=np.int64) for layer in problem.layers]
        in_layers = set(np.concatenate(self.layers).tolist()) if self.layers else set()
        adjacent: dict[int, list[tuple[int, np.ndarray, bool]]] = {}  # node -> (other end, matrix, node first)
        for (u, v), matrix in zip(problem.edges, problem.edge_costs):
            adjacent.setdefault(u, []).append((v, matrix, True))
            adjacent.setdefault(v, []).append((u, matrix, False))
        repeats, unit_of = _Repeats(), {}  # unit_of: a node outside the layers -> its unit
        self.followers: dict[int, list[tuple[int, ...]]] = {}  # a layer's node -> the units it ties
        self.units: dict[tuple[int, ...], list[tuple[int, np.ndarray, bool, int]]] = {}  # unit -> its outer edges
        self.unit_costs: dict[tuple[int, ...], np.ndarray] = {}  # unit -> its nodes' costs per shared strategy
        for node in sorted(in_layers):
            for other, _, _ in adjacent.get(node, ()):
                if other in in_layers:
                    continue
                if other not in unit_of:
                    unit = self._unit(other, adjacent, in_layers, repeats)
                    unit_of.update(dict.fromkeys(unit, unit))
                self.followers.setdefault(node, []).append(unit_of[other])

    def improve(self, before: np.ndarray, after: np.ndarray, cost: int) -> tuple[np.ndarray, int] | None:
        """A cheaper plan that fits, from ``after`` (cost ``cost``, a new best plan after
        ``before``) by copies of the layers it changed; None where no copy pays."""
        x, best, tried = np.array(after, dtype=np.int64), cost, 0
        changed = [a for a, layer in enumerate(self.layers) if (before[layer] != after[layer]).any()]
        for a in changed:
            others = [b for b in range(len(self.layers)) if b != a and (x[self.layers[b]] != x[self.layers[a]]).any()]
            found = self._copied(x, a, others)
            if found is not None and found[1] < best:
                x, best = found
                continue
            for b in others:
                if tried >= ONE_BY_ONE:
                    break
                tried += 1
                found = self._copied(x, a, [b])
                if found is not None and found[1] < best:
                    x, best = found
        return (x, best) if best < cost else None

    def _unit(self, start: int, adjacent: dict[int, list[tuple[int, np.ndarray, bool]]], in_layers: set[int],
              repeats: _Repeats) -> tuple[int, ...]:
        """The nodes outside the layers that must take one strategy with ``start`` (joined by
        repeat edges: a memory node and its copies), with their edges to the other nodes."""
        found, todo = {start}, [start]
        while todo:
            node = todo.pop()
            for other, matrix, _ in adjacent.get(node, ()):
                if other not in found and other not in in_layers and repeats(matrix):
                    found.add(other)
                    todo.append(other)
        unit = tuple(sorted(found))
        self.units[unit] = [(other, matrix, first, node) for node in unit
                            for other, matrix, first in adjacent.get(node, ()) if other not in found]
        self.unit_costs[unit] = np.sum([np.asarray(self.problem.node_costs[n], dtype=np.float64) for n in unit], axis=0)
        return unit

    def _copied(self, x: np.ndarray, a: int, targets: list[int]) -> tuple[np.ndarray, int] | None:
        """``x`` with layer ``a``'s strategies on the ``targets`` layers, the units tied to them
        followed, and its exact cost; None where it does not fit."""
        if not targets:
            return None
        y = x.copy()
        for b in targets:
            y[self.layers[b]] = x[self.layers[a]]
        moved = np.concatenate([self.layers[b] for b in targets])
        tied = sorted({unit for node in moved.tolist() for unit in self.followers.get(node, ())})
        for _ in range(FOLLOW_PASSES):
            for unit in tied:
                if any(_entry(m, y[node], y[o], first) >= FORBIDDEN for o, m, first, node in self.units[unit]):
                    y[list(unit)] = self._cheapest(unit, y)
        ev = self.flat.evaluate(y)
        return (y, ev.cost) if ev.feasible else None

    def _cheapest(self, unit: tuple[int, ...], y: np.ndarray) -> int:
        """The unit's cheapest strategy (all its nodes take it) given its other neighbours in ``y``."""
        total = self.unit_costs[unit].copy()
        for other, matrix, first, _ in self.units[unit]:
            total += matrix[:, y[other]] if first else matrix[y[other], :]
        return int(np.argmin(total))


class _Repeats:
    """Whether an edge's matrix ties its ends to one strategy: square, every entry off its diagonal
    forbidden (a memory node repeating its owner); answered once per matrix object."""

    def __init__(self) -> None:
        self.known: dict[int, bool] = {}

    def __call__(self, matrix: np.ndarray) -> bool:
        key = id(matrix)
        if key not in self.known:
            k = matrix.shape[0]
            off = ~np.eye(k, dtype=bool) if matrix.shape == (k, k) and k > 1 else None
            self.known[key] = off is not None and bool((matrix[off] >= FORBIDDEN).all())
        return self.known[key]


def _entry(matrix: np.ndarray, mine: int, theirs: int, first: bool) -> int:
    """The edge's cost with this end at ``mine`` and the other at ``theirs``."""
    return int(matrix[mine, theirs] if first else matrix[theirs, mine])
