"""Execute reshard steps on local tensors with torch.distributed, with and without autograd.

A plan's ``reshard.Step`` list (semantics in ``autoshard/sharding/reshard.py``) is resolved once
per rank into :class:`Op` s (:func:`resolve`: the step with its group's name, size and this
rank's coordinate), which the lowered program (``runtime/graph``) carries as constants.
:func:`run_ops` applies them; :func:`start_ops` stops at the last collective, left in flight,
and :func:`arrive` waits for it (``wait_tensor``) and finishes it: an issue and its first use.
:func:`reshard` wraps them in an autograd Function whose backward runs the plan's gradient
steps, which are not the autograd transpose of the forward: a forward all-reduce P->R has an
identity backward (the gradient of a replicated tensor is full on every rank), a forward slice
R->S has an all-gather backward, and a forward identity may all-reduce a partial gradient
(Megatron's "f").

Each step is one of PyTorch's functional collectives (``torch.ops._c10d_functional``: out of
place, waited by ``wait_tensor``), which gloo runs on CPU (also on subgroups) and NCCL on GPUs,
so each step is exactly one collective call and the bytes logged in :class:`CommLog` are those
of the collective the cost model priced. A step on a dim the mesh does not divide pads this
rank's piece to the largest before its collective and trims the result after (``uneven.py``). Being functional, they are traced by ``torch.compile``
(the log is written by eager runs only) and cached by selective checkpointing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from autoshard.sharding.reshard import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER, SLICE, Step
from autoshard.runtime.groups import MeshGroups
from autoshard.runtime.step_ops import Op
from autoshard.runtime.uneven import pad_for, slice_piece, trim_after

_functional = torch.ops._c10d_functional

FORWARD = "forward"
BACKWARD = "backward"
RECOMPUTE = "recompute"
"""The pass that runs a recomputed block's forward again, inside the backward."""


@dataclass(frozen=True)
class CommRecord:
    """One executed collective: its kind, mesh axis, bytes this rank sent, and the pass it ran in
    (``routed``: an expert-parallel exchange, whose bytes depend on the routing; ``ahead``: issued
    before its result was needed and waited at first use, ``cost/overlap.py``)."""

    kind: str
    axis: int
    sent_bytes: int
    phase: str
    routed: bool = False
    ahead: bool = False


@dataclass
class CommLog:
    """Every collective this rank executed, to compare with what the plan charged."""

    records: list[CommRecord] = field(default_factory=list)

    def total_bytes(self, phase: str | None = None) -> int:
        """Bytes sent by this rank, over one phase (``"forward"``/``"backward"``) or both."""
        return sum(r.sent_bytes for r in self.records if phase is None or r.phase == phase)


def charged_bytes(steps: tuple[Step, ...] | list[Step], mesh_shape: tuple[int, ...]) -> int:
    """Bytes per device the plan charges for ``steps`` (the sum of ``Step.sent_bytes``)."""
    return sum(s.sent_bytes(mesh_shape[s.axis]) for s in steps)


_KINDS = (SLICE, ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, ALL_TO_ALL)


def resolve(steps: tuple[Step, ...] | list[Step], groups: MeshGroups) -> tuple[Op, ...]:
    """``steps`` as this rank runs them on ``groups``."""
    ops = []
    for step in steps:
        if step.kind not in _KINDS:
            raise ValueError(f"unknown reshard step kind {step.kind!r}")
        group = groups.groups[step.axis]
        ops.append(Op(step, groups.axis_size(step.axis), groups.coords[step.axis],
                      group.group_name if group is not None else None))
    return tuple(ops)


def aliases(ops: tuple[Op, ...]) -> bool:
    """True when running ``ops`` returns a view of their input (no collective runs: slices at most)."""
    return not any(op.communicates for op in ops)


def _pieces(x: torch.Tensor, dim: int, n: int, op: Op) -> int:
    if x.shape[dim] % n:
        raise ValueError(f"{op.step.describe()}: dim {dim} of local shape {tuple(x.shape)} does not split into {n} pieces")
    return x.shape[dim] // n


def _issue(x: torch.Tensor, op: Op) -> torch.Tensor:
    """Start the collective of ``op`` on ``x``; its output, not yet arrived."""
    kind, n = op.step.kind, op.size
    if kind == ALL_GATHER:
        return _functional.all_gather_into_tensor(x.contiguous(), n, op.group)
    if kind == REDUCE_SCATTER:
        _pieces(x, op.step.dim, n, op)
        stacked = x.contiguous() if op.step.dim == 0 else torch.cat(x.chunk(n, dim=op.step.dim), dim=0)
        return _functional.reduce_scatter_tensor(stacked, "sum", n, op.group)
    if kind == ALL_REDUCE:
        return _functional.all_reduce(x.contiguous(), "sum", op.group)
    _pieces(x, op.step.to_dim, n, op)
    sends = torch.stack(x.chunk(n, dim=op.step.to_dim))  # piece i, for group rank i, at index i of dim 0
    ones = [1] * n
    return _functional.all_to_all_single(sends, ones, ones, op.group)


def _finish(out: torch.Tensor, op: Op) -> torch.Tensor:
    """An arrived collective output in the step's layout."""
    kind = op.step.kind
    if kind == ALL_GATHER and op.step.dim != 0:  # the pieces arrive stacked on dim 0
        out = torch.cat(out.chunk(op.size, dim=0), dim=op.step.dim)
    elif kind == ALL_TO_ALL:
        out = torch.cat(out.unbind(0), dim=op.step.dim)
    return trim_after(out, op)


def _log(x: torch.Tensor, op: Op, log: CommLog | None, phase: str, ahead: bool) -> None:
    if log is not None and op.step.kind != SLICE and not torch.compiler.is_compiling():
        actual = replace(op.step, in_bytes=x.numel() * x.element_size())
        log.records.append(CommRecord(op.step.kind, op.step.axis, actual.sent_bytes(op.size), phase, ahead=ahead))


def start_ops(x: torch.Tensor, ops: tuple[Op, ...], log: CommLog | None = None, phase: str = FORWARD,
              ahead: bool = False) -> torch.Tensor:
    """Apply ``ops`` to this rank's piece ``x`` up to the last one; when that is a collective it is
    left in flight (issued, not waited) and its raw output returned, for :func:`arrive`. Every
    rank must call this in the same order as its other collectives on the same groups.
    Collectives are logged as :func:`run_ops` does, ``ahead`` marking those issued before their use."""
    for k, op in enumerate(ops):
        x = pad_for(x, op)  # a piece of an uneven cut padded to the largest, as sent and priced
        _log(x, op, log, phase, ahead)
        if op.step.kind == SLICE:
            piece = slice_piece(x, op)
            if piece is None:
                k_ = _pieces(x, op.step.dim, op.size, op)
                piece = x.narrow(op.step.dim, op.coord * k_, k_)
            x = piece
        elif op.size > 1:
            if k == len(ops) - 1:
                return _issue(x, op)
            x = _finish(_functional.wait_tensor(_issue(x, op)), op)  # the raw output dies here, as priced
    return x


def arrive(started: torch.Tensor, ops: tuple[Op, ...]) -> torch.Tensor:
    """The result of :func:`start_ops`: its last collective waited for and finished."""
    if ops and ops[-1].communicates:
        return _finish(_functional.wait_tensor(started), ops[-1])
    return started


def run_ops(x: torch.Tensor, ops: tuple[Op, ...], log: CommLog | None = None, phase: str = FORWARD) -> torch.Tensor:
    """Apply ``ops`` to this rank's local piece ``x``, blocking (each collective waited at once).

    Plain tensor code (no autograd semantics of its own). Each collective is logged with the
    bytes ``Step.sent_bytes`` gives for the actual local size, so the log checks the plan's price.
    """
    return arrive(start_ops(x, ops, log, phase), ops)


def run_steps(x: torch.Tensor, steps: tuple[Step, ...] | list[Step], groups: MeshGroups, log: CommLog | None = None,
              phase: str = FORWARD) -> torch.Tensor:
    """:func:`run_ops` of ``steps`` resolved on ``groups``."""
    return run_ops(x, resolve(steps, groups), log, phase)


@dataclass
class Pending:
    """A reshard whose last collective is in flight: :meth:`wait` is its first use."""

    started: torch.Tensor
    ops: tuple[Op, ...]

    def wait(self) -> torch.Tensor:
        """The reshard's result, once its collective has arrived."""
        return arrive(self.started, self.ops)


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t``, copied when it is a slice of a larger storage (a sliced gradient would keep the whole
    one alive, as long as the gradient is kept: until the optimizer step for a parameter)."""
    if not torch.compiler.is_compiling() and t.untyped_storage().nbytes() > t.numel() * t.element_size():
        return t.clone()
    return t


class _Reshard(torch.autograd.Function):
    """Forward: the plan's reshard steps (or a reshard issued ahead, waited here); backward: the
    plan's gradient steps (or handed to ``reduce``, which runs them in flight)."""

    @staticmethod
    def forward(ctx, x, ready, fwd, bwd, log, phase, reduce):  # type: ignore[override]
        ctx.bwd, ctx.log, ctx.reduce = bwd, log, reduce
        if ready is not None:
            out = arrive(ready, fwd)
        elif not fwd:  # only the gradient is resharded: pass the value on without a copy
            return x.view_as(x)
        else:
            out = run_ops(x, fwd, log, phase)
        return out.clone() if aliases(fwd) else out  # a custom Function's view output cannot be modified in place

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        rest = (None,) * 6
        if not ctx.needs_input_grad[0]:
            return (None, *rest)
        if ctx.reduce is not None:
            ctx.reduce(grad)
            return (None, *rest)
        return (_compact(run_ops(grad, ctx.bwd, ctx.log, BACKWARD)), *rest)


def reshard_ops(x: torch.Tensor, fwd: tuple[Op, ...], bwd: tuple[Op, ...], log: CommLog | None = None,
                phase: str = FORWARD, ready: torch.Tensor | None = None,
                reduce: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
    """Reshard ``x`` by ``fwd``; in backward, turn the incoming gradient by ``bwd``.

    ``bwd`` goes from the gradient's layout at the consumer to the layout the producer expects
    (``EdgeReshard.grad_steps``). Every rank must call this with the same steps. ``phase`` names
    the pass the forward is logged in (a recomputation's is not the forward's). ``ready``: the
    forward was issued ahead (:func:`start_ops` on ``x``'s value, logged then); this waits for it.
    ``reduce``: takes the gradient instead of autograd (which then gets none for ``x``) and
    delivers it itself, reduced by ``bwd`` (``runtime/overlap.py``).
    """
    return _Reshard.apply(x, ready, fwd, bwd, log, phase, reduce)


def reshard_value(x: torch.Tensor, fwd: tuple[Op, ...], log: CommLog | None = None, phase: str = FORWARD,
                  ready: torch.Tensor | None = None) -> torch.Tensor:
    """Reshard ``x`` by ``fwd`` where no gradient flows back (no autograd: a value read for its
    data only, an integer mask, an inference plan); arguments as :func:`reshard_ops`."""
    with torch.no_grad():
        if ready is not None:
            out = arrive(ready, fwd)
        elif not fwd:
            return x
        else:
            out = run_ops(x, fwd, log, phase)
        return out.clone() if aliases(fwd) else out


def reshard(x: torch.Tensor, fwd_steps: tuple[Step, ...] | list[Step], bwd_steps: tuple[Step, ...] | list[Step],
            groups: MeshGroups, log: CommLog | None = None, phase: str = FORWARD) -> torch.Tensor:
    """:func:`reshard_ops` of steps resolved on ``groups``."""
    return reshard_ops(x, resolve(fwd_steps, groups), resolve(bwd_steps, groups), log, phase)


class _Zeros(torch.autograd.Function):
    """Zeros of x's shape; backward zeros (``mask_grad``) or the gradient passed through."""

    @staticmethod
    def forward(ctx, x, mask_grad):  # type: ignore[override]
        ctx.mask_grad = mask_grad
        return torch.zeros_like(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return (torch.zeros_like(grad) if ctx.mask_grad else grad), None


def zeros_passing_grad(x: torch.Tensor) -> torch.Tensor:
    """Zeros of ``x``'s shape whose gradient passes to ``x`` unchanged (:func:`mask_to_first` off coordinate 0)."""
    return _Zeros.apply(x, False)


def masked_here(axes: tuple[int, ...] | frozenset[int], groups: MeshGroups) -> bool:
    """True when this rank is off coordinate 0 of some axis in ``axes`` (:func:`mask_to_first` zeros its operand)."""
    return not all(groups.coords[a] == 0 for a in axes)


def mask_to_first(
    x: torch.Tensor,
    axes: tuple[int, ...] | frozenset[int],
    groups: MeshGroups,
    mask_grad: bool = True,
) -> torch.Tensor:
    """``x`` on devices at coordinate 0 of every axis in ``axes``, zeros elsewhere.

    For an operand (a bias) added into an output that is a partial sum over ``axes``: the sum
    then counts it once. With ``mask_grad`` (the default) backward is the exact derivative, so
    the masked operand's gradient is itself partial over ``axes``; with ``mask_grad=False`` the
    gradient passes unmasked, which is right when the output's gradient arrives replicated and
    the operand is a replicated parameter (Megatron's row-parallel bias, added after the
    all-reduce there, gets the full gradient on every rank).
    """
    if not masked_here(axes, groups):
        return x
    return _Zeros.apply(x, mask_grad)
