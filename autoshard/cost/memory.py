"""Per-device memory of every decision node, as items (owner, what, interval, bytes per strategy).

The items follow what one training (or inference) step really allocates, on the timeline of
``cost/lifetimes.py``:

- **parameter** stored in layout ``L`` (its strategy): its value, ``optimizer_slots`` AdamW
  moments for the whole step, and its gradient from its last reader's backward to the optimizer
  step, at the bytes ``--precision`` gives (``ParamPrecision``; a frozen parameter, one that
  does not require grad, has only its value); during the optimizer step one
  more parameter-sized buffer (AdamW's multi-tensor step, CUDA's default, materialises the
  square root of the second moments of all parameters at once: measured with MemTracker). Where the op that reads it (its
  owner) uses another layout ``U`` — the plan gathers it before use, FSDP-style — or computes
  in another dtype, a use copy in ``U`` exists: from the forward to the owner's backward
  (``keep``) if the owner saves it, else only while the owner runs; re-gathered
  (``regather``), only during the owner's forward and again during its backward;
- **buffer**: its value for the whole step; **input**: the whole batch, as every rank receives it;
- **op output**: the local bytes of its layout over the tensor's lifetime (views hold none, nor
  does a value compiled code keeps inside its fused kernel, ``cost/fusion.py``; a
  partial sum dies after its readers have resharded it, so what they save is their copy); in
  training also what autograd saves that is neither an operand nor the output (norm statistics,
  attention's log-sum-exp) over the op's saved window, the op's temporaries over its forward,
  and what its backward allocates and frees (beyond the operand gradients) over its backward, all
  divided by the strategy's degree, and the output's gradient over its gradient interval.

What resharding a tensor on an edge allocates is charged by the edge's own node
(``problem/reshard_copies.py``, the buffers of ``cost/reshard_memory.py``): the buffers of
reducing a partial sum, and the copy a reader saves for backward or a view keeps, of an
activation or of a parameter read by an op other than its owner (a tied weight). Known
simplification: a producer that several readers save is kept until the last of them has run
backward even where that reader saves a resharded copy instead.
"""

from __future__ import annotations

import math
from fractions import Fraction
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from autoshard.cost.fusion import materialised
from autoshard.cost.lifetimes import Lifetimes
from autoshard.cost.recompute import Blocks, recomputed_forward, saved_window, value_windows
from autoshard.frontend.graph import RECEIVED, NodeKind, OpNode, TensorMeta
from autoshard.sharding.mesh import Mesh
from autoshard.sharding.spec import TensorSpec

if TYPE_CHECKING:
    import numpy as np

PRECISIONS = ("as-is", "bf16-mixed", "fp32")


@dataclass(frozen=True)
class ParamPrecision:
    """Bytes per parameter element: stored value, compute copy (None: computes on the value),
    gradient, and each optimizer slot."""

    value: int
    compute: int | None
    gradient: int
    optimizer: int


def param_precision(precision: str, itemsize: int) -> ParamPrecision:
    """``as-is``: the model's own dtype everywhere (a plain loop with torch.optim.AdamW);
    ``bf16-mixed``: fp32 master weights, gradients and moments, bf16 compute copies (FSDP2's
    MixedPrecisionPolicy, AMP); ``fp32``: everything in fp32."""
    if precision == "as-is":
        return ParamPrecision(itemsize, None, itemsize, itemsize)
    if precision == "bf16-mixed":
        return ParamPrecision(4, 2, 4, 4)
    if precision == "fp32":
        return ParamPrecision(4, None, 4, 4)
    raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")


@dataclass(frozen=True)
class ParamStorage:
    """How a parameter strategy stores and uses it: the owner's operand layout and whether the
    use copy is gathered again for backward instead of kept."""

    use: TensorSpec | None
    regather: bool = False


@dataclass(frozen=True)
class MemoryItem:
    """Bytes per strategy of ``owner`` in use during ``interval`` (half-open slots)."""

    owner: str
    what: str
    interval: tuple[int, int]
    usage: tuple[int, ...]


def local_bytes(spec: TensorSpec | None, meta: TensorMeta | None, mesh: Mesh, itemsize: int | None = None) -> int:
    """Bytes of one device's piece of a tensor laid out as ``spec`` (0 for a mismatched rank)."""
    if spec is None or meta is None or spec.ndim != len(meta.shape):
        return 0
    return math.prod(spec.local_shape(meta.shape, mesh.shape)) * (meta.itemsize if itemsize is None else itemsize)


def out_metas(node: OpNode) -> list[TensorMeta]:
    """The tensors a node returns (one, or the tensor elements of a tuple)."""
    if isinstance(node.out, TensorMeta):
        return [node.out]
    if isinstance(node.out, tuple):
        return [m for m in node.out if isinstance(m, TensorMeta)]
    return []


def param_items(node: OpNode, layouts: Sequence[TensorSpec], storage: Sequence[ParamStorage], owner: OpNode | None,
                saved_by_owner: bool, life: Lifetimes, mesh: Mesh, precision: str, training: bool,
                optimizer_slots: int, recomputed: Blocks | None = None, kept: bool = False) -> list[MemoryItem]:
    """A parameter's stored value, optimizer state, gradient and use copies, per strategy
    (``recomputed``: the owner's block is recomputed, so the use copy is made again then;
    ``kept``: a pipeline stage keeps the use copy for the whole step, and a gathered one's gradient
    accumulates over the microbatches in the use layout until its one reduction, as FSDP2 under
    torch.distributed.pipelining: ``reshard_after_forward=False``, no gradient sync but the last)."""
    meta = node.tensor
    bytes_of = param_precision(precision, meta.itemsize) if training else ParamPrecision(meta.itemsize, None, 0, 0)
    slots = optimizer_slots if training and node.requires_grad else 0  # a frozen parameter is not optimised
    stored = [local_bytes(l, meta, mesh, bytes_of.value) + slots * local_bytes(l, meta, mesh, bytes_of.optimizer)
              for l in layouts]
    items = [MemoryItem(node.name, "parameter", (0, life.end), tuple(stored))]
    if slots:
        items.append(MemoryItem(node.name, "optimizer step", (life.end - 1, life.end),
                                tuple(local_bytes(l, meta, mesh, bytes_of.optimizer) for l in layouts)))
    if training and node.name in life.gradient:
        start = life.gradient[node.name][0]
        items.append(MemoryItem(node.name, "gradient", (start, life.end),
                                tuple(local_bytes(l, meta, mesh, bytes_of.gradient) for l in layouts)))
    if owner is None:
        return items
    copy_size = bytes_of.compute or bytes_of.value
    copies = [local_bytes(s.use, meta, mesh, copy_size) if s.use is not None and (s.use != l or bytes_of.compute)
              else 0 for l, s in zip(layouts, storage)]
    if kept:
        items.append(MemoryItem(node.name, "use copy (kept gathered)", (0, life.end), tuple(copies)))
        if training and node.name in life.gradient:
            accumulated = tuple(local_bytes(s.use, meta, mesh, bytes_of.gradient) if s.use is not None and s.use != l
                                else 0 for l, s in zip(layouts, storage))
            items.append(MemoryItem(node.name, "gathered gradient (accumulated)", (life.gradient[node.name][0],
                                                                                    life.end), accumulated))
    elif training and saved_by_owner and recomputed is not None:
        items += [MemoryItem(node.name, "use copy (forward)", life.forward_window(owner.name), tuple(copies)),
                  MemoryItem(node.name, "use copy (recomputed)", saved_window(owner.name, life, recomputed),
                             tuple(copies))]
    elif training and saved_by_owner:
        kept = tuple(0 if s.regather else c for c, s in zip(copies, storage))
        again = tuple(c if s.regather else 0 for c, s in zip(copies, storage))
        items += [MemoryItem(node.name, "use copy", life.saved_window(owner.name), kept),
                  MemoryItem(node.name, "use copy (forward)", life.forward_window(owner.name), again),
                  MemoryItem(node.name, "use copy (backward)", life.backward_window(owner.name), again)]
    else:
        items.append(MemoryItem(node.name, "use copy", life.forward_window(owner.name), tuple(copies)))
    return items


def op_items(node: OpNode, out_specs: Sequence[TensorSpec], degrees: Sequence[int], life: Lifetimes, mesh: Mesh,
             training: bool, recomputed: Blocks | None = None, gathered: Sequence[int] | None = None,
             kept_until: int | None = None) -> list[MemoryItem]:
    """An op's output, saved internals, temporaries and output gradient, per strategy
    (``recomputed``: its block is recomputed, see cost/recompute.py; ``gathered``: bytes of
    operands it reads gathered, per strategy, whose gradients it holds in that layout during its
    backward, before they are reduced back (the gathered operands themselves are its edges'
    reshard copies, ``problem/reshard_copies.py``);
    ``kept_until``: a recomputed block keeps its output until that slot, its recomputation)."""
    metas = out_metas(node)
    work = node.work
    holds_none = life.base[node.name] != node.name or not materialised(work)  # a view, or fused away
    outs = tuple(0 if holds_none else sum(local_bytes(s, m, mesh) for m in metas) if len(metas) > 1
                 else local_bytes(s, metas[0] if metas else None, mesh) for s in out_specs)
    whole = tuple(0 if s.partial else b for s, b in zip(out_specs, outs))
    partial = tuple(b if s.partial else 0 for s, b in zip(out_specs, outs))
    windows = [life.value[node.name]] if recomputed is None else value_windows(node.name, life, recomputed)
    if kept_until is not None:
        windows = [(start, max(end, kept_until)) for start, end in windows]
    items = [MemoryItem(node.name, "activation", window, whole) for window in windows]
    items.append(MemoryItem(node.name, "activation", life.read[node.name], partial))
    if work is None:
        return items
    backward = training and node.requires_grad
    saved = work.saved_other_bytes if backward else 0
    if saved:
        window = life.saved_window(node.name) if recomputed is None else saved_window(node.name, life, recomputed)
        items.append(MemoryItem(node.name, "saved for backward", window, tuple(-(-saved // d) for d in degrees)))
    if backward and gathered and any(gathered):
        items.append(MemoryItem(node.name, "gathered gradients", life.backward_window(node.name), tuple(gathered)))
    temporary = max(0, work.temporary_bytes - saved)
    if temporary:
        runs = [life.forward_window(node.name)]
        if recomputed is not None:
            runs.append(recomputed_forward(node.name, life, recomputed))
        items += [MemoryItem(node.name, "temporary", window, tuple(-(-temporary // d) for d in degrees))
                  for window in runs]
    if backward and work.backward_temporary_bytes:
        items.append(MemoryItem(node.name, "backward temporary", life.backward_window(node.name),
                                tuple(-(-work.backward_temporary_bytes // d) for d in degrees)))
    if backward and node.name in life.gradient and not holds_none:
        grads = tuple(local_bytes(s.without_partial(), metas[0], mesh) if len(metas) == 1 else 0 for s in out_specs)
        items.append(MemoryItem(node.name, "gradient", life.gradient[node.name], grads))
    return items


def recompute_variants(keep: list[MemoryItem], recompute: list[MemoryItem], kept: int,
                       recomputed: int) -> list[MemoryItem]:
    """Items of a node whose strategies come twice: ``kept`` keeping its block's activations, then
    ``recomputed`` recomputing them."""
    return ([MemoryItem(m.owner, m.what, m.interval, m.usage + (0,) * recomputed) for m in keep]
            + [MemoryItem(m.owner, m.what, m.interval, (0,) * kept + m.usage) for m in recompute])


def state_items(node: OpNode, layouts: Sequence[TensorSpec], life: Lifetimes, mesh: Mesh) -> list[MemoryItem]:
    """A buffer's value for the whole step, a model input: the whole batch every rank receives, or
    an input a pipeline stage receives: the piece of its layout, and its gradient before it is sent back."""
    meta = node.tensor
    if node.attrs.get(RECEIVED):
        pieces = tuple(local_bytes(l, meta, mesh) for l in layouts)
        items = [MemoryItem(node.name, "received", life.value[node.name], pieces)]
        if node.name in life.gradient:
            items.append(MemoryItem(node.name, "gradient", life.gradient[node.name], pieces))
        return items
    if node.kind == NodeKind.INPUT:
        whole = meta.nbytes if meta is not None else 0
        return [MemoryItem(node.name, "input", (0, life.value[node.name][1]), tuple(whole for _ in layouts))]
    return [MemoryItem(node.name, "buffer", (0, life.end), tuple(local_bytes(l, meta, mesh) for l in layouts))]


def microbatched_items(items: Sequence[MemoryItem], life: Lifetimes, extra: Fraction, stored: bool) -> list[MemoryItem]:
    """A pipeline stage's items when it holds ``1 + extra`` microbatches in flight at its fullest
    and accumulates gradients over microbatches: a parameter's (``stored``) gradient lives the
    whole step; everything else live across the forward-backward boundary (slot ``horizon``: what
    is saved for backward, checkpointed and received inputs) is held ``extra`` more times for the
    whole step, on behalf of the other microbatches (their peaks are taken to coincide with this one's)."""
    out = []
    for m in items:
        if stored:
            out.append(MemoryItem(m.owner, m.what, (0, life.end), m.usage) if m.what == "gradient" else m)
            continue
        out.append(m)
        if extra and held_across(m, life.horizon):
            out.append(MemoryItem(m.owner, "other microbatches in flight", (0, life.end),
                                  tuple(other_microbatches_bytes(u, extra) for u in m.usage)))
    return out


def held_across(item: MemoryItem, horizon: int) -> bool:
    """Whether an unstored item is live across the forward-backward boundary with some usage: the
    other microbatches in flight hold copies of it (``microbatched_items``)."""
    start, end = item.interval
    return start < horizon < end and any(item.usage)


def other_microbatches_bytes(usage: int | np.ndarray, extra: Fraction | int) -> int | np.ndarray:
    """``ceil(usage * extra)``, exactly in integers: the bytes the other microbatches' copies of an
    item hold. ``usage``: an int, or an integer numpy array (element-wise)."""
    return -((-usage * extra.numerator) // extra.denominator)
