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

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.tensor import DTensor
from torch.utils import _pytree as pytree

from autoshard.errors import AutoshardError
from autoshard.frontend.graph import OpGraph
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


def measure_peak(model: torch.nn.Module, inputs: Sequence[torch.Tensor], plan: Plan, graph: OpGraph,
                 mode: FakeTensorMode, rank: int = 0, steps: int = 2) -> MeasuredPeak:
    """Peak memory of rank ``rank`` running ``plan`` (training: forward, backward, AdamW step).

    ``model`` and ``inputs`` must be fake tensors of ``mode`` (build the model inside it) and
    ``graph`` its trace. A training plan's step ends in ``loss.backward()`` and an AdamW step.
    """
    if dist.is_initialized():
        raise AutoshardError("measure_peak creates its own fake process group: call it outside torch.distributed")
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=plan.mesh.size)
    try:
        groups = MeshGroups.create(plan.mesh)  # the DeviceMesh is built from real tensors
        with mode:
            parallel = parallelize(model, plan, groups, graph=graph)
            training = plan.mode == "training"
            params = [p for p in parallel.parameters() if p.requires_grad]
            pieces = [_local(p).detach() for p in params]
            # foreach: the multi-tensor step CUDA uses by default (CPU would default to one tensor at a time)
            optimizer = torch.optim.AdamW(pieces, lr=1e-4, foreach=True) if training else None
            tracker = MemTracker()
            _skip_grad_hooks(tracker, [p for p in parallel.parameters() if not p.requires_grad])
            tracker.track_external(parallel, *inputs, *([optimizer] if optimizer else []))
            with tracker:
                for step in range(steps if training else 1):
                    if step:
                        tracker.reset_mod_stats()
                    outputs = parallel(*inputs)
                    if training:
                        _scalar_loss(outputs).backward()
                        for param, piece in zip(params, pieces):
                            piece.grad = None if param.grad is None else _local(param.grad)
                        optimizer.step()
                        parallel.zero_grad()
                        optimizer.zero_grad()
                    del outputs
            peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    finally:
        dist.destroy_process_group()
    by_category = {str(getattr(k, "value", k)): int(v) for k, v in peak.items() if k != "Total"}
    return MeasuredPeak(int(peak["Total"]), by_category)
