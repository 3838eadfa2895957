"""Slapo-compatible schedule primitives, so printed schedule lines run as written.

    sch = create_schedule(model)            # 1-D: the world, or a given process group
    sch["fc1"].shard("weight", axis=0)      # keep this rank's slice of a parameter or buffer
    sch["fc1"].sync(mode="bwd_post", sync_op_or_fn="all_reduce")
    sch["fc2"].sync(mode="fwd_post", sync_op_or_fn="SR->RR")

``sync`` hooks a module's first positional input (``fwd_pre``), its output (``fwd_post``; the
first element of a tuple output) or its input's gradient (``bwd_post``, a forward identity).
Every sync is a forward reshard and a backward reshard of the gradient (1-D mesh, ``P`` =
partial sum), all under autograd:

=====================  =====================  ======================================
op                     forward                backward (gradient)
=====================  =====================  ======================================
all_reduce             P -> R  (Megatron g)   identity
bwd_post all_reduce    identity               P -> R  (Megatron f)
all_gather, axis=d     S(d) -> R              P -> S(d) reduce-scatter (Slapo's default;
                                              ``tensor_parallel_output_grad=False``: R -> S(d))
reduce_scatter, axis=d P -> S(d)              S(d) -> R  all-gather
scatter, axis=d        R -> S(d)              S(d) -> R  all-gather
"XX->YY"               X -> Y                 Y -> X  (slice <-> all-gather, all-to-all back)
=====================  =====================  ======================================

A resharding string has one R/S letter per dim: two letters name the last two dims (Slapo's
convention), otherwise one letter per tensor dim. Unlike Slapo, sharding an ``nn.Linear``
weight on axis 1 (its output becomes a partial sum) also makes the unsharded bias count once:
it is added on rank 0 only, and gets the full gradient on every rank, as in Megatron's
row-parallel layer, where the bias is added after the all-reduce.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from autoshard.errors import AutoshardError
from autoshard.sharding.reshard import reshard_steps
from autoshard.runtime.collectives import CommLog, mask_to_first, reshard
from autoshard.runtime.groups import MeshGroups
from autoshard.sharding.spec import TensorSpec

MODES = ("fwd_pre", "fwd_post", "bwd_post")
NAMED_OPS = ("all_reduce", "all_gather", "reduce_scatter", "scatter")
_RESHARD = re.compile(r"^([RS]+)->([RS]+)$")

# (forward src, forward dst, gradient src, gradient dst) for a tensor of ndim dims.
Layouts = tuple[TensorSpec, TensorSpec, TensorSpec, TensorSpec]


@dataclass
class _Context:
    """What every sub-schedule of one model shares."""

    groups: MeshGroups
    log: CommLog | None
    sharded: dict[str, int] = field(default_factory=dict)


_replicated = TensorSpec.replicated


def _partial(ndim: int) -> TensorSpec:
    return TensorSpec(((),) * ndim, frozenset({0}))


def _sharded(ndim: int, dim: int) -> TensorSpec:
    return TensorSpec(tuple((0,) if d == dim else () for d in range(ndim)))


def _letters(letters: str, ndim: int, where: str, text: str) -> TensorSpec:
    if len(letters) != ndim and not (len(letters) == 2 and ndim > 2):
        raise AutoshardError(f"{where}: {text!r} has {len(letters)} letters but the tensor has {ndim} dims: "
                             f"write 2 (the last two dims) or {ndim}")
    start = ndim - len(letters)
    return TensorSpec(tuple((0,) if d >= start and letters[d - start] == "S" else () for d in range(ndim)))


def _parse_reshard(text: str, where: str) -> tuple[str, str]:
    match = _RESHARD.match(text.replace(" ", ""))
    if match is None:
        raise AutoshardError(f"{where}: {text!r} is not a sync op ({', '.join(NAMED_OPS)}) "
                             f"or a resharding string of R/S letters such as \"RR->SR\"")
    src, dst = match.groups()
    if len(src) != len(dst):
        raise AutoshardError(f"{where}: {text!r} has {len(src)} letters before '->' and {len(dst)} after: give one per dim on both sides")
    if src.count("S") > 1 or dst.count("S") > 1:
        raise AutoshardError(f"{where}: {text!r} shards two dims over one device group: use at most one S per side")
    return src, dst


def _layout_rule(mode: str, op: str, axis: int | None, gather_grad_partial: bool, where: str) -> Callable[[int], Layouts]:
    """Validate a named op or resharding string now; return ndim -> its four layouts."""
    if mode == "bwd_post" and op != "all_reduce":
        raise AutoshardError(f"{where}: mode bwd_post supports only sync_op_or_fn=\"all_reduce\", not {op!r}")
    if op == "all_reduce":
        if axis is not None:
            raise AutoshardError(f"{where}: all_reduce takes no axis: drop axis={axis}")
        if mode == "bwd_post":
            return lambda nd: (_replicated(nd), _replicated(nd), _partial(nd), _replicated(nd))
        return lambda nd: (_partial(nd), _replicated(nd), _replicated(nd), _replicated(nd))
    if op in NAMED_OPS:
        if axis is None:
            raise AutoshardError(f"{where}: {op} needs axis=<tensor dim to {'gather' if op == 'all_gather' else 'scatter'}>")

        def rule(nd: int) -> Layouts:
            if not -nd <= axis < nd:
                raise AutoshardError(f"{where}: axis={axis} is out of range for a {nd}-dim tensor")
            s = _sharded(nd, axis % nd)
            if op == "all_gather":
                return s, _replicated(nd), (_partial(nd) if gather_grad_partial else _replicated(nd)), s
            if op == "reduce_scatter":
                return _partial(nd), s, s, _replicated(nd)
            return _replicated(nd), s, s, _replicated(nd)

        return rule
    if axis is not None:
        raise AutoshardError(f"{where}: a resharding string takes no axis: drop axis={axis}")
    src, dst = _parse_reshard(op, where)

    def reshard_rule(nd: int) -> Layouts:
        s, d = _letters(src, nd, where, op), _letters(dst, nd, where, op)
        return s, d, d, s

    return reshard_rule


def _linear_partial_forward(mod: nn.Linear, groups: MeshGroups, x: torch.Tensor) -> torch.Tensor:
    """Row-parallel Linear: the output is a partial sum, so the replicated bias is added once (rank 0)."""
    out = F.linear(x, mod.weight)
    if mod.bias is None:
        return out
    return out + mask_to_first(mod.bias, (0,), groups, mask_grad=False)


class Schedule:
    """One module of the model, sharded over a 1-D device group; ``sch["a.b"]`` is a submodule's."""

    def __init__(self, mod: nn.Module, path: str, ctx: _Context) -> None:
        self.mod = mod
        self.path = path
        self._ctx = ctx

    @property
    def module(self) -> nn.Module:
        """The module this schedule edits (the whole model for the root), modified in place."""
        return self.mod

    @property
    def world_size(self) -> int:
        """Number of ranks the model is sharded over."""
        return self._ctx.groups.axis_size(0)

    @property
    def rank(self) -> int:
        """This rank's index in the device group."""
        return self._ctx.groups.coords[0]

    @property
    def group(self) -> dist.ProcessGroup | None:
        """The process group collectives run in (None on a single device)."""
        return self._ctx.groups.groups[0]

    @property
    def sharded_tensors(self) -> dict[str, int]:
        """Every tensor sharded so far in this model, by full dotted name, with its axis."""
        return dict(self._ctx.sharded)

    def _where(self) -> str:
        return f'sch["{self.path}"]' if self.path else "sch"

    def __getitem__(self, path: str) -> "Schedule":
        mod, walked = self.mod, [self.path] if self.path else []
        for part in path.split(".") if path else []:
            children = dict(mod.named_children())
            if part not in children:
                owner = ".".join(walked) or "the model"
                raise AutoshardError(f'sch["{path}"]: {owner} has no submodule {part!r}; it has: '
                                     f"{', '.join(children) or 'no submodules'}")
            mod = children[part]
            walked.append(part)
        return Schedule(mod, ".".join(walked), self._ctx)

    def shard(self, tensor_name: str, axis: int) -> None:
        """Replace a parameter or buffer of this module by this rank's slice along ``axis``."""
        params = dict(self.mod.named_parameters(recurse=False))
        buffers = dict(self.mod.named_buffers(recurse=False))
        tensor = params.get(tensor_name, buffers.get(tensor_name))
        full = ".".join(p for p in (self.path, tensor_name) if p)
        if tensor is None:
            raise AutoshardError(f"{self._where()}.shard: {type(self.mod).__name__} has no parameter or buffer "
                                 f"{tensor_name!r}; it has: {', '.join([*params, *buffers]) or 'none'}")
        if full in self._ctx.sharded:
            raise AutoshardError(f"{self._where()}.shard: {full} is already sharded along axis {self._ctx.sharded[full]}")
        if not -tensor.ndim <= axis < tensor.ndim:
            raise AutoshardError(f"{self._where()}.shard: axis={axis} is out of range for {full} of shape {tuple(tensor.shape)}")
        axis %= tensor.ndim
        size, n = tensor.shape[axis], self.world_size
        if size % n:
            raise AutoshardError(f"{self._where()}.shard: cannot shard {full} of {type(self.mod).__name__} along axis "
                                 f"{axis}: size {size} is not divisible by world size {n}")
        k = size // n
        piece = tensor.detach().narrow(axis, self.rank * k, k).clone()
        if tensor_name in params:
            self.mod.register_parameter(tensor_name, nn.Parameter(piece, requires_grad=tensor.requires_grad))
        else:
            persistent = tensor_name not in self.mod._non_persistent_buffers_set
            self.mod.register_buffer(tensor_name, piece, persistent=persistent)
        self._ctx.sharded[full] = axis
        if isinstance(self.mod, nn.Linear):
            self.mod.out_features, self.mod.in_features = self.mod.weight.shape
            if tensor_name == "weight" and axis == 1:
                self.mod.forward = functools.partial(_linear_partial_forward, self.mod, self._ctx.groups)

    def sync(
        self,
        mode: str,
        sync_op_or_fn: str | Callable[..., Any],
        axis: int | None = None,
        tensor_parallel_output_grad: bool = True,
    ) -> None:
        """Hook a reshard on this module's input, output or input gradient (see the module docstring).

        A callable ``sync_op_or_fn`` is registered as the hook itself, as Slapo does.
        """
        where = f"{self._where()}.sync"
        if mode not in MODES:
            raise AutoshardError(f"{where}: unknown mode {mode!r}: use {', '.join(MODES)}")
        if callable(sync_op_or_fn):
            register = {"fwd_pre": self.mod.register_forward_pre_hook, "fwd_post": self.mod.register_forward_hook,
                        "bwd_post": self.mod.register_full_backward_hook}[mode]
            register(sync_op_or_fn)
            return
        if not isinstance(sync_op_or_fn, str):
            raise AutoshardError(f"{where}: sync_op_or_fn must be an op name, a resharding string or a function")
        rule = _layout_rule(mode, sync_op_or_fn, axis, tensor_parallel_output_grad, where)
        where = f"{where}(mode={mode!r}, sync_op_or_fn={sync_op_or_fn!r})"
        apply = functools.partial(self._apply, rule=rule, where=where)
        if mode == "fwd_post":
            self.mod.register_forward_hook(lambda _mod, _args, out: _on_first(out, apply, where))
        else:
            self.mod.register_forward_pre_hook(lambda _mod, args: _on_first(args, apply, where))

    def _apply(self, x: Any, rule: Callable[[int], Layouts], where: str) -> torch.Tensor:
        """Run one sync on a local tensor: layouts for its rank, then the autograd reshard."""
        if not isinstance(x, torch.Tensor):
            raise AutoshardError(f"{where}: expects a tensor, got {type(x).__name__}")
        src, dst, grad_src, grad_dst = rule(x.ndim)
        mesh = self._ctx.groups.mesh.shape
        shape = tuple(n * src.shard_factor(d, mesh) for d, n in enumerate(x.shape))
        for d, n in enumerate(shape):
            if n % max(spec.shard_factor(d, mesh) for spec in (dst, grad_src, grad_dst)):
                raise AutoshardError(f"{where}: dim {d} of size {n} is not divisible by world size {self.world_size}")
        fwd = reshard_steps(src, dst, shape, x.element_size(), mesh)
        bwd = reshard_steps(grad_src, grad_dst, shape, x.element_size(), mesh)
        return reshard(x, fwd, bwd, self._ctx.groups, self._ctx.log)


def _on_first(values: Any, apply: Callable[[Any], torch.Tensor], where: str) -> Any:
    """Apply a sync to a tensor, or to the first element of a tuple/list (hook inputs and outputs)."""
    if not isinstance(values, (tuple, list)):
        return apply(values)
    if not values:
        raise AutoshardError(f"{where}: there is no positional input or output to sync")
    items = [apply(values[0]), *values[1:]]
    return items if isinstance(values, list) else tuple(items)


def create_schedule(
    model: nn.Module,
    world_size: int | None = None,
    rank: int | None = None,
    group: dist.ProcessGroup | None = None,
    log: CommLog | None = None,
) -> Schedule:
    """A schedule of ``model`` over ``group`` (default: the world; a single device if not distributed).

    ``world_size``/``rank``, when given, must agree with the group. ``log`` records every
    collective the syncs execute.
    """
    if dist.is_available() and dist.is_initialized():
        groups = MeshGroups.from_group(group)
    elif group is not None or (world_size or 1) > 1:
        raise AutoshardError("torch.distributed is not initialized: call torch.distributed.init_process_group "
                             "before create_schedule for more than one rank")
    else:
        groups = MeshGroups.single()
    n, r = groups.axis_size(0), groups.coords[0]
    if world_size not in (None, n) or rank not in (None, r):
        raise AutoshardError(f"create_schedule(world_size={world_size}, rank={rank}) disagrees with the process group "
                             f"(world size {n}, rank {r}): drop them or pass the matching group")
    return Schedule(model, "", _Context(groups, log))
