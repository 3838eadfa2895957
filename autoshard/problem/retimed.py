"""An op's memory items computed once per shared candidate and re-timed for its twins.

``cost/memory.op_items`` returns items ``(node, what_k, window_k, usage_k)`` where ``usage_k``
(bytes per strategy) reads only the strategies, the node's tensors and work, the mesh and whether
the node holds its own output, and ``window_k`` only the node's lifetimes. Nodes sharing one
candidate (the same op at the same position of identical layers: ``CandidateBuilder``'s cache
key covers all of the former) therefore share every ``usage_k``: a twin's items are the windows
``op_items`` gives it without strategies (so no bytes are computed) paired with the first twin's
usages, where both list the same kinds in the same order; otherwise they are computed in full.
The key holds what the usages read beside the strategy list (tensors, work, gradient flag, whether
the node is a view), so two candidates that happen to share one strategy list are kept apart.
"""

from __future__ import annotations

from typing import Sequence

from autoshard.cost.lifetimes import Lifetimes
from autoshard.cost.memory import MemoryItem, op_items
from autoshard.cost.recompute import Blocks
from autoshard.frontend.graph import OpNode
from autoshard.sharding.mesh import Mesh
from autoshard.sharding.strategy import OpStrategy


class RetimedItems:
    """``op_items`` of one build's nodes, the bytes computed once per shared strategy list."""

    def __init__(self, life: Lifetimes, mesh: Mesh, training: bool) -> None:
        self.life, self.mesh, self.training = life, mesh, training
        self.first: dict[tuple, list[MemoryItem]] = {}

    def items(self, node: OpNode, options: list[OpStrategy], recomputed: Blocks | None,
              gathered: Sequence[int] | None, kept_until: int | None) -> list[MemoryItem]:
        """``op_items`` of ``node`` under ``options`` (a candidate's shared strategy list)."""
        key = (id(options), node.out, node.work, node.requires_grad, self.life.base[node.name] == node.name,
               node.name in self.life.gradient, recomputed is None, kept_until is None,
               None if gathered is None else tuple(gathered))
        template = self.first.get(key)
        if template is not None:
            timed = op_items(node, [], [], self.life, self.mesh, self.training, recomputed, gathered, kept_until)
            if [m.what for m in timed] == [m.what for m in template]:
                return [MemoryItem(node.name, m.what, m.interval, t.usage) for m, t in zip(timed, template)]
        found = op_items(node, [s.out_spec for s in options], [s.degree for s in options], self.life, self.mesh,
                         self.training, recomputed, gathered, kept_until)
        self.first.setdefault(key, found)
        return found
