"""Memory items computed once per shared candidate and re-timed for its twins: ops and parameters.

``cost/memory.op_items`` returns items ``(node, what_k, window_k, usage_k)`` where ``usage_k``
(bytes per strategy) reads only the strategies, the node's tensors and work, the mesh and whether
the node holds its own output, and ``window_k`` only the node's lifetimes. Nodes sharing one
candidate (the same op at the same position of identical layers: ``CandidateBuilder``'s cache
key covers all of the former) therefore share every ``usage_k``: a twin's items are the windows
``op_items`` gives it without strategies (so no bytes are computed) paired with the first twin's
usages, where both list the same kinds in the same order; otherwise they are computed in full.
The key holds what the usages read beside the strategy list (tensors, work, gradient flag, whether
the node is a view), so two candidates that happen to share one strategy list are kept apart.

Parameters likewise (``RetimedParams``): ``cost/memory.param_items``'s usages read only the
stored layouts and storage options, the parameter's tensor and gradient flag, whether it has an
owner who saves it, whether that owner's block is recomputed, the build's precision, optimizer
slots and mesh, and whether the parameter has a gradient window; its windows read only the
lifetimes of the parameter and its owner. The builder's storage options are one list per
(tensor, owner strategy list, operand, saved) (``CandidateBuilder._param``'s key), so that key with
the flags names the usages.
"""

from __future__ import annotations

from typing import Hashable, Sequence

from autoshard.cost.lifetimes import Lifetimes
from autoshard.cost.memory import MemoryItem, ParamStorage, op_items, param_items
from autoshard.cost.recompute import Blocks
from autoshard.frontend.graph import OpNode
from autoshard.sharding.mesh import Mesh
from autoshard.sharding.spec import TensorSpec
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


class RetimedParams:
    """``param_items`` of one build's parameters, the bytes computed once per storage-options key."""

    def __init__(self, life: Lifetimes, mesh: Mesh, precision: str, training: bool, optimizer_slots: int,
                 kept: bool) -> None:
        self.life, self.mesh, self.precision, self.training = life, mesh, precision, training
        self.optimizer_slots, self.kept = optimizer_slots, kept
        self.first: dict[tuple, list[MemoryItem]] = {}

    def items(self, options: Hashable, node: OpNode, layouts: Sequence[TensorSpec], storage: Sequence[ParamStorage],
              owner: OpNode | None, saved: bool, recomputed: Blocks | None) -> list[MemoryItem]:
        """``param_items`` of ``node`` under ``layouts``/``storage``, which ``options`` (the
        builder's storage-options key, with whether ``recomputed`` picks its kept-gathered subset)
        determines."""
        key = (options, node.tensor, node.requires_grad, node.name in self.life.gradient, owner is None, saved,
               recomputed is None)
        template = self.first.get(key)
        if template is not None:
            timed = self._items(node, [], [], owner, saved, recomputed)
            if [m.what for m in timed] == [m.what for m in template]:
                return [MemoryItem(node.name, m.what, m.interval, t.usage) for m, t in zip(timed, template)]
        found = self._items(node, layouts, storage, owner, saved, recomputed)
        self.first.setdefault(key, found)
        return found

    def _items(self, node: OpNode, layouts: Sequence[TensorSpec], storage: Sequence[ParamStorage],
               owner: OpNode | None, saved: bool, recomputed: Blocks | None) -> list[MemoryItem]:
        return param_items(node, layouts, storage, owner, saved, self.life, self.mesh, self.precision, self.training,
                           self.optimizer_slots, recomputed, self.kept)
