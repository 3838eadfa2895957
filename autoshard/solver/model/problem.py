"""The torch-free optimisation problem every frontend produces and every solver consumes.

It is exactly the IOPDDL auto-sharding model. Node i picks one strategy s_i from 0..k_i-1.

    minimise   sum_i node_costs[i][s_i] + sum_{(u,v)=edges[e]} edge_costs[e][s_u, s_v]
    subject to for every time t:  sum_{i : start_i <= t < end_i} node_usages[i][s_i] <= usage_limit

Costs and usages are integers (numpy int64 storage; sums are taken with Python ints so they
cannot overflow). A cost of at least ``FORBIDDEN`` (10**18, the IOPDDL convention) marks a
strategy or a pair of strategies that must not be chosen. Names are for display only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from autoshard.errors import AutoshardError

FORBIDDEN = 10**18
"""Costs at or above this value mark forbidden strategies (IOPDDL's convention)."""


@dataclass(frozen=True)
class Evaluation:
    """Exact cost and memory of one full assignment (Python ints: no overflow)."""

    cost: int
    peak: int
    uses_forbidden: bool
    within_limit: bool

    @property
    def feasible(self) -> bool:
        """True when no forbidden cost is used and memory stays within the limit."""
        return self.within_limit and not self.uses_forbidden


@dataclass(frozen=True)
class Tally:
    """A count that is a whole number in every plan: how many of ``groups`` pick a marked strategy.

    Each group lists members ``(node, marked strategies, twins)`` that one choice decides together
    (one layer's recompute flag, carried by each of the layer's nodes); any one member stands for
    the group. The LP relaxation can split the count (20.6 of 32 identical layers recompute), and
    identical layers make that split unreachable by branching on single nodes: the solver branches
    on the count instead (solver/branching.py). ``twins[s]`` is the node's strategy that is ``s`` with
    the choice flipped (-1: none; empty: not given), so the search can flip a whole group at once.
    A tally only guides the search: any tally is valid.
    """

    name: str
    groups: tuple[tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...], ...]


@dataclass
class ShardingProblem:
    """Nodes with per-strategy cost and memory, edges with cost matrices, liveness and a memory
    limit; ``tallies`` are whole-number counts worth branching on (``Tally``), none by default;
    ``layers`` are repeated layers (node tuples in corresponding order, each position offering the
    same strategies in every layer), between which the search moves a layer's changes
    (``search/layer_copies.py``), none by default. Both only guide the search."""

    node_costs: list[np.ndarray]
    node_usages: list[np.ndarray]
    intervals: list[tuple[int, int]]
    edges: list[tuple[int, int]]
    edge_costs: list[np.ndarray]
    usage_limit: int | None = None
    name: str = ""
    node_names: list[str] = field(default_factory=list)
    tallies: list[Tally] = field(default_factory=list)
    layers: list[tuple[int, ...]] = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        """Number of decision nodes."""
        return len(self.node_costs)

    def num_strategies(self, node: int) -> int:
        """How many strategies node ``node`` has."""
        return len(self.node_costs[node])

    def node_name(self, node: int) -> str:
        """Display name of a node (its index when unnamed)."""
        return self.node_names[node] if node < len(self.node_names) else str(node)

    def cost(self, choice: Sequence[int]) -> int:
        """Exact total cost of a full assignment."""
        total = sum(int(c[s]) for c, s in zip(self.node_costs, choice))
        for (u, v), m in zip(self.edges, self.edge_costs):
            total += int(m[choice[u], choice[v]])
        return total

    def usage_profile(self, choice: Sequence[int]) -> dict[int, int]:
        """Memory in use at every time point where it changes (half-open intervals)."""
        deltas: dict[int, int] = {}
        for (start, end), usage, s in zip(self.intervals, self.node_usages, choice):
            if start < end and int(usage[s]):
                deltas[start] = deltas.get(start, 0) + int(usage[s])
                deltas[end] = deltas.get(end, 0) - int(usage[s])
        profile, level = {}, 0
        for t in sorted(deltas):
            level += deltas[t]
            profile[t] = level
        return profile

    def peak_usage(self, choice: Sequence[int]) -> int:
        """Largest total memory in use at any time."""
        return max(self.usage_profile(choice).values(), default=0)

    def is_feasible(self, choice: Sequence[int]) -> bool:
        """True when the assignment respects the memory limit (always, without a limit)."""
        return self.usage_limit is None or self.peak_usage(choice) <= self.usage_limit

    def check_choice(self, choice: Sequence[int]) -> list[int]:
        """Validate a full assignment (one in-range strategy per node); return it as a list of ints."""
        if len(choice) != self.num_nodes:
            raise AutoshardError(
                f"solution has {len(choice)} entries but the problem has {self.num_nodes} nodes: "
                "give exactly one strategy index per node"
            )
        out = []
        for node, s in enumerate(choice):
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
                raise AutoshardError(f"solution entry {node} is {s!r}, not an integer: give strategy indices")
            k = self.num_strategies(node)
            if not 0 <= s < k:
                raise AutoshardError(
                    f"solution picks strategy {s} for node {node} which has {k} strategies: "
                    f"use an index in 0..{k - 1}"
                )
            out.append(int(s))
        return out

    def evaluate(self, choice: Sequence[int]) -> Evaluation:
        """Exact cost, peak memory, and whether the assignment is forbidden or over the limit."""
        choice = self.check_choice(choice)
        forbidden = any(int(c[s]) >= FORBIDDEN for c, s in zip(self.node_costs, choice)) or any(
            int(m[choice[u], choice[v]]) >= FORBIDDEN for (u, v), m in zip(self.edges, self.edge_costs)
        )
        peak = self.peak_usage(choice)
        return Evaluation(
            cost=self.cost(choice),
            peak=peak,
            uses_forbidden=forbidden,
            within_limit=self.usage_limit is None or peak <= self.usage_limit,
        )

    def validate(self) -> None:
        """Check shapes, lengths and signs; raise a one-line AutoshardError naming the first problem."""
        n = self.num_nodes
        for name, seq in (("node_usages", self.node_usages), ("intervals", self.intervals)):
            if len(seq) != n:
                raise AutoshardError(f"{name} has {len(seq)} entries for {n} nodes: give one per node")
        if len(self.edge_costs) != len(self.edges):
            raise AutoshardError(
                f"{len(self.edges)} edges but {len(self.edge_costs)} edge cost matrices: give one per edge"
            )
        for i, (c, u) in enumerate(zip(self.node_costs, self.node_usages)):
            if c.ndim != 1 or len(c) == 0:
                raise AutoshardError(f"node {i} has no strategies: give every node at least one strategy")
            if u.shape != c.shape:
                raise AutoshardError(
                    f"node {i} has {len(c)} costs but {len(u)} usages: give one usage per strategy"
                )
        if n and min(int(np.concatenate(self.node_costs).min()), int(np.concatenate(self.node_usages).min())) < 0:
            raise AutoshardError("a node has a negative cost or usage: costs and usages must be >= 0")
        for i, (start, end) in enumerate(self.intervals):
            if start < 0 or end < 0:
                raise AutoshardError(f"node {i} has interval [{start}, {end}) with a negative time: use times >= 0")
        for e, ((u, v), m) in enumerate(zip(self.edges, self.edge_costs)):
            if not (0 <= u < n and 0 <= v < n):
                raise AutoshardError(f"edge {e} joins nodes {u} and {v} but nodes are numbered 0..{n - 1}")
            if u == v:
                raise AutoshardError(f"edge {e} joins node {u} to itself: drop self-edges")
            if m.shape != (len(self.node_costs[u]), len(self.node_costs[v])):
                raise AutoshardError(
                    f"edge {e} ({u}, {v}) has a cost matrix of shape {m.shape}, expected "
                    f"{(len(self.node_costs[u]), len(self.node_costs[v]))} (strategies of {u} x strategies of {v})"
                )
        distinct = {id(m): m for m in self.edge_costs}.values()  # repeated layers share their matrices
        if distinct and min(int(m.min()) for m in distinct) < 0:
            raise AutoshardError("an edge has a negative cost: costs must be >= 0")
        for tally in self.tallies:
            for group in tally.groups:
                for node, marked, twins in group:
                    k = self.num_strategies(node) if 0 <= node < n else 0
                    if not 0 <= node < n or not _within(marked, 0, k) or (
                            twins and (len(twins) != k or not _within(twins, -1, k))):
                        raise AutoshardError(f"tally {tally.name!r} marks node {node} strategies {list(marked)} "
                                             f"(twins {list(twins)}), which the problem does not have: mark existing "
                                             f"nodes and strategies, with one twin per strategy or none")
        self._validate_layers()
        if self.usage_limit is not None and self.usage_limit < 0:
            raise AutoshardError(f"usage limit {self.usage_limit} is negative: give a limit >= 0 or none")

    def _validate_layers(self) -> None:
        """``layers``: tuples of one length, of distinct existing nodes, each position with one
        strategy count in every layer."""
        seen: set[int] = set()
        for layer in self.layers:
            if len(layer) != len(self.layers[0]) or not _within(layer, 0, self.num_nodes) or seen & set(layer) \
                    or len(set(layer)) != len(layer) or any(self.num_strategies(a) != self.num_strategies(b)
                                                            for a, b in zip(layer, self.layers[0])):
                raise AutoshardError(f"layer {list(layer)[:4]}... does not match the first layer node for node: give "
                                     f"layers of one length, distinct nodes, and at each position nodes with the "
                                     f"same strategies")
            seen |= set(layer)


def _within(values: Sequence[int], low: int, high: int) -> bool:
    """Every value in ``[low, high)`` (True for none)."""
    return not len(values) or (min(values) >= low and max(values) < high)
