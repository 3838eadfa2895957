"""Measure a plan's real training step without allocating: PyTorch's MemTracker on fake tensors.

The step is the executor's own (``parallelize``), run as one rank of a fake process group of the
plan's world size (``torch.distributed``'s "fake" backend: collectives return at once) under
``FakeTensorMode``, so a LLaMA-3-8B step costs seconds and no memory. Fake CPU tensors take the
same kernels' memory paths as a GPU where it matters (fused attention keeps its log-sum-exp).
``torch.distributed._tools.mem_tracker.MemTracker`` attributes every storage to parameters,
buffers, gradients, activations, temporaries, optimizer state or other (the inputs), and reports
the peak. As PyTorch's own docs advise, the steady state is the second step: after the first
optimizer step the AdamW moments exist, and ``reset_mod_stats()`` forgets the first step's peak.
The AdamW step runs on the parameters' local pieces: on real tensors DTensor's step allocates the
same (checked), while under FakeTensorMode its multi-tensor step allocates 2-3x more, an artifact
of fake dispatch that no device would see.

This is the memory truth the cost model (``cost/memory.py``) is checked against: by
``benchmarks/fidelity.py`` and the tests.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.tensor import DTensor
from torch.utils import _pytree as pytree

from autoshard.errors import AutoshardError
from autoshard.frontend.graph import OpGraph
from autoshard.pipeline.schedules import Action
from autoshard.problem.plan import Plan
from autoshard.runtime.executor import parallelize
from autoshard.runtime.groups import MeshGroups


@dataclass(frozen=True)
class MeasuredPeak:
    """Peak bytes of one rank's step, in total and by MemTracker's categories (``Parameter`` ...)."""

    total: int
    by_category: dict[str, int]


def _scalar_loss(outputs: object) -> torch.Tensor:
    """The step's loss: the graph's (first) output, which must be a scalar."""
    first = pytree.tree_leaves(outputs)[0]
    if first.numel() != 1:
        raise AutoshardError(f"the model's first output has shape {list(first.shape)}, not a scalar loss: "
                             "measure a model that returns its loss (wrap it with its loss function)")
    return first.sum()


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a DTensor (a plain tensor sharing its storage), or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


class _NoHook:
    """A removable hook handle that removes nothing."""

    def remove(self) -> None:
        """Nothing was registered."""


def _skip_grad_hooks(tracker: MemTracker, frozen: Sequence[torch.Tensor]) -> None:
    """Keep MemTracker from hooking the gradients of ``frozen`` parameters: it hooks every
    parameter it tracks, and registering a hook on a tensor that does not require grad raises.
    A parameter already in its table of hook handles is not hooked again."""
    for param in frozen:
        tracker._param_to_grad_hook_handles[param] = (_NoHook(), _NoHook())


class _TrackedStep:
    """One rank of a fake process group of the plan's world running its plan under MemTracker:
    the parallel module, AdamW on its parameters' local pieces, and the peak once done."""

    def __init__(self, model: torch.nn.Module, plan: Plan, graph: OpGraph, mode: FakeTensorMode,
                 inputs: Sequence[torch.Tensor]) -> None:
        groups = MeshGroups.create(plan.mesh)  # the DeviceMesh is built from real tensors
        with mode:
            self.module = parallelize(model, plan, groups, graph=graph)
            self.params = [p for p in self.module.parameters() if p.requires_grad]
            self.pieces = [_local(p).detach() for p in self.params]
            # foreach: the multi-tensor step CUDA uses by default (CPU would default to one tensor at a time)
            self.optimizer = torch.optim.AdamW(self.pieces, lr=1e-4, foreach=True) if plan.mode == "training" else None
            self.tracker = MemTracker()
            _skip_grad_hooks(self.tracker, [p for p in self.module.parameters() if not p.requires_grad])
            self.tracker.track_external(self.module, *inputs, *([self.optimizer] if self.optimizer else []))

    def optimizer_step(self) -> None:
        """AdamW on the local pieces of the accumulated gradients, then every gradient dropped."""
        for param, piece in zip(self.params, self.pieces):
            piece.grad = None if param.grad is None else _local(param.grad)
        self.optimizer.step()
        self.module.zero_grad()
        self.optimizer.zero_grad()

    def peak(self) -> MeasuredPeak:
        """The tracked peak, in total and by category."""
        peak = next(iter(self.tracker.get_tracker_snapshot("peak").values()))
        by_category = {str(getattr(k, "value", k)): int(v) for k, v in peak.items() if k != "Total"}
        return MeasuredPeak(int(peak["Total"]), by_category)


@contextmanager
def _fake_world(plan: Plan, rank: int) -> Iterator[None]:
    """A fake process group of the plan's world size (collectives return at once)."""
    if dist.is_initialized():
        raise AutoshardError("measuring creates its own fake process group: call it outside torch.distributed")
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=plan.mesh.size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def measure_peak(model: torch.nn.Module, inputs: Sequence[torch.Tensor], plan: Plan, graph: OpGraph,
                 mode: FakeTensorMode, rank: int = 0, steps: int = 2) -> MeasuredPeak:
    """Peak memory of rank ``rank`` running ``plan`` (training: forward, backward, AdamW step).

    ``model`` and ``inputs`` must be fake tensors of ``mode`` (build the model inside it) and
    ``graph`` its trace. A training plan's step ends in ``loss.backward()`` and an AdamW step.
    """
    with _fake_world(plan, rank):
        run = _TrackedStep(model, plan, graph, mode, inputs)
        training = plan.mode == "training"
        with mode, run.tracker:
            for step in range(steps if training else 1):
                if step:
                    run.tracker.reset_mod_stats()
                outputs = run.module(*inputs)
                if training:
                    _scalar_loss(outputs).backward()
                    run.optimizer_step()
                del outputs
        return run.peak()


def measure_stage_peak(model: torch.nn.Module, graph: OpGraph, plan: Plan, feeds: Sequence[Sequence[torch.Tensor]],
                       order: Sequence[Action], mode: FakeTensorMode, steps: int = 2) -> MeasuredPeak:
    """Peak memory of a pipeline stage's first rank running its actions in ``order`` (one device of
    ``pipeline/schedules.device_orders``): ``feeds[i]`` are microbatch ``i``'s positional inputs
    of the stage graph (received tensors as fake local pieces that require grad where they carry
    one); a backward starts from the loss on the last stage, else from gradients of ones for what
    the stage sends. Gradients accumulate over the microbatches; then the AdamW step, as above."""
    with _fake_world(plan, 0):
        run = _TrackedStep(model, plan, graph, mode, [t for feed in feeds for t in feed])
        with mode, run.tracker:
            for step in range(steps):
                if step:
                    run.tracker.reset_mod_stats()
                held: dict[int, list[torch.Tensor]] = {}
                for action in order:
                    if action.kind == "F":  # unhooked: MemTracker takes one call per module and step
                        out = run.module.forward(*feeds[action.microbatch])
                        held[action.microbatch] = list(out) if isinstance(out, tuple) else [out]
                    else:
                        outputs = held.pop(action.microbatch)
                        grads = [None if o.numel() == 1 else torch.ones_like(o) for o in outputs]
                        torch.autograd.backward(outputs, grads)
                        del outputs, grads
                run.optimizer_step()
        return run.peak()
