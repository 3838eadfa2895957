"""Layer moves: a change a new best plan makes to one of a model's repeated layers, tried on the
others, and the changes that paid before, tried again.

A model's repeated layers (``ShardingProblem.layers``: node tuples in corresponding order, each
position offering the same strategies in every layer) take the same plan wherever their
surroundings agree, yet neighbourhood search changes one layer at a time (its neighbourhoods are
smaller than a layer), so each of ``L`` identical layers waits for its own discovery of the same
move. A *move* is the positions ``P`` where a new best plan changed layer ``a`` and the strategies
``S`` it gave them; ``move_{P,S->B}(x)`` puts ``S`` on positions ``P`` of every layer in ``B``,
leaving their other positions as they are (layers under a memory limit differ: a whole-layer copy
would undo what the other layers chose). Each move is tried on all layers without it at once, else
on each in turn, keeping what lowers the cost and fits:

    x <- move_{P,S->b}(x)   where   cost(move_{P,S->b}(x)) < cost(x)  and  move_{P,S->b}(x) fits.

The last :data:`REMEMBERED` moves are tried again after each new best plan: a move that did not
fit beside the plan of its day may fit once another has freed memory.

Each move is followed by the nodes outside the layers tied to the moved ones (an edge's reshard
copies, a memory node mirroring its owner: their strategy follows from their neighbours'), where
the move made an edge of theirs forbidden: each *unit* of them (the nodes joined by repeat edges,
square matrices forbidden off the diagonal, which must take one strategy together) takes its
cheapest strategy given its other neighbours (:data:`FOLLOW_PASSES` passes). Every candidate is
evaluated exactly; a move only guides the search, any ``layers`` is valid.
"""

from __future__ import annotations

import numpy as np

from autoshard.solver.core.evaluation import FlatProblem
from autoshard.solver.model.problem import FORBIDDEN, ShardingProblem

FOLLOW_PASSES = 2
"""Passes over the tied nodes after a move: a tie's strategy follows from its neighbours, so a
second pass only matters along a chain of ties."""
ONE_BY_ONE = 64
"""Most moves onto single layers tried after one new best plan (each is one exact evaluation)."""
REMEMBERED = 32
"""Moves kept to be tried again, the newest first."""


class LayerCopies:
    """The layer moves of one problem (module docstring): its layers as arrays, the units each
    layer node ties (with their edges to other nodes and their summed costs) for the follow step,
    the exact evaluation ``flat`` and the moves remembered."""

    def __init__(self, problem: ShardingProblem, flat: FlatProblem) -> None:
        self.problem, self.flat = problem, flat
        self.layers = [np.asarray(layer, dtype=np.int64) for layer in problem.layers]
        self.moves: dict[tuple[bytes, bytes], tuple[np.ndarray, np.ndarray]] = {}  # newest first
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
        ``before``) by the moves it made and those remembered (module docstring); None where no
        move pays."""
        x, best, budget = np.array(after, dtype=np.int64), cost, [ONE_BY_ONE]
        for layer in self.layers:
            changed = np.flatnonzero(before[layer] != after[layer])
            if len(changed):
                self._remember(changed, after[layer[changed]])
        for positions, strategies in list(self.moves.values()):
            x, best = self._spread(x, best, positions, strategies, budget)
        return (x, best) if best < cost else None

    def _remember(self, positions: np.ndarray, strategies: np.ndarray) -> None:
        """Keep a move, as the newest, among the REMEMBERED last."""
        key = (positions.tobytes(), strategies.tobytes())
        self.moves.pop(key, None)
        self.moves = {key: (positions, strategies), **self.moves}
        while len(self.moves) > REMEMBERED:
            self.moves.popitem()

    def _spread(self, x: np.ndarray, best: int, positions: np.ndarray, strategies: np.ndarray,
                budget: list[int]) -> tuple[np.ndarray, int]:
        """``x`` after the move onto every layer without it at once where that pays and fits, else
        onto each in turn while ``budget`` (single moves left) lasts; with its cost."""
        without = [b for b, layer in enumerate(self.layers) if (x[layer[positions]] != strategies).any()]
        found = self._moved(x, positions, strategies, without)
        if found is not None and found[1] < best:
            return found
        for b in without if len(without) > 1 else ():
            if budget[0] <= 0:
                break
            budget[0] -= 1
            found = self._moved(x, positions, strategies, [b])
            if found is not None and found[1] < best:
                x, best = found
        return x, best

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

    def _moved(self, x: np.ndarray, positions: np.ndarray, strategies: np.ndarray,
               targets: list[int]) -> tuple[np.ndarray, int] | None:
        """``x`` with ``strategies`` on ``positions`` of the ``targets`` layers, the units tied to
        them followed, and its exact cost; None where it does not fit."""
        if not targets:
            return None
        y = x.copy()
        moved = np.concatenate([self.layers[b][positions] for b in targets])
        y[moved] = np.tile(strategies, len(targets))
        tied = sorted({unit for node in moved.tolist() for unit in self.followers.get(node, ())})
        for _ in range(FOLLOW_PASSES):
            for unit in tied:
                if any(_entry(m, y[node], y[o], first) >= FORBIDDEN for o, m, first, node in self.units[unit]):
                    y[list(unit)] = self._cheapest(unit, y)
        cost = self.flat.feasible_cost(y)
        return None if cost is None else (y, cost)

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
