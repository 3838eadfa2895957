"""Execute reshard steps on local tensors with torch.distributed, with and without autograd.

:func:`run_steps` is the plain executor of a ``reshard.Step`` list (semantics in
``autoshard/sharding/reshard.py``); :func:`reshard` wraps it in an autograd Function whose backward runs
the plan's gradient steps, which are not the autograd transpose of the forward: a forward
all-reduce P->R has an identity backward (the gradient of a replicated tensor is full on every
rank), a forward slice R->S has an all-gather backward, and a forward identity may all-reduce a
partial gradient (Megatron's "f").

Each step is one of PyTorch's functional collectives (``torch.ops._c10d_functional``: out of
place, waited by ``wait_tensor``), which gloo runs on CPU (also on subgroups) and NCCL on GPUs,
so each step is exactly one collective call and the bytes logged in :class:`CommLog` are those
of the collective the cost model priced. Being functional, they can be cached by selective
checkpointing (``runtime/recompute.py``) and traced by ``torch.compile``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from autoshard.sharding.reshard import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER, SLICE, Step
from autoshard.runtime.groups import MeshGroups

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


def _pieces(x: torch.Tensor, dim: int, n: int, what: str) -> int:
    if x.shape[dim] % n:
        raise ValueError(f"{what}: dim {dim} of local shape {tuple(x.shape)} does not split into {n} pieces")
    return x.shape[dim] // n


def _slice(x: torch.Tensor, step: Step, groups: MeshGroups) -> torch.Tensor:
    n = groups.axis_size(step.axis)
    k = _pieces(x, step.dim, n, step.describe())
    return x.narrow(step.dim, groups.coords[step.axis] * k, k)


def _group_name(step: Step, groups: MeshGroups) -> str:
    """The registered name of the process group along the step's axis (functional collectives take names)."""
    return groups.groups[step.axis].group_name


def _all_gather(x: torch.Tensor, step: Step, groups: MeshGroups) -> torch.Tensor:
    return _functional.all_gather_into_tensor(x.contiguous(), groups.axis_size(step.axis), _group_name(step, groups))


def _gathered(out: torch.Tensor, step: Step, groups: MeshGroups) -> torch.Tensor:
    if step.dim == 0:  # the pieces arrive stacked on dim 0: already the result
        return out
    return torch.cat(out.chunk(groups.axis_size(step.axis), dim=0), dim=step.dim)


def _reduce_scatter(x: torch.Tensor, step: Step, groups: MeshGroups) -> torch.Tensor:
    n = groups.axis_size(step.axis)
    _pieces(x, step.dim, n, step.describe())
    stacked = x.contiguous() if step.dim == 0 else torch.cat(x.chunk(n, dim=step.dim), dim=0)
    return _functional.reduce_scatter_tensor(stacked, "sum", n, _group_name(step, groups))


def _all_reduce(x: torch.Tensor, step: Step, groups: MeshGroups) -> torch.Tensor:
    return _functional.all_reduce(x.contiguous(), "sum", _group_name(step, groups))


def _all_to_all(x: torch.Tensor, step: Step, groups: MeshGroups) -> torch.Tensor:
    n = groups.axis_size(step.axis)
    _pieces(x, step.to_dim, n, step.describe())
    sends = torch.stack(x.chunk(n, dim=step.to_dim))  # piece i, for group rank i, at index i of dim 0
    ones = [1] * n
    return _functional.all_to_all_single(sends, ones, ones, _group_name(step, groups))


def _exchanged(out: torch.Tensor, step: Step, groups: MeshGroups) -> torch.Tensor:
    return torch.cat(out.unbind(0), dim=step.dim)


def _arrived(out: torch.Tensor, step: Step, groups: MeshGroups) -> torch.Tensor:
    return out


Issue = Callable[[torch.Tensor, Step, MeshGroups], torch.Tensor]
_EXECUTORS: dict[str, tuple[Issue, Issue]] = {
    ALL_GATHER: (_all_gather, _gathered),
    REDUCE_SCATTER: (_reduce_scatter, _arrived),
    ALL_REDUCE: (_all_reduce, _arrived),
    ALL_TO_ALL: (_all_to_all, _exchanged),
}
"""Per collective kind: (issue, finish). ``issue`` starts the functional collective and returns its
output before it has arrived; ``finish`` takes it once waited (``wait_tensor``) into the step's layout."""


@dataclass
class Pending:
    """A reshard whose last collective is in flight: :meth:`wait` is its first use."""

    out: torch.Tensor
    step: Step | None
    groups: MeshGroups

    def wait(self) -> torch.Tensor:
        """The reshard's result, once its collective has arrived."""
        if self.step is None:
            return self.out
        return _EXECUTORS[self.step.kind][1](_functional.wait_tensor(self.out), self.step, self.groups)


def _log(x: torch.Tensor, step: Step, groups: MeshGroups, log: CommLog | None, phase: str, ahead: bool) -> None:
    if step.kind != SLICE and log is not None:
        actual = replace(step, in_bytes=x.numel() * x.element_size())
        log.records.append(CommRecord(step.kind, step.axis, actual.sent_bytes(groups.axis_size(step.axis)), phase,
                                      ahead=ahead))


def start_steps(
    x: torch.Tensor,
    steps: tuple[Step, ...] | list[Step],
    groups: MeshGroups,
    log: CommLog | None = None,
    phase: str = FORWARD,
    ahead: bool = False,
) -> Pending:
    """Apply reshard ``steps`` to this rank's piece ``x`` up to the last collective, which is left in
    flight (issued, not waited): the result is ``Pending.wait()``. Steps before it run to completion
    now. Every rank must call this in the same order as its other collectives on the same groups.
    Collectives are logged as :func:`run_steps` does, ``ahead`` marking those issued before their use.
    """
    for k, step in enumerate(steps):
        if step.kind != SLICE and step.kind not in _EXECUTORS:
            raise ValueError(f"unknown reshard step kind {step.kind!r}")
        _log(x, step, groups, log, phase, ahead)
        if step.kind == SLICE:
            x = _slice(x, step, groups)
        elif groups.axis_size(step.axis) > 1:
            issue, _ = _EXECUTORS[step.kind]
            if k == len(steps) - 1:
                return Pending(issue(x, step, groups), step, groups)
            x = Pending(issue(x, step, groups), step, groups).wait()
    return Pending(x, None, groups)


def run_steps(
    x: torch.Tensor,
    steps: tuple[Step, ...] | list[Step],
    groups: MeshGroups,
    log: CommLog | None = None,
    phase: str = FORWARD,
) -> torch.Tensor:
    """Apply reshard ``steps`` to this rank's local piece ``x``; collective over each step's axis.

    Plain tensor code (no autograd semantics of its own), blocking: each collective is waited at
    once. Each collective is logged with the bytes ``Step.sent_bytes`` gives for the actual local
    size, so the log checks the plan's price.
    """
    return start_steps(x, steps, groups, log, phase).wait()


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t``, copied when it is a slice of a larger storage (a sliced gradient would keep the whole
    one alive, as long as the gradient is kept: until the optimizer step for a parameter)."""
    if t.untyped_storage().nbytes() > t.numel() * t.element_size():
        return t.clone()
    return t


def _owned(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``out``, copied if it aliases ``x``: a custom Function's view output cannot be modified in place.

    Storages are compared by identity, not data pointer, so fake tensors (no data) are judged alike.
    """
    if StorageWeakRef(out.untyped_storage()) == StorageWeakRef(x.untyped_storage()):
        return out.clone()
    return out


class _Reshard(torch.autograd.Function):
    """Forward: the plan's reshard steps (or a reshard issued ahead, waited here); backward: the
    plan's gradient steps (or handed to ``reduce``, which runs them in flight)."""

    @staticmethod
    def forward(ctx, x, fwd_steps, bwd_steps, groups, log, phase, ready, reduce):  # type: ignore[override]
        ctx.bwd_steps, ctx.groups, ctx.log, ctx.reduce = bwd_steps, groups, log, reduce
        if ready is not None:
            return _owned(ready.wait(), x)
        if not fwd_steps:  # only the gradient is resharded: pass the value on without a copy
            return x.view_as(x)
        return _owned(run_steps(x, fwd_steps, groups, log, phase), x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        rest = (None,) * 7
        if not ctx.needs_input_grad[0]:
            return (None, *rest)
        if ctx.reduce is not None:
            ctx.reduce(grad)
            return (None, *rest)
        return (_compact(run_steps(grad, ctx.bwd_steps, ctx.groups, ctx.log, BACKWARD)), *rest)


def reshard(
    x: torch.Tensor,
    fwd_steps: tuple[Step, ...] | list[Step],
    bwd_steps: tuple[Step, ...] | list[Step],
    groups: MeshGroups,
    log: CommLog | None = None,
    phase: str = FORWARD,
    ready: Pending | None = None,
    reduce: Callable[[torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """Reshard ``x`` by ``fwd_steps``; in backward, turn the incoming gradient by ``bwd_steps``.

    ``bwd_steps`` go from the gradient's layout at the consumer to the layout the producer
    expects (``EdgeReshard.grad_steps``). Every rank must call this with the same steps.
    ``phase`` names the pass the forward steps are logged in (a recomputation's are not the forward's).
    ``ready``: the forward steps were issued ahead (:func:`start_steps`, logged then); this waits
    for them. ``reduce``: takes the gradient instead of autograd (which then gets none for ``x``)
    and delivers it itself, reduced by ``bwd_steps`` (``runtime/overlap.py``).
    """
    return _Reshard.apply(x, tuple(fwd_steps), tuple(bwd_steps), groups, log, phase, ready, reduce)


class _Zeros(torch.autograd.Function):
    """Zeros of x's shape; backward zeros (``mask_grad``) or the gradient passed through."""

    @staticmethod
    def forward(ctx, x, mask_grad):  # type: ignore[override]
        ctx.mask_grad = mask_grad
        return torch.zeros_like(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return (torch.zeros_like(grad) if ctx.mask_grad else grad), None


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
    if all(groups.coords[a] == 0 for a in axes):
        return x
    return _Zeros.apply(x, mask_grad)
