"""The local pieces a parallel module's program runs on, and their gradients as DTensors.

A parallel module's parameters are DTensors (global shapes, the plan's placements), so
``clip_grad_norm_``, optimizers and torch.distributed.checkpoint see the whole model. Its
program, though, runs on this rank's pieces: each DTensor's own local tensor (sharing its
storage, so an optimizer step or a loaded checkpoint updates what the program reads) is made
the autograd leaf the program differentiates. Going through ``DTensor.to_local()`` on every
step would cost an autograd Function per parameter in the forward and a DTensor
gradient accumulation per parameter in the backward, several times the step of a small model.

The gradient accumulates into the local leaf as on any plain tensor. When a backward reaches
the program's outputs (:meth:`LocalPieces.watch`: a hook on each output), it queues one callback
for its end, which shows every leaf's gradient as its parameter's DTensor gradient, sharing
its storage; before each forward :meth:`LocalPieces.values` takes back what the user did to the
DTensor gradients (``zero_grad`` dropping them, a gradient set by hand). One hook and one
callback per backward, not a Python hook per parameter. Without a device mesh the parameters
are plain tensors and are their own pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor


@dataclass
class _Piece:
    """One parameter or buffer: the table of the module that holds it (``_parameters`` or
    ``_buffers``), its name there, and the local leaf the program reads."""

    table: dict[str, torch.Tensor]
    name: str
    parameter: bool
    leaf: torch.Tensor | None = None


class LocalPieces:
    """The program's first arguments, by graph node name, with their gradients bridged (module doc)."""

    def __init__(self) -> None:
        self._pieces: dict[str, _Piece] = {}
        self._order: list[_Piece] = []
        self._bridged = False  # some parameter is a DTensor whose gradient must be shown
        self._queued = False

    def add(self, node: str, owner: nn.Module, name: str, parameter: bool) -> None:
        """Graph node ``node`` is ``owner``'s parameter or buffer ``name``."""
        piece = _Piece(owner._parameters if parameter else owner._buffers, name, parameter)
        self._pieces[node] = piece
        self._order.append(piece)

    def of(self, node: str) -> torch.Tensor:
        """Node ``node``'s current local leaf."""
        return self._leaf(self._pieces[node])

    def values(self) -> list[torch.Tensor]:
        """Every local leaf, in the order they were added, each with the gradient its DTensor
        parameter shows (``zero_grad`` may have dropped it, or a gradient been set by hand)."""
        leaves = []
        for piece in self._order:
            leaf = self._leaf(piece)
            if piece.parameter and leaf is not piece.table[piece.name]:
                shown = piece.table[piece.name].grad
                if shown is None:
                    if leaf.grad is not None:
                        leaf.grad = None
                elif shown._local_tensor is not leaf.grad:
                    leaf.grad = shown._local_tensor
            leaves.append(leaf)
        return leaves

    def watch(self, outputs: Sequence[Any]) -> None:
        """Show the gradients when a backward through ``outputs`` ends (module doc)."""
        if not self._bridged:
            return
        self._queued = False  # a backward that failed never ran its callback
        for out in outputs:
            if isinstance(out, torch.Tensor) and out.grad_fn is not None:
                out.grad_fn.register_prehook(self._reached)

    def _reached(self, grads: Any) -> None:
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._show_all)

    def _show_all(self) -> None:
        self._queued = False
        for piece in self._order:
            if piece.leaf is not None and piece.leaf.grad is not None:
                _show(piece)

    def accumulate(self, node: str, grad: torch.Tensor) -> None:
        """Add ``grad`` (a local piece) to node ``node``'s gradient, outside autograd."""
        piece = self._pieces[node]
        leaf = self._leaf(piece)
        if leaf.grad is None:
            leaf.grad = grad
        else:
            leaf.grad += grad
        _show(piece)

    def _leaf(self, piece: _Piece) -> torch.Tensor:
        """``piece``'s local leaf, made one if the module holds a new DTensor (a plain tensor is its own)."""
        held = piece.table[piece.name]
        if not isinstance(held, DTensor):
            return held
        leaf = held._local_tensor
        if leaf is not piece.leaf:
            piece.leaf = leaf
            if piece.parameter and held.requires_grad:
                leaf.requires_grad_(True)
                self._bridged = True
        return leaf


def _show(piece: _Piece) -> None:
    """Show the leaf's gradient as the DTensor parameter's (a new DTensor on the same storage),
    unless it is already. The DTensor is made without its ``__init__``, which does nothing but
    costs more than the rest (dynamo's guard around it)."""
    held, leaf = piece.table[piece.name], piece.leaf
    grad = leaf.grad if leaf is not None else None
    if not isinstance(held, DTensor) or held._local_tensor is not leaf or grad is None:
        return
    shown = held.grad
    if shown is None or shown._local_tensor is not grad:
        held.grad = DTensor.__new__(DTensor, grad, held._spec, requires_grad=False)
