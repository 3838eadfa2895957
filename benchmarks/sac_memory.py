"""Predicted against measured peak memory of a training step under activation checkpointing.

    .venv/bin/python benchmarks/sac_memory.py      (about a minute on one CPU core)

A small torchtitan LLaMA-3 (``titan_llama.py``, bf16) is costed by autoshard on one device
(training, ``precision="as-is"``, ``torchtitan_choice``: every layer recomputed) under
``recompute="selective"`` (torchtitan's op policy), under ``"full"``, and with every layer kept.
The same model then runs two training steps (forward, ``loss.backward()``, AdamW with
``foreach``) on fake CPU tensors under PyTorch's ``MemTracker``, as ``autoshard/runtime/measure.py``
does, its RMSNorms as CUDA's fused kernel (``autoshard/frontend/fused.py``: the CPU path
decomposes them and keeps two fp32 copies of the input that no GPU keeps; an H100's peaks by
``gpu_recompute.py`` agree with the fused kernel's), each block under non-reentrant
``torch.utils.checkpoint``: with torchtitan's selective policy (``MUST_SAVE`` fused attention
and the 1st, 3rd, ... ``aten.mm`` of each block, the rest ``PREFER_RECOMPUTE``), with full
checkpointing, or not at all; the second step's peak is the measurement. Printed: both peaks; what one block holds for backward (predicted: its ops' outputs
and saved tensors at the first backward slot; measured: the growth of the activations from one
block's forward to the next's); each peak broken down (autoshard's ``memory_at`` its peak slot,
MemTracker's categories); and the ops the selective policy saved.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _ModState
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from titan_llama import Transformer  # noqa: E402

from autoshard.api import build_model_problem  # noqa: E402
from autoshard.frontend.fused import fused_rms_norm  # noqa: E402
from autoshard.frontend.trace import trace  # noqa: E402
from autoshard.problem.baselines.torchtitan import torchtitan_choice  # noqa: E402
from autoshard.problem.build import ModelProblem  # noqa: E402

SHAPE = dict(layers=12, dim=1024, heads=8, kv_heads=2, hidden=3584, vocab=8192, seq=2048)
BATCH = 4
DTYPE = torch.bfloat16
POLICIES = ("none", "selective", "full")
GIB, MIB = 2**30, 2**20
BLOCK = re.compile(r"layers\.\d+(\.|$)")
HELD = ("activation", "saved for backward")
"""autoshard's items for what an op's forward leaves for its backward (``cost/memory.py``)."""
aten = torch.ops.aten
ATTENTION = frozenset({aten._scaled_dot_product_flash_attention.default,
                       aten._scaled_dot_product_efficient_attention.default,
                       aten._scaled_dot_product_cudnn_attention.default,
                       aten._scaled_dot_product_flash_attention_for_cpu.default})
"""Fused attention as torchtitan saves it (its list names the CUDA kernels; CPU runs ``_for_cpu``)."""


@dataclass(frozen=True)
class Result:
    """A step's peak bytes, their breakdown (by what they are), and the mean bytes one block holds for backward."""

    peak: int
    parts: dict[str, int]
    per_block: float


def build(device: str) -> tuple[Transformer, tuple[torch.Tensor, torch.Tensor]]:
    """The model in ``DTYPE`` (rotary tables in fp32, as torchtitan) and (tokens, labels) on ``device``."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(DTYPE)  # not .to(DTYPE): fake parameters cannot be swapped
    try:
        with torch.device(device):
            model = Transformer(**SHAPE)
            tokens = torch.zeros(BATCH, SHAPE["seq"], dtype=torch.long)
    finally:
        torch.set_default_dtype(previous)
    return model, (tokens, tokens.clone())


def keep_all(mp: ModelProblem, choice: list[int]) -> list[int]:
    """``choice`` with every block kept (the keep half of each op's strategies), made consistent."""
    index = {n: i for i, n in enumerate(mp.names)}
    kept = list(choice)
    for name, cand in mp.candidates.items():
        if cand.recompute is not None and name in mp.blocks.block_of:
            kept[index[name]] %= len(cand.strategies) // 2
    return mp.with_storage_of_users(kept)


def block_bytes(mp: ModelProblem, choice: list[int], slot: int) -> float:
    """Mean bytes per block held at ``slot`` by its ops' outputs and saved tensors."""
    index = {n: i for i, n in enumerate(mp.names)}
    return sum(item.usage[choice[index[item.owner]]] for item in mp.items
               if item.what in HELD and item.interval[0] <= slot < item.interval[1]
               and BLOCK.match(mp.graph[item.owner].module or "")) / SHAPE["layers"]


def predict() -> dict[str, Result]:
    """autoshard's prediction per policy (a block's share at the first backward slot)."""
    model, inputs = build("meta")
    graph = trace(model, inputs)
    problems = {policy: build_model_problem(graph, "1", mode="training", precision="as-is",
                                            memory_budget=10**15, recompute=policy) for policy in ("selective", "full")}
    selective = problems["selective"]
    choices = {"none": (selective, keep_all(selective, torchtitan_choice(selective)))}
    choices |= {policy: (mp, torchtitan_choice(mp)) for policy, mp in problems.items()}
    out = {}
    for policy in POLICIES:
        mp, choice = choices[policy]
        profile = mp.problem.usage_profile(choice)
        slot = max(profile, key=profile.__getitem__)
        out[policy] = Result(profile[slot], mp.memory_at(choice, slot), block_bytes(mp, choice, mp.life.horizon))
    return out


def selective_context(saved: Counter[str]) -> tuple[Any, Any]:
    """torchtitan's op policy for one checkpointed block (its own mm count, the forward's apart from a
    recompute's where torch consults the policy then), tallying what it saves."""
    mm_count: Counter[bool] = Counter()

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func == aten.mm.default:
            mm_count[ctx.is_recompute] += 1
        save = func in ATTENTION or (func == aten.mm.default and mm_count[ctx.is_recompute] % 2 == 1)
        if save:
            saved[str(func)] += 1
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def fuse_norms(model: Transformer) -> None:
    """Run every RMSNorm as CUDA's fused kernel keeps and allocates tensors (no values)."""
    for norm in model.modules():
        if isinstance(norm, torch.nn.RMSNorm):
            norm.forward = partial(lambda n, x: fused_rms_norm(x, n.normalized_shape, n.weight, n.eps), norm)


def wrap_blocks(model: Transformer, context_fn: Callable[[], tuple[Any, Any]] | None) -> None:
    """Run every block's forward under non-reentrant checkpointing (with ``context_fn`` if given)."""
    extra = {} if context_fn is None else {"context_fn": context_fn}
    for block in model.layers:
        block.forward = partial(checkpoint, block.forward, use_reentrant=False, **extra)


def measure(policy: str, saved: Counter[str]) -> Result:
    """MemTracker on the second training step under ``policy`` (a block's share: the growth of the
    activations from one block's forward to the next's)."""
    with FakeTensorMode():
        model, inputs = build("cpu")
        fuse_norms(model)
        if policy != "none":
            wrap_blocks(model, partial(selective_context, saved) if policy == "selective" else None)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        tracker = MemTracker()
        tracker.track_external(model, *inputs, optimizer)
        with tracker:
            for step in range(2):
                if step:
                    tracker.reset_mod_stats()
                loss = model(*inputs)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                del loss
        peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
        before = [activations(tracker.memory_tracking[block].snapshots[_ModState.PRE_FW][-1]) for block in model.layers]
    per_block = (before[-1] - before[0]) / (len(before) - 1)
    return Result(int(peak["Total"]), {str(getattr(k, "value", k)): int(v) for k, v in peak.items() if k != "Total"},
                  per_block)


def activations(snapshot: dict[torch.device, dict[Any, int]]) -> int:
    """Activation bytes of a MemTracker snapshot, over devices."""
    return sum(parts[_MemRefType.ACT] for parts in snapshot.values())


def breakdown(parts: dict[str, int]) -> str:
    """The parts of at least 0.01 GiB, in GiB, largest first."""
    return ", ".join(f"{k} {v / GIB:.2f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v >= GIB / 100)


def main() -> None:
    """Print the comparison tables."""
    predicted = predict()
    saved: Counter[str] = Counter()
    measured = {policy: measure(policy, saved) for policy in POLICIES}
    print(f"model: Transformer({', '.join(f'{k}={v}' for k, v in SHAPE.items())}), batch {BATCH}, {DTYPE}\n")
    print("| policy | predicted peak (GiB) | MemTracker peak (GiB) | predicted/measured |\n|---|---:|---:|---:|")
    for policy in POLICIES:
        p, m = predicted[policy].peak, measured[policy].peak
        print(f"| {policy} | {p / GIB:.3f} | {m / GIB:.3f} | {p / m:.3f} |")
    print("\n| policy | per block held for backward: predicted (MiB) | measured (MiB) |\n|---|---:|---:|")
    for policy in POLICIES:
        print(f"| {policy} | {predicted[policy].per_block / MIB:.1f} | {measured[policy].per_block / MIB:.1f} |")
    print("\n| policy | predicted at its peak slot (GiB) | MemTracker at its peak (GiB) |\n|---|---|---|")
    for policy in POLICIES:
        print(f"| {policy} | {breakdown(predicted[policy].parts)} | {breakdown(measured[policy].parts)} |")
    print(f"\nselective checkpointing saved (2 steps, {SHAPE['layers']} blocks): "
          + ", ".join(f"{op} x{n}" for op, n in sorted(saved.items())))


if __name__ == "__main__":
    main()
