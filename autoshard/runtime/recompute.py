"""Carry out the plan's memory savings: recomputed blocks and parameters gathered again for backward.

- A recomputed segment (``Plan.recompute``: a run of graph nodes) runs under
  ``torch.utils.checkpoint`` (non-reentrant): its forward keeps none of the tensors autograd
  would save inside it, and the backward runs the segment's forward again first, reshards of
  the edges into it included, whose collectives are then logged in the ``recompute`` pass. The
  whole segment is replayed (checkpoint's early stop off), as the cost model charges it: with
  early stop, ops after the segment's last saved tensor (a trailing residual add and the
  reshard into it) would be skipped and the executed collectives would differ from the plan's.
- A re-gathered parameter (``EdgeReshard.regather``): the gathered copy an op saves for backward
  is replaced, through saved-tensor hooks, by the parameter's own piece, and gathered again (the
  edge's forward steps, logged in the backward pass) when the backward unpacks it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from autoshard.runtime.collectives import BACKWARD, FORWARD, RECOMPUTE, CommLog, run_steps
from autoshard.runtime.groups import MeshGroups
from autoshard.sharding.reshard import Step


def run_recomputed(segment: Callable[[str, Sequence[Any]], list[Any]], inputs: Sequence[Any]) -> list[Any]:
    """``segment(phase, inputs)`` under checkpointing: called with ``forward`` now, and with
    ``recompute`` when the backward needs what it would have saved."""
    calls = [0]

    def run(*args: Any) -> list[Any]:
        phase = FORWARD if calls[0] == 0 else RECOMPUTE
        calls[0] += 1
        return segment(phase, args)

    with set_checkpoint_early_stop(False):
        return checkpoint(run, *inputs, use_reentrant=False)


@dataclass(frozen=True)
class _Gathered:
    """What a saved gathered parameter is packed into: its piece and how to gather it again."""

    piece: torch.Tensor
    steps: tuple[Step, ...]
    log: CommLog
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


class Regathering(AbstractContextManager):
    """Saved-tensor hooks for one op call: gathered parameter copies are saved as their pieces."""

    def __init__(self, groups: MeshGroups) -> None:
        self.groups = groups
        self.gathered: dict[StorageWeakRef, tuple[torch.Tensor, tuple[Step, ...], CommLog]] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def add(self, gathered: torch.Tensor, piece: torch.Tensor, steps: tuple[Step, ...], log: CommLog) -> None:
        """``gathered`` (what the op reads) is ``piece`` after ``steps``: save the piece instead."""
        self.gathered[StorageWeakRef(gathered.untyped_storage())] = (piece.detach(), steps, log)

    def _pack(self, t: torch.Tensor) -> Any:
        found = self.gathered.get(StorageWeakRef(t.untyped_storage()))
        if found is None:
            return t
        piece, steps, log = found
        return _Gathered(piece, steps, log, t.size(), t.stride(), t.storage_offset())

    def _unpack(self, saved: Any) -> torch.Tensor:
        if not isinstance(saved, _Gathered):
            return saved
        with torch.no_grad():
            whole = run_steps(saved.piece, saved.steps, self.groups, saved.log, BACKWARD)
        return whole.as_strided(saved.size, saved.stride, saved.offset)

    def __enter__(self) -> "Regathering":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
