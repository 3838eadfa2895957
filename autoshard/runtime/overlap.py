"""Run the overlap rule of ``cost/overlap.py``: the plan's hidden edges (``EdgeReshard.hidden``)
have their collectives in flight while compute runs; every other collective runs blocking.

- Forward: the lowered program (``runtime/graph``) issues, just before the first op of
  repeated layer ``i``, the forward steps of the hidden edges of layers ``i`` and ``i + 1`` not
  issued yet (:func:`forward_issues`: layer 0 and 1 at the first layer's start, then one layer
  ahead), with :func:`issue_ahead`; the owner's operand waits for its own at first use
  (``reshard_ops(..., ready=...)``). So layer ``i + 1``'s parameter gathers travel during layer
  ``i``'s compute, as FSDP2's prefetch.
- Backward gathers: when the backward first gathers a hidden edge of layer ``i`` again (its
  recomputation, or a re-gather of a parameter saved as its piece), it issues every such gather
  of layers ``i`` and ``i - 1`` not issued yet (:meth:`Overlap.again`); each is waited where it
  is used. So layer ``i - 1``'s gathers travel during layer ``i``'s backward.
- Backward reductions: a hidden edge's gradient reaches :meth:`Overlap.reducer`'s callback
  instead of autograd; its reduction is issued at once and waited when the next layer's first
  reduction is issued, or at the end of the backward (an autograd engine callback, as FSDP2's
  post-backward), where the reduced piece is added to the parameter's gradient. So a layer's
  reductions travel during the next layer's backward, one layer's unsharded gradients at a time.

The backward's two run in eager mode; under ``torch.compile`` the program's backward runs them
in place (the compiled graph waits each collective where inductor schedules its first use).
Collectives issued ahead are logged with ``ahead=True``; ``runtime/checks.py`` lists the same.
Every rank issues at the same points of the same program, so the collectives on each group keep
one order, and every collective issued in a step is waited before the step ends.
"""

from __future__ import annotations

from typing import Callable

import torch

from autoshard.frontend.graph import NodeKind, OpGraph
from autoshard.problem.plan import EdgeReshard, Plan
from autoshard.runtime.collectives import BACKWARD, RECOMPUTE, CommLog, Op, Pending, resolve, start_ops
from autoshard.runtime.groups import MeshGroups
from autoshard.sharding.layers import find_repeated_layers


def issue_ahead(piece: torch.Tensor, ops: tuple[Op, ...], log: CommLog | None, phase: str) -> torch.Tensor:
    """A hidden edge's steps issued ahead on a parameter's piece or a gradient (no autograd): what
    ``collectives.arrive`` takes at first use. Every collective issued ahead goes through here."""
    with torch.no_grad():
        return start_ops(piece.detach(), ops, log, phase, ahead=True)


def _layers(graph: OpGraph) -> dict[str, int]:
    """The repeated layer of every node in one."""
    repeated = find_repeated_layers(graph)
    return {name: i for i, layer in enumerate(repeated.layers) for name in layer} if repeated else {}


def _hidden_by_layer(plan: Plan, layer_of: dict[str, int]) -> dict[int, list[EdgeReshard]]:
    """Hidden edges with forward steps, by their owner's layer, in plan order."""
    by_layer: dict[int, list[EdgeReshard]] = {}
    for edge in plan.edges:
        if edge.hidden and edge.steps and edge.dst in layer_of:
            by_layer.setdefault(layer_of[edge.dst], []).append(edge)
    return by_layer


def forward_issues(graph: OpGraph, plan: Plan) -> dict[str, list[EdgeReshard]]:
    """The hidden edges whose forward steps are issued just before each op (module doc): at the
    first op of layer ``i``, those of layers ``i`` and ``i + 1`` not issued yet (a layer's
    parameters may come first in the graph, all of them: the ops set the pace)."""
    layer_of = _layers(graph)
    by_layer = _hidden_by_layer(plan, layer_of)
    issued: set[int] = set()
    points: dict[str, list[EdgeReshard]] = {}
    for node in graph:
        layer = layer_of.get(node.name) if node.kind == NodeKind.OP else None
        if layer is None or layer in issued:
            continue
        for i in (layer, layer + 1):
            if i not in issued:
                issued.add(i)
                points.setdefault(node.name, []).extend(by_layer.get(i, ()))
    return {name: edges for name, edges in points.items() if edges}


class Overlap:
    """One parallel module's hidden edges in the backward: gathers issued a layer ahead,
    reductions in flight (eager mode)."""

    def __init__(self, graph: OpGraph, plan: Plan, groups: MeshGroups, logs: dict[str, CommLog],
                 label: Callable[[EdgeReshard], str], replayed: set[str],
                 piece: Callable[[str], torch.Tensor], accumulate: Callable[[str, torch.Tensor], None]) -> None:
        """``logs`` by edge label (``label``) receive the issued collectives; ``replayed``: the
        labels of the edges a recomputation runs again (``checks.replayed_edges``); ``piece(src)``:
        parameter ``src``'s local piece; ``accumulate(src, grad)`` adds a reduced gradient piece to its gradient."""
        self.groups, self._logs, self._label = groups, logs, label
        self._piece, self._accumulate = piece, accumulate
        self._layer_of = _layers(graph)
        self._ops = {label(e): resolve(e.steps, groups) for e in plan.edges if e.hidden}
        self._grad_ops = {label(e): resolve(e.grad_steps, groups) for e in plan.edges if e.hidden}
        self._again_by_layer: dict[int, list[tuple[EdgeReshard, str]]] = {}
        for layer, edges in _hidden_by_layer(plan, self._layer_of).items():
            passes = [(e, RECOMPUTE) for e in edges if label(e) in replayed]
            self._again_by_layer[layer] = passes + [(e, BACKWARD) for e in edges if e.regather]
        self._again: dict[tuple[str, str], Pending] = {}
        self._in_flight: dict[int, int] = {}  # layer -> its backward gathers issued and not used yet
        self._reducing: list[tuple[int, Pending, str]] = []  # (layer, reduction in flight, parameter node)
        self._queued = False

    def again(self, edge: EdgeReshard, phase: str) -> torch.Tensor | None:
        """The backward gather of hidden ``edge`` in ``phase`` (``recompute`` or ``backward``: a
        re-gather), issued ahead (``collectives.arrive`` waits for it): the first such call for a
        layer issues the gathers of that layer and of the layer before it, those not in flight yet
        (None: ``edge`` is not hidden)."""
        layer = self._layer_of.get(edge.dst)
        if not edge.hidden or layer is None:
            return None
        for i in (layer, layer - 1):
            if i in self._in_flight or not self._again_by_layer.get(i):
                continue
            self._in_flight[i] = len(self._again_by_layer[i])
            for e, p in self._again_by_layer[i]:
                label = self._label(e)
                self._again[label, p] = Pending(issue_ahead(self._piece(e.src), self._ops[label], self._logs[label], p),
                                                self._ops[label])
        self._at_end()
        self._in_flight[layer] -= 1
        if not self._in_flight[layer]:  # the layer's backward gathers are all used: the next backward issues anew
            del self._in_flight[layer]
        return self._again.pop((self._label(edge), phase)).started

    def reducer(self, edge: EdgeReshard, requires_grad: bool) -> Callable[[torch.Tensor], None] | None:
        """The backward callback that reduces ``edge``'s gradient in flight into its parameter's
        gradient (None: the edge is not hidden, or no gradient reaches the parameter)."""
        if not edge.hidden or not requires_grad:
            return None
        label = self._label(edge)
        log, ops, layer = self._logs.get(label), self._grad_ops[label], self._layer_of[edge.dst]

        def reduce(grad: torch.Tensor) -> None:
            self._at_end()
            self._land(lambda other: other > layer)
            self._reducing.append((layer, Pending(issue_ahead(grad, ops, log, BACKWARD), ops), edge.src))

        return reduce

    def _at_end(self) -> None:
        """Have :meth:`_end` run when this backward ends (once)."""
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end)

    def _end(self) -> None:
        """End of the backward: every reduction still in flight lands, and a gather issued ahead
        that no layer used (a layer the backward did not reach) is waited for and dropped, so no
        collective is left in flight when the step ends."""
        self._queued = False
        self._land(lambda layer: True)
        for pending in self._again.values():
            pending.wait()
        self._again.clear()
        self._in_flight.clear()

    def _land(self, which: Callable[[int], bool]) -> None:
        """Wait for the reductions in flight of the layers ``which`` selects and add each to its
        parameter's gradient. A layer's reductions land when the next layer's start (FSDP2's
        bound: one layer's unsharded gradients in flight at a time), the last at the end."""
        landing = [r for r in self._reducing if which(r[0])]
        self._reducing = [r for r in self._reducing if not which(r[0])]
        with torch.no_grad():
            for _, pending, src in landing:
                piece = pending.wait()
                if piece.untyped_storage().nbytes() > piece.numel() * piece.element_size():
                    piece = piece.clone()  # a slice would keep its whole buffer alive with the gradient
                self._accumulate(src, piece)
