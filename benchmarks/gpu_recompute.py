"""Measure what recomputing whole layers costs and saves on the GPU at hand, as JSON.

    python benchmarks/gpu_recompute.py --out measured.json [--layers 4] [--quick]

Pure PyTorch (it runs where autoshard is not installed). torchtitan's LLaMA-3-8B layers in bf16
at 2 x 8192 tokens, trained with AdamW (foreach) on one GPU, with the first K of its layers
recomputed in the backward (``torch.utils.checkpoint``, non-reentrant: only each layer's input
is kept) for every K from 0 to ``--layers``. Per K: the peak bytes allocated and reserved over
a fresh optimizer's first steps (its states are created in the first) and the median step time
after the first. ``benchmarks/kernels.py`` prints these beside the cost model's prediction for
the same plans (the recompute decisions the solver makes under a memory budget). ``--quick``
shrinks every size so the script can be checked on a CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_kernels import BF16, CUDA, DEVICE, empty_cache, environment  # noqa: E402
from titan_llama import Transformer  # noqa: E402


def loss_recomputing(model: Transformer, tokens: torch.Tensor, recomputed: int) -> torch.Tensor:
    """``model``'s loss (its own forward) with its first ``recomputed`` layers checkpointed."""
    h = model.tok_embeddings(tokens)
    for index, layer in enumerate(model.layers):
        h = checkpoint(layer, h, model.cos, model.sin, use_reentrant=False) if index < recomputed \
            else layer(h, model.cos, model.sin)
    logits = model.output(model.norm(h))
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten(0, 1))


def recompute_steps(layers: int, batch: int, seq: int, dims: dict, steps: int) -> list[dict]:
    """Per K in 0..``layers``: peak allocated and reserved bytes of ``steps`` AdamW steps from a
    fresh optimizer with the first K layers recomputed, and the median time of the steps after the first."""
    with torch.device(DEVICE):
        model = Transformer(layers, seq=seq, **dims).to(BF16)
    model.cos, model.sin = model.cos.float(), model.sin.float()
    tokens = torch.randint(0, dims["vocab"], (batch, seq), device=DEVICE)
    rows = []
    for recomputed in range(layers + 1):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
        empty_cache()
        if CUDA:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            loss_recomputing(model, tokens, recomputed).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if CUDA:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        row = {"recomputed": recomputed, "step_s": statistics.median(times[1:]), "step_times": times}
        if CUDA:
            row.update(peak_allocated=torch.cuda.max_memory_allocated(), peak_reserved=torch.cuda.max_memory_reserved())
        rows.append(row)
        print(f"K={recomputed}: {json.dumps({k: v for k, v in row.items() if k != 'step_times'})}", flush=True)
        del optimizer
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the script on a CPU")
    args = parser.parse_args()
    torch.manual_seed(0)
    dims = dict(dim=256, heads=4, kv_heads=2, hidden=512, vocab=1024) if args.quick else \
        dict(dim=4096, heads=32, kv_heads=8, hidden=14336, vocab=128256)
    batch, seq = (1, 128) if args.quick else (2, 8192)
    measured = {"environment": environment(), "layers": args.layers, "batch": batch, "seq": seq,
                "recompute": recompute_steps(args.layers, batch, seq, dims, args.steps)}
    args.out.write_text(json.dumps(measured, indent=1))


if __name__ == "__main__":
    main()
