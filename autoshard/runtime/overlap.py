"""Run the overlap rule of ``cost/overlap.py``: the plan's hidden edges (``EdgeReshard.hidden``)
have their collectives in flight while compute runs; every other collective runs blocking.

- Forward: when the executor reaches the first node of repeated layer ``i``, it issues the
  forward steps of the hidden edges of layers ``i`` and ``i + 1`` (those not issued yet) with
  :func:`~autoshard.runtime.collectives.start_steps`; the owner's operand waits for its own at
  first use (``reshard(..., ready=...)``). So layer ``i + 1``'s parameter gathers travel during
  layer ``i``'s compute; layer 0's are issued at its start, as FSDP2's root does.
- Backward gathers: when the backward first gathers a hidden edge of layer ``i`` again (its
  recomputation, or a re-gather of a parameter saved as its piece), it issues every such gather
  of layers ``i`` and ``i - 1`` not issued yet (:meth:`Overlap.again`); each is waited where it
  is used. So layer ``i - 1``'s gathers travel during layer ``i``'s backward.
- Backward reductions: a hidden edge's gradient reaches :meth:`Overlap.reducer`'s callback
  instead of autograd; its reduction is issued at once and waited when the next layer's first
  reduction is issued, or at the end of the backward (an autograd engine callback, as FSDP2's
  post-backward), where the reduced piece is added to the parameter's gradient. So a layer's
  reductions travel during the next layer's backward, one layer's unsharded gradients at a time.

Collectives issued this way are logged with ``ahead=True``; ``runtime/checks.py`` lists the same.
Every rank issues at the same points of the same graph, so the collectives on each group keep
one order.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from autoshard.frontend.graph import OpGraph
from autoshard.problem.plan import EdgeReshard, Plan
from autoshard.runtime.collectives import BACKWARD, FORWARD, RECOMPUTE, CommLog, Pending, start_steps
from autoshard.runtime.groups import MeshGroups
from autoshard.sharding.layers import find_repeated_layers


class Overlap:
    """One parallel module's hidden edges: gathers issued a layer ahead, reductions in flight."""

    def __init__(self, graph: OpGraph, plan: Plan, groups: MeshGroups, logs: dict[str, CommLog],
                 label: Callable[[EdgeReshard], str], replayed: set[str]) -> None:
        """``logs`` by edge label (``label``) receive the issued collectives; ``replayed``: the
        labels of the edges a recomputation runs again (``checks.replayed_edges``)."""
        self.groups, self._logs, self._label = groups, logs, label
        repeated = find_repeated_layers(graph)
        self._layer_of = {name: i for i, layer in enumerate(repeated.layers) for name in layer} if repeated else {}
        self._by_layer: dict[int, list[EdgeReshard]] = {}
        for edge in plan.edges:
            if edge.hidden and edge.steps and edge.dst in self._layer_of:
                self._by_layer.setdefault(self._layer_of[edge.dst], []).append(edge)
        self._again_by_layer: dict[int, list[tuple[EdgeReshard, str]]] = {}
        for layer, edges in self._by_layer.items():
            passes = [(e, RECOMPUTE) for e in edges if label(e) in replayed]
            self._again_by_layer[layer] = passes + [(e, BACKWARD) for e in edges if e.regather]
        self._issued: set[int] = set()
        self._pending: dict[str, Pending] = {}
        self._again: dict[tuple[str, str], Pending] = {}
        self._in_flight: dict[int, int] = {}  # layer -> its backward gathers issued and not used yet
        self._reducing: list[tuple[int, Pending, nn.Parameter]] = []  # (layer, reduction in flight, into)
        self._queued = False

    def start_forward(self) -> None:
        """A new forward: nothing issued yet (a previous forward consumed what it issued)."""
        self._issued.clear()
        self._pending.clear()

    def reached(self, node: str, piece: Callable[[str], torch.Tensor]) -> None:
        """The forward reached ``node``: at a layer's first node issue this layer's and the next's
        gathers (``piece(src)``: the parameter's local piece)."""
        layer = self._layer_of.get(node)
        if layer is None or layer in self._issued:
            return
        for i in (layer, layer + 1):
            if i in self._issued:
                continue
            self._issued.add(i)
            for edge in self._by_layer.get(i, ()):
                with torch.no_grad():
                    self._pending[self._label(edge)] = start_steps(
                        piece(edge.src).detach(), edge.steps, self.groups, self._logs[self._label(edge)], FORWARD,
                        ahead=True)

    def ready(self, edge: EdgeReshard) -> Pending | None:
        """The gather issued ahead for ``edge`` in this forward (None: run it now)."""
        return self._pending.pop(self._label(edge), None)

    def again(self, edge: EdgeReshard, phase: str, piece: Callable[[str], torch.Tensor]) -> Pending | None:
        """The backward gather of hidden ``edge`` in ``phase`` (``recompute`` or ``backward``: a
        re-gather), issued ahead: the first such call for a layer issues the gathers of that layer
        and of the layer before it, those not in flight yet (None: ``edge`` is not hidden)."""
        layer = self._layer_of.get(edge.dst)
        if not edge.hidden or layer is None:
            return None
        for i in (layer, layer - 1):
            if i in self._in_flight or not self._again_by_layer.get(i):
                continue
            self._in_flight[i] = len(self._again_by_layer[i])
            for e, p in self._again_by_layer[i]:
                with torch.no_grad():
                    self._again[self._label(e), p] = start_steps(piece(e.src).detach(), e.steps, self.groups,
                                                                 self._logs[self._label(e)], p, ahead=True)
        self._in_flight[layer] -= 1
        if not self._in_flight[layer]:  # the layer's backward gathers are all used: the next backward issues anew
            del self._in_flight[layer]
        return self._again.pop((self._label(edge), phase))

    def reducer(self, edge: EdgeReshard, param: nn.Parameter) -> Callable[[torch.Tensor], None] | None:
        """The backward callback that reduces ``edge``'s gradient in flight into ``param.grad``
        (None: the edge is not hidden, or no gradient reaches the parameter through it)."""
        if not edge.hidden or not param.requires_grad:
            return None
        log = self._logs.get(self._label(edge))
        layer = self._layer_of[edge.dst]

        def reduce(grad: torch.Tensor) -> None:
            if not self._queued:
                self._queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._land_all)
            self._land(lambda other: other > layer)
            self._reducing.append((layer, start_steps(grad, edge.grad_steps, self.groups, log, BACKWARD, ahead=True),
                                   param))

        return reduce

    def _land_all(self) -> None:
        """End of the backward: every reduction still in flight lands."""
        self._queued = False
        self._land(lambda layer: True)

    def _land(self, which: Callable[[int], bool]) -> None:
        """Wait for the reductions in flight of the layers ``which`` selects and add each to its
        parameter's gradient. A layer's reductions land when the next layer's start (FSDP2's
        bound: one layer's unsharded gradients in flight at a time), the last at the end."""
        landing = [r for r in self._reducing if which(r[0])]
        self._reducing = [r for r in self._reducing if not which(r[0])]
        with torch.no_grad():
            for _, pending, param in landing:
                piece = pending.wait()
                if piece.untyped_storage().nbytes() > piece.numel() * piece.element_size():
                    piece = piece.clone()  # a slice would keep its whole buffer alive with the gradient
                grad = _like(piece, param)
                if param.grad is None:
                    param.grad = grad
                else:
                    param.grad += grad


def _like(piece: torch.Tensor, param: nn.Parameter) -> torch.Tensor:
    """``piece`` as a gradient of ``param``: a DTensor of its placements when the parameter is one."""
    if not isinstance(param, DTensor) and not isinstance(param.data, DTensor):
        return piece
    return DTensor.from_local(piece, param.device_mesh, param.placements, run_check=False,
                              shape=param.shape, stride=param.stride())
