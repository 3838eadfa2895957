"""Measure what every traced op costs, by asking torch itself (``OpNode.work``).

Each op node's recorded call is replayed once at its global shapes, on tensors that hold no data:

- on the **meta device** under ``torch.utils.flop_counter.FlopCounterMode``: the forward flops,
  then the flops of the gradients of the operands that require grad (``autograd.grad``), so
  attention, strided and grouped convolutions and matmuls are counted by torch's own formulas;
- on **fake CPU tensors** (``FakeTensorMode``) with ``torch.autograd.graph.saved_tensors_hooks``:
  which operands and whether the output autograd saves for backward, and the bytes of the other
  tensors it saves (a norm's statistics, attention's log-sum-exp, cross-entropy's log-softmax).
  Fake CPU tensors take the fused attention path that saves only the log-sum-exp, as a GPU does;
  the meta device would materialise the score matrices. Ops a GPU runs fused where the CPU
  decomposes them (``rms_norm``) are measured as the GPU's kernel (``frontend/fused.py``);
- the same fake run, without autograd, also gives the output's aliasing (a view shares an
  operand's storage) and the largest amount of memory the op allocates and frees before it
  returns (its temporaries).

Every operand is replayed with the strides its producer's replay gave it, so a reshape of an
expanded tensor is a copy and one of fused attention's transposed output a view, as on a GPU
(the trace's meta tensors lay attention's output out otherwise).

Identical nodes (the layers of a transformer) are measured once. An op that cannot be replayed
without real data (data-dependent shapes) gets ``OpWork(measured=False)``.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from autoshard.frontend.call import NODE_CALLS_KEY, NodeCall
from autoshard.frontend.experts import register_grouped_mm_flops
from autoshard.frontend.fused import as_on_gpu
from autoshard.frontend.graph import NodeKind, OpGraph, OpNode, OpWork, TensorMeta

Strides = tuple[int, ...] | None
"""A tensor's strides in the profile's replay; None for a contiguous one."""

UNMEASURED = OpWork(measured=False)
ELEMENT = OpWork(alias_of=0)
"""An element of a tuple result lives in its producer's storage."""


def profile_graph(graph: OpGraph) -> None:
    """Fill ``work`` of every op node of ``graph`` (identical nodes are measured once)."""
    register_grouped_mm_flops()
    calls: dict[str, NodeCall] = graph.module.meta[NODE_CALLS_KEY]
    cache: dict[Any, tuple[OpWork, Strides]] = {}
    strides: dict[str, Strides] = {}
    fake = FakeTensorMode(allow_non_fake_inputs=False)
    for node in graph:
        if node.kind != NodeKind.OP:
            continue
        operands = [graph[src].out for src in node.inputs]
        if node.op == "getitem":
            node.work = ELEMENT
            continue
        if not all(isinstance(m, TensorMeta) for m in operands):
            node.work = UNMEASURED
            continue
        grads = tuple(graph[src].requires_grad and m.is_float and k not in node.no_grad_operands
                      for k, (src, m) in enumerate(zip(node.inputs, operands)))
        layouts = tuple(strides.get(src) for src in node.inputs)
        call = calls[node.name]
        key = (repr(call.target), repr(call.args), repr(sorted(call.kwargs.items())), tuple(operands), layouts,
               grads, call.grad_enabled)
        if key not in cache:
            cache[key] = measure_call(call, operands, grads, fake, layouts)
        node.work, strides[node.name] = cache[key]


class LocalFlops:
    """Torch's flop counts of one op run on one device's pieces: (forward, backward) for an op node
    and the local shapes of its operands, counted on the meta device and cached.

    Most formulas are products of index sizes, so a strategy of degree n runs 1/n of the global
    flops, but not all: attention's two matmuls share the sequence indices, not the head dims, so
    cutting the value head dim halves only one of them. Counting the local shapes is exact.
    """

    def __init__(self, graph: OpGraph) -> None:
        self.graph = graph
        self.calls: dict[str, NodeCall] = graph.module.meta[NODE_CALLS_KEY]
        self.cache: dict[Any, tuple[int, int]] = {}

    def __call__(self, node: OpNode, shapes: Sequence[tuple[int, ...]]) -> tuple[int, int]:
        """(forward, backward) flops of ``node`` on operands of the given local shapes."""
        operands = [self.graph[src].out for src in node.inputs]
        metas = [TensorMeta(tuple(shape), m.dtype, m.itemsize) for shape, m in zip(shapes, operands)]
        grads = tuple(self.graph[src].requires_grad and m.is_float and k not in node.no_grad_operands
                      for k, (src, m) in enumerate(zip(node.inputs, operands)))
        call = self.calls[node.name]
        key = (repr(call.target), repr(call.args), repr(sorted(call.kwargs.items())), tuple(metas), grads)
        if key not in self.cache:
            try:
                self.cache[key] = _count_flops(call, metas, grads)
            except Exception:  # noqa: BLE001 - a local shape torch rejects: fall back to an even split
                self.cache[key] = (-1, -1)
        return self.cache[key]


def measure_call(call: NodeCall, operands: Sequence[TensorMeta], grads: Sequence[bool],
                 fake: FakeTensorMode, layouts: Sequence[Strides]) -> tuple[OpWork, Strides]:
    """The OpWork of one call on operands of the given metas and strides (``grads[k]``: operand k
    requires grad), and the strides of its output."""
    try:
        flops, backward_flops = _count_flops(call, operands, grads)
        on_gpu = as_on_gpu(call)
        saved, saves_output, other, backward_temporary = _saved_tensors(on_gpu, operands, grads, fake, layouts)
        alias_of, temporary, out_strides = _allocations(on_gpu, operands, fake, layouts)
    except Exception:  # noqa: BLE001 - any op torch cannot replay without data is simply unmeasured
        return UNMEASURED, None
    return OpWork(flops, backward_flops, saved, saves_output, other, alias_of, temporary, backward_temporary), \
        out_strides


def _dtype(meta: TensorMeta) -> torch.dtype:
    return getattr(torch, meta.dtype)


def _empty(meta: TensorMeta, requires_grad: bool, device: str | None = None, strides: Strides = None) -> torch.Tensor:
    """An uninitialised tensor of ``meta`` laid out by ``strides`` (zeros for integer and bool
    tensors: valid indices)."""
    dtype = _dtype(meta)
    if dtype.is_floating_point or dtype.is_complex:
        if strides is not None:
            return torch.empty_strided(meta.shape, strides, dtype=dtype, device=device).requires_grad_(requires_grad)
        return torch.empty(meta.shape, dtype=dtype, device=device).requires_grad_(requires_grad)
    return torch.zeros(meta.shape, dtype=dtype, device=device)


def _strides(value: Any) -> Strides:
    """The strides of a single tensor result that is not contiguous (else None)."""
    return tuple(value.stride()) if isinstance(value, torch.Tensor) and not value.is_contiguous() else None


def _float_outputs(result: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(result)
            if isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())]


def _count_flops(call: NodeCall, operands: Sequence[TensorMeta], grads: Sequence[bool]) -> tuple[int, int]:
    """Forward flops, and flops of the operand gradients, by FlopCounterMode on the meta device."""
    inputs = [_empty(m, g, "meta") for m, g in zip(operands, grads)]
    on_meta = {"device": torch.device("meta")} if call.slots.get("device") is not None else {}
    with FlopCounterMode(display=False) as forward:
        result = call(inputs, on_meta)
    wanted = [t for t, g in zip(inputs, grads) if g]
    outputs = _float_outputs(result)
    if not wanted or not outputs:
        return forward.get_total_flops(), 0
    with FlopCounterMode(display=False) as backward:
        torch.autograd.grad(outputs, wanted, [torch.ones_like(o) for o in outputs], allow_unused=True)
    return forward.get_total_flops(), backward.get_total_flops()


def _storage(t: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(t.untyped_storage())


def _saved_tensors(call: NodeCall, operands: Sequence[TensorMeta], grads: Sequence[bool],
                   fake: FakeTensorMode, layouts: Sequence[Strides]) -> tuple[tuple[int, ...], bool, int, int]:
    """(operands saved for backward, whether the output is saved, bytes of the other saved tensors,
    peak bytes the backward allocates beyond the operand gradients it returns)."""
    if not any(grads):
        return (), False, 0, 0
    saved: dict[StorageWeakRef, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.setdefault(_storage(t), t.untyped_storage().nbytes())
        return t

    with fake:
        inputs = [_empty(m, g, strides=layout) for m, g, layout in zip(operands, grads, layouts)]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            result = call(inputs, {})
        outputs = {_storage(t) for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)}
        by_input = {_storage(t): k for k, t in enumerate(inputs)}
        backward_temporary = _backward_temporary(result, [t for t, g in zip(inputs, grads) if g],
                                                 set(saved) | set(by_input) | outputs)
    operand_hits = tuple(sorted({by_input[s] for s in saved if s in by_input}))
    saves_output = any(s in outputs and s not in by_input for s in saved)
    other = sum(n for s, n in saved.items() if s not in by_input and s not in outputs)
    return operand_hits, saves_output, other, backward_temporary


def _backward_temporary(result: Any, wanted: list[torch.Tensor], existing: set[StorageWeakRef]) -> int:
    """Peak bytes allocated by the backward of ``result`` beyond the gradients it returns
    (``existing``: the storages alive before it, which it only reads)."""
    outputs = _float_outputs(result)
    if not outputs:
        return 0
    seeds = [torch.ones_like(o) for o in outputs]
    tracker = _LiveBytes(existing)
    with tracker:
        found = torch.autograd.grad(outputs, wanted, seeds, allow_unused=True)
    returned = {_storage(g): g.untyped_storage().nbytes() for g in found if g is not None}
    return max(0, tracker.peak - sum(returned.values()))


class _LiveBytes(TorchDispatchMode):
    """Tracks the bytes of storages created inside the mode that are still alive, and their peak."""

    def __init__(self, existing: set[StorageWeakRef]) -> None:
        super().__init__()
        self.existing = existing
        self.live: dict[StorageWeakRef, int] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        result = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(result):
            if isinstance(t, torch.Tensor) and _storage(t) not in self.existing:
                self.live.setdefault(_storage(t), t.untyped_storage().nbytes())
        self.live = {s: n for s, n in self.live.items() if not s.expired()}
        self.peak = max(self.peak, sum(self.live.values()))
        return result


def _allocations(call: NodeCall, operands: Sequence[TensorMeta], fake: FakeTensorMode,
                 layouts: Sequence[Strides]) -> tuple[int | None, int, Strides]:
    """(operand whose storage the output shares, peak bytes allocated beyond what the op returns,
    the output's strides)."""
    with fake:
        inputs = [_empty(m, False, strides=layout) for m, layout in zip(operands, layouts)]
        by_input = {_storage(t): k for k, t in enumerate(inputs)}
        tracker = _LiveBytes(set(by_input))
        with torch.no_grad(), tracker:
            result = call(inputs, {})
        leaves = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
        alias_of = by_input.get(_storage(leaves[0])) if len(leaves) == 1 else None
        returned = {_storage(t): t.untyped_storage().nbytes() for t in leaves}
        kept = sum(n for s, n in returned.items() if s not in by_input)
    return alias_of, max(0, tracker.peak - kept), _strides(result)
