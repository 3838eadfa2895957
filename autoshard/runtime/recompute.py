"""Carry out the plan's memory savings: recomputed blocks and parameters gathered again for backward.

- A recomputed segment (``Plan.recompute``: a run of graph nodes) runs under
  ``torch.utils.checkpoint`` (non-reentrant): its forward keeps none of the tensors autograd
  would save inside it, and the backward runs the segment's forward again first, reshards of
  the edges into it included, whose collectives are then logged in the ``recompute`` pass. The
  whole segment is replayed (checkpoint's early stop off), as the cost model charges it: with
  early stop, ops after the segment's last saved tensor (a trailing residual add and the
  reshard into it) would be skipped and the executed collectives would differ from the plan's.
- A selective plan (``Plan.recompute_kept``: the ops torchtitan's policy keeps, as
  ``cost/recompute.py`` prices them) runs each segment with ``create_selective_checkpoint_contexts``
  and :class:`KeptOps` as its policy: every op dispatched while a kept node computes its output
  is ``MUST_SAVE`` (views excepted: they are recomputed from what they view), every other op
  ``PREFER_RECOMPUTE``; the program keeps the reshard of another op's output into a kept op
  from the forward for the recomputation (its result only, not the steps' intermediates). So
  the recomputation neither runs a kept op again nor the collectives into it (the cost model
  charges neither), while its parameters' gathers run again (charged: the backward needs the
  gathered weight, and ``replayed_edges`` in ``runtime/checks.py`` lists them).
- A re-gathered parameter (``EdgeReshard.regather``): the gathered copy an op saves for backward
  is replaced, through saved-tensor hooks, by the parameter's own piece, and gathered again (the
  edge's forward steps, logged in the backward pass) when the backward unpacks it, or waited
  there when a hidden edge's gather was issued ahead (``runtime/overlap.py``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.checkpoint import (CheckpointPolicy, SelectiveCheckpointContext, checkpoint,
                                   create_selective_checkpoint_contexts, set_checkpoint_early_stop)

from autoshard.runtime.collectives import BACKWARD, CommLog, Op, arrive, run_ops


class KeptOps:
    """The selective policy of one plan: ``MUST_SAVE`` for what runs inside :meth:`keeping`.

    The program enters ``keeping(True)`` around a kept node's op call (``graph.calls.Kept``), in the forward and
    identically in the recomputation (the cache is matched op by op, in order).
    """

    def __init__(self) -> None:
        self.active = False

    def policy(self, ctx: SelectiveCheckpointContext, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        """Save every non-view op run while keeping; recompute the rest."""
        if self.active and not getattr(op, "is_view", False):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    @contextmanager
    def keeping(self, on: bool) -> Iterator[None]:
        """Ops run inside are saved when ``on`` (else the surrounding choice holds)."""
        before = self.active
        self.active = before or on
        try:
            yield
        finally:
            self.active = before


def run_recomputed(run: Callable[..., Any], inputs: Sequence[Any], kept: KeptOps | None = None) -> Any:
    """``run(*inputs)`` under checkpointing: called now, and again when the backward needs what it
    would have saved (``kept``: the selective policy whose saved ops the recomputation takes from
    the forward instead of running them). The whole block is replayed (early stop off, module doc)."""
    options: dict[str, Any] = {}
    if kept is not None:
        options["context_fn"] = partial(create_selective_checkpoint_contexts, kept.policy)
    with set_checkpoint_early_stop(False):
        return checkpoint(run, *inputs, use_reentrant=False, **options)


@dataclass(frozen=True)
class _Gathered:
    """What a saved gathered parameter is packed into: its piece and how to gather it again."""

    piece: torch.Tensor
    ops: tuple[Op, ...]
    log: CommLog | None
    size: torch.Size
    stride: tuple[int, ...]
    offset: int
    again: Callable[[], torch.Tensor | None] | None


class Regathering(AbstractContextManager):
    """Saved-tensor hooks for one op call: gathered parameter copies are saved as their pieces."""

    def __init__(self) -> None:
        self.gathered: dict[StorageWeakRef, tuple[torch.Tensor, tuple[Op, ...], CommLog | None,
                                                  Callable[[], torch.Tensor | None] | None]] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def add(self, gathered: torch.Tensor, piece: torch.Tensor, ops: tuple[Op, ...], log: CommLog | None,
            again: Callable[[], torch.Tensor | None] | None = None) -> None:
        """``gathered`` (what the op reads) is ``piece`` after ``ops``: save the piece instead
        (``again``: the gather issued ahead for the backward, ``runtime/overlap.py``; else run then)."""
        self.gathered[StorageWeakRef(gathered.untyped_storage())] = (piece.detach(), ops, log, again)

    def _pack(self, t: torch.Tensor) -> Any:
        found = self.gathered.get(StorageWeakRef(t.untyped_storage()))
        if found is None:
            return t
        piece, ops, log, again = found
        return _Gathered(piece, ops, log, t.size(), t.stride(), t.storage_offset(), again)

    def _unpack(self, saved: Any) -> torch.Tensor:
        if not isinstance(saved, _Gathered):
            return saved
        with torch.no_grad():
            ready = saved.again() if saved.again is not None else None
            whole = arrive(ready, saved.ops) if ready is not None else run_ops(saved.piece, saved.ops, saved.log,
                                                                                   BACKWARD)
        return whole.as_strided(saved.size, saved.stride, saved.offset)

    def __enter__(self) -> "Regathering":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
