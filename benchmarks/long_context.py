"""Long sequences: LLaMA-3.1-8B training on 8 H100, one sequence of 32k to 256k tokens.

    .venv/bin/python benchmarks/long_context.py [--seqs 32768 65536 131072 262144] [--timeout 120]
                                                [--device h100-hbm2e] [--model titan|hf]

torchtitan's LLaMA-3.1-8B (``titan_llama.py``), bf16 mixed precision, local batch 1 per data
parallel rank as torchtitan's Table 2 runs it (pytorch/torchtitan,
``benchmarks/llama3_h100_202412_torchtitan.md``: FSDP x CP, full activation checkpointing,
torch.compile and Float8, which this model does not price). Per row: the published run, then our
plan in the calibrated model on the published runs' hosts (``--device h100-hbm2e``: 96 GB HBM2e
parts, their capacity the budget; ``h100`` for 80 GB ones): its step, tokens/s/GPU, live peak, how
it splits attention (query rows: context parallelism with the keys and values gathered; heads:
the heads split, the sequence exchanged around attention), the layers it recomputes, and the
solver's claim at the limit.

``--model hf``: Hugging Face's LLaMA-3.1-8B built from its config (``examples/llama3_8b.py``,
fused attention, its causal mask materialised by the export), one sequence in all, with the
usual shifted next-token loss (``logits[:, :-1]``: 131071 positions at 131072 tokens, which 8
devices do not divide, cut as ``torch.chunk`` cuts them). Its rows say what the solver proved
or how close it came within ``--timeout``; the wall column adds tracing and building.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from titan_llama import titan_llama3_8b  # noqa: E402

from autoshard.api import build_model_problem, default_solve_options, solve_model_problem  # noqa: E402
from autoshard.errors import AutoshardError  # noqa: E402
from autoshard.frontend.load import load_model  # noqa: E402
from autoshard.frontend.trace import trace  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama3_8b.py"
"""Hugging Face's LLaMA-3.1-8B (``--model hf``); LLAMA_BATCH and LLAMA_SEQ set its batch."""

PUBLISHED = {32768: ("FSDP 8, CP 1", 3890, 83.9), 65536: ("FSDP 4, CP 2", 2540, 84.2),
             131072: ("FSDP 2, CP 4", 1071, 84.0), 262144: ("FSDP 1, CP 8", 548, 84.5)}
"""Sequence length -> torchtitan's Table 2 (parallelism, tokens/s/GPU, GiB), with compile and Float8."""
GPUS = 8


def attention_split(mp, choice: list[int]) -> str:
    """How the plan lays out the first attention's queries: rows, heads, batch or nothing split."""
    name = next(n for n in mp.names if mp.candidates[n].node.op == "scaled_dot_product_attention")
    dims = mp.strategy(name, choice).in_specs[0].dims
    parts = [what for what, axes in zip(("batch", "heads", "rows", "head dim"), dims) if axes]
    return " + ".join(parts) or "replicated"


def hf_row(seq: int, timeout: float, device: str, compile: str | None) -> str:
    """One row for Hugging Face's LLaMA-3.1-8B with its shifted loss on one ``seq``-token sequence
    (``compile``: priced as torch.compile runs it, its memory-bound ops fused)."""
    start = time.monotonic()
    os.environ["LLAMA_BATCH"], os.environ["LLAMA_SEQ"] = "1", str(seq)
    loaded = load_model(str(EXAMPLE)).for_training()
    mp = build_model_problem(trace(loaded.model, loaded.example_inputs), str(GPUS), mode="training", device=device,
                             compile=compile)
    return solved_row(f"| {seq:,} x 1 | {seq - 1:,} | {compile or 'eager'} |", mp, timeout, seq, start)


def solved_row(head: str, mp, timeout: float, tokens: int, start: float) -> str:
    """``head`` followed by our plan's cells for ``mp`` (step, tokens/s/GPU over ``tokens`` per
    step, peak, attention split, recomputed layers, claim, wall time since ``start``), or the
    reason none was found."""
    try:
        result = solve_model_problem(mp, default_solve_options(mp, timeout))
    except AutoshardError as err:
        return f"{head} none: {err} | | | | | {time.monotonic() - start:.0f} s |"
    choice = list(result.solution.choice)
    seconds = result.solution.cost / mp.cost_model.ticks_per_unit
    return (f"{head} {seconds:.2f} s | {tokens / GPUS / seconds:,.0f} | {mp.problem.peak_usage(choice) / 2**30:.1f} | "
            f"{attention_split(mp, choice)} | {len(result.plan.recompute)} | {claim(result)} | "
            f"{time.monotonic() - start:.0f} s |")


def claim(result) -> str:
    """"proved", or the gap to the solver's lower bound."""
    bound = result.solution.lower_bound or 0
    if result.solution.status == "optimal":
        return "proved"
    return f"gap {100 * (result.solution.cost - bound) / result.solution.cost:.2f}%"


def row(seq: int, timeout: float, device: str) -> str:
    """One table row: the published run beside our plan for its batch of ``seq``-token sequences."""
    start = time.monotonic()
    batch = GPUS * 32768 // seq  # one sequence per data-parallel rank, as published
    model, inputs = titan_llama3_8b(32, seq=seq, batch=batch)
    mp = build_model_problem(trace(model, inputs), str(GPUS), mode="training", device=device, precision="bf16-mixed")
    label, tps, gib = PUBLISHED[seq]
    return solved_row(f"| {seq:,} x {batch} | {label}: {tps:,} tok/s/GPU, {gib} GiB |", mp, timeout, seq * batch, start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", nargs="*", type=int, default=list(PUBLISHED), choices=list(PUBLISHED))
    parser.add_argument("--timeout", type=float, default=120.0, help="the solver's limit per row (s)")
    parser.add_argument("--device", default="h100-hbm2e", help="the preset (its capacity is the budget)")
    parser.add_argument("--model", choices=("titan", "hf"), default="titan",
                        help="titan: torchtitan's model, Table 2's batches; hf: Hugging Face's, one sequence, shifted loss")
    parser.add_argument("--compile", choices=("model", "layers"), help="hf rows: priced as torch.compile runs them")
    args = parser.parse_args()
    if args.model == "hf":
        print("| tokens x sequences | positions scored | run | step | tok/s/GPU | live GiB | attention split | "
              "layers recomputed | claim | wall |\n|---|---:|---|---:|---:|---:|---|---:|---|---:|", flush=True)
        for seq in args.seqs:
            print(hf_row(seq, args.timeout, args.device, args.compile), flush=True)
        return
    print("| tokens x sequences | torchtitan (Table 2) | ours: step | tok/s/GPU | live GiB | attention split | "
          "layers recomputed | claim | wall |\n|---|---|---:|---:|---:|---|---:|---|---:|", flush=True)
    for seq in args.seqs:
        print(row(seq, args.timeout, args.device), flush=True)


if __name__ == "__main__":
    main()
