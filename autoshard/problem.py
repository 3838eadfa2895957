"""The torch-free optimisation problem every frontend produces and every solver consumes.

It is exactly the IOPDDL auto-sharding model. Node i picks one strategy s_i from 0..k_i-1.

    minimise   sum_i node_costs[i][s_i] + sum_{(u,v)=edges[e]} edge_costs[e][s_u, s_v]
    subject to for every time t:  sum_{i : start_i <= t < end_i} node_usages[i][s_i] <= usage_limit

Costs and usages are integers (numpy int64 storage; sums are taken with Python ints so they
cannot overflow). Names are for display only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


@dataclass
class ShardingProblem:
    """Nodes with per-strategy cost and memory, edges with cost matrices, liveness and a memory limit."""

    node_costs: list[np.ndarray]
    node_usages: list[np.ndarray]
    intervals: list[tuple[int, int]]
    edges: list[tuple[int, int]]
    edge_costs: list[np.ndarray]
    usage_limit: int | None = None
    name: str = ""
    node_names: list[str] = field(default_factory=list)

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
