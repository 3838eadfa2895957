"""Run the overlap rule of ``cost/overlap.py``: the plan's hidden edges (``EdgeReshard.hidden``)
have their collectives in flight while compute runs; every other collective runs blocking.

- Forward: when the executor reaches the first node of repeated layer ``i``, it issues the
  forward steps of the hidden edges of layers ``i`` and ``i + 1`` (those not issued yet) with
  :func:`~autoshard.runtime.collectives.start_steps`; the owner's operand waits for its own at
  first use (``reshard(..., ready=...)``). So layer ``i + 1``'s parameter gathers travel during
  layer ``i``'s compute; layer 0's are issued at its start, as FSDP2's root does.
- Backward: a hidden edge's gradient reaches :meth:`Overlap.reducer`'s callback instead of
  autograd; its reduction is issued at once and waited at the end of the backward (an autograd
  engine callback, as FSDP2's post-backward), where the reduced piece is added to the
  parameter's gradient. So the reductions travel during the rest of the backward.

Collectives issued this way are logged with ``ahead=True``; ``runtime/checks.py`` lists the same.
Gathers a recomputation or a re-gather runs in the backward are blocking (not issued ahead).
Every rank issues in the same graph order, so the collectives on each group keep one order.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from autoshard.frontend.graph import OpGraph
from autoshard.problem.plan import EdgeReshard, Plan
from autoshard.runtime.collectives import BACKWARD, FORWARD, CommLog, Pending, start_steps
from autoshard.runtime.groups import MeshGroups
from autoshard.sharding.layers import find_repeated_layers


class Overlap:
    """One parallel module's hidden edges: gathers issued a layer ahead, reductions in flight."""

    def __init__(self, graph: OpGraph, plan: Plan, groups: MeshGroups, logs: dict[str, CommLog],
                 label: Callable[[EdgeReshard], str]) -> None:
        """``logs`` by edge label (``label``) receive the issued collectives."""
        self.groups, self._logs, self._label = groups, logs, label
        repeated = find_repeated_layers(graph)
        self._layer_of = {name: i for i, layer in enumerate(repeated.layers) for name in layer} if repeated else {}
        self._by_layer: dict[int, list[EdgeReshard]] = {}
        for edge in plan.edges:
            if edge.hidden and edge.steps and edge.dst in self._layer_of:
                self._by_layer.setdefault(self._layer_of[edge.dst], []).append(edge)
        self._issued: set[int] = set()
        self._pending: dict[str, Pending] = {}
        self._reducing: list[tuple[Pending, nn.Parameter]] = []

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

    def reducer(self, edge: EdgeReshard, param: nn.Parameter) -> Callable[[torch.Tensor], None] | None:
        """The backward callback that reduces ``edge``'s gradient in flight into ``param.grad``
        (None: the edge is not hidden, or no gradient reaches the parameter through it)."""
        if not edge.hidden or not param.requires_grad:
            return None
        log = self._logs.get(self._label(edge))

        def reduce(grad: torch.Tensor) -> None:
            if not self._reducing:
                torch.autograd.Variable._execution_engine.queue_callback(self._land)
            self._reducing.append((start_steps(grad, edge.grad_steps, self.groups, log, BACKWARD, ahead=True), param))

        return reduce

    def _land(self) -> None:
        """End of the backward: wait for every reduction in flight and add it to its parameter's gradient."""
        reducing, self._reducing = self._reducing, []
        with torch.no_grad():
            for pending, param in reducing:
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
