"""The problem's memory rows as nodes: every decision node's first memory item, and auxiliary nodes
for the rest.

A node's items with one interval add up into its own usage; each further interval becomes an
auxiliary node that repeats the node's strategy (a diagonal tie, ``FORBIDDEN`` elsewhere), so the
solver's per-node memory rows see every item. The reshard copies of an edge
(``problem/reshard_copies.py``) come last: one node per edge, tied to both ends, and a repeating
node for each of its further intervals. Node order: the graph's nodes, their repeating nodes
(``aux_owner[j]`` is the owner of node ``len(names) + j``), then the copies' nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autoshard.problem.candidates import Candidate
from autoshard.problem.reshard_copies import ReshardCopies
from autoshard.solver.model.problem import FORBIDDEN


@dataclass
class MemoryNodes:
    """Usages and intervals of every node (the graph's first), the costs, tie edges and names of the
    auxiliary ones, and the owner each repeating node follows."""

    usages: list[np.ndarray] = field(default_factory=list)
    intervals: list[tuple[int, int]] = field(default_factory=list)
    costs: list[np.ndarray] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)
    matrices: list[np.ndarray] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    aux_owner: list[int] = field(default_factory=list)
    ties: dict[int, np.ndarray] = field(default_factory=dict)
    free: dict[int, np.ndarray] = field(default_factory=dict)  # zero costs by length

    def tie(self, k: int) -> np.ndarray:
        """The k x k diagonal tie, shared (a 3-D mesh gives k in the hundreds)."""
        if k not in self.ties:
            self.ties[k] = np.full((k, k), FORBIDDEN, dtype=np.int64)
            np.fill_diagonal(self.ties[k], 0)
            self.ties[k].flags.writeable = False
        return self.ties[k]

    def zeros(self, k: int) -> np.ndarray:
        """k zero costs, shared and read-only (a 3-D mesh's repeating nodes number in the thousands,
        each with hundreds of strategies)."""
        if k not in self.free:
            self.free[k] = np.zeros(k, dtype=np.int64)
            self.free[k].flags.writeable = False
        return self.free[k]

    def add(self, name: str, usage: np.ndarray, interval: tuple[int, int]) -> int:
        """A new auxiliary node without cost; its index."""
        self.costs.append(self.zeros(len(usage)))
        self.usages.append(usage)
        self.intervals.append(interval)
        self.names.append(name)
        return len(self.usages) - 1


def _intervals(cand: Candidate) -> list[tuple[tuple[int, int], np.ndarray]]:
    """A candidate's items added up per interval, the longest interval first."""
    merged: dict[tuple[int, int], np.ndarray] = {}
    for item in cand.items:
        if item.interval[0] < item.interval[1] and any(item.usage):
            merged[item.interval] = merged.get(item.interval, 0) + np.asarray(item.usage, dtype=np.int64)
    return sorted(merged.items(), key=lambda kv: (kv[0][0] - kv[0][1], kv[0]))


def memory_nodes(names: list[str], candidates: dict[str, Candidate], copies: list[ReshardCopies]) -> MemoryNodes:
    """The memory of ``names`` (problem nodes ``0 .. len(names) - 1``) and of ``copies`` as nodes."""
    out = MemoryNodes()
    rest = []
    for i, name in enumerate(names):
        found = _intervals(candidates[name])
        if not found:
            found = [((0, 0), np.zeros(len(candidates[name].strategies), dtype=np.int64))]
        out.usages.append(found[0][1])
        out.intervals.append(found[0][0])
        rest += [(i, name, interval, usage) for interval, usage in found[1:]]
    for j, (i, name, interval, usage) in enumerate(rest):
        node = out.add(f"{name}#memory{j}", usage, interval)
        out.edges.append((i, node))
        out.matrices.append(out.tie(len(usage)))
        out.aux_owner.append(i)
    index = {n: i for i, n in enumerate(names)}
    for c in copies:
        first = None
        for n, interval in enumerate(c.intervals):
            usage = sum(np.asarray(item.usage, dtype=np.int64) for item in c.items if item.interval == interval)
            node = out.add(c.name if n == 0 else f"{c.name}#{n}", usage, interval)
            if first is None:
                first = node
                out.edges += [(index[c.src], node), (node, index[c.dst])]
                out.matrices += [c.to_src, c.to_dst]
            else:
                out.edges.append((first, node))
                out.matrices.append(out.tie(len(c.keys)))
    return out
