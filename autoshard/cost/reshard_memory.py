"""The buffers the runtime allocates to run one edge's reshard steps (``runtime/collectives.py``).

Each step takes the current local tensor (``b`` bytes, on an axis of ``n`` devices) and allocates,
besides its result, what its torch.distributed call needs laid out contiguously:

- slice: nothing (a view; contiguous only when it narrows dim 0);
- all-gather: a contiguous copy of a non-contiguous input (``b``) and the gathered pieces
  (``n b``), which along dim 0 are the result and along another dim are then concatenated into
  it (``n b``), the copy of the input freed by then;
- reduce-scatter: the input's ``n`` pieces stacked contiguously on dim 0 (``b``, unless it splits a
  contiguous tensor along dim 0, whose pieces already are), and the result (``b / n``);
- all-reduce: a contiguous copy of a non-contiguous input (``b``) and the result (``b``);
- all-to-all: the pieces sent, stacked (``b``), and the pieces received (``b``), then the pieces
  received and their concatenation, the result (``b``).

A step's temporaries die when it returns, the previous step's result when the next has run (the
last step finishes, its concatenation included, once the previous result is released). A
result that is a view of the input (slices alone) is copied, as the reshard's autograd Function
returns no view of its input.
:func:`reshard_buffers` walks the steps and returns the most these buffers hold at once and what
the last result holds. The memory model charges them on the edges that reduce partial sums
(``problem/reshard_copies.py``); ``tests/cost/test_reshard_memory.py`` measures the executor's
own steps with MemTracker against this function.
"""

from __future__ import annotations

from typing import Sequence

from autoshard.sharding.reshard import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER, SLICE, Step


def reshard_buffers(steps: Sequence[Step], in_bytes: int, mesh_shape: Sequence[int]) -> tuple[int, int]:
    """(peak, result): the most bytes the steps' own buffers hold at once while they run from a
    contiguous input of ``in_bytes``, and the bytes of the buffer the result lives in (0 for no steps)."""
    held, current, contiguous, peak = 0, in_bytes, True, 0
    for k, step in enumerate(steps):
        n = mesh_shape[step.axis]
        if step.kind == SLICE:
            contiguous = contiguous and step.dim == 0
            current //= n
            continue
        staged = 0 if contiguous else current
        if step.kind == ALL_GATHER:  # the gathered pieces, then (not along dim 0) their concatenation
            out = n * current
            phases = (staged + out, out + (0 if step.dim == 0 else out))
        elif step.kind == REDUCE_SCATTER:  # the input's pieces stacked on dim 0, then the reduced piece
            out = current // n
            phases = ((0 if contiguous and step.dim == 0 else current) + out,)
        elif step.kind == ALL_REDUCE:
            out = current
            phases = (staged + out,)
        elif step.kind == ALL_TO_ALL:  # the pieces stacked and received, then their concatenation
            out = current
            phases = (2 * current, 2 * current)
        else:
            raise ValueError(f"unknown reshard step kind {step.kind!r}")
        last = k == len(steps) - 1  # its finishing phase runs once the previous result is released
        peak = max(peak, held + phases[0], *((0 if last else held) + p for p in phases[1:]))
        held, current, contiguous = out, out, True
    if steps and not held:  # slices alone: a view of the input, which the reshard returns copied
        held = peak = current
    return peak, held
