"""Pipelined plans: LLaMA-3.1-405B on 512 H100 (8x8x8), ours beside torchtitan's Table 5.

    .venv/bin/python benchmarks/pipeline.py [--timeout 480] [--budget GIB] [--recipes]

torchtitan's 3-D run (pytorch/torchtitan ``benchmarks/llama3_h100_202412_torchtitan.md``, Table
5: FSDP 8 x TP 8 x PP 8, local batch 32, global batch 256 x 8192 tokens, full activation
checkpointing, torch.compile + Float8 + async TP, which this model does not price) on its hosts
(``--device h100-hbm2e``, its capacity the budget). Our search pipelines the outer mesh axis (schedule,
microbatches and cuts searched with each stage's sharding on the inner 8x8) under the time limit
(``--timeout``: the whole process's, its imports and tracing included);
torchtitan's two schedules are costed in the same model on the same stage problems. Also printed:
the whole process's wall time and peak resident memory (the solver's children included).
``--recipes`` costs only torchtitan's two recipes (as it ran them: 8 microbatches, parameters
kept gathered) and prints the predicted interleaved/1F1B throughput ratio beside the published one.
``--auto-70b`` runs ``--pipeline auto`` on torchtitan's LLaMA-3.1-70B (bf16, 32 x 8192 tokens, full
activation checkpointing) on 8x8 ``h100`` at 80 GiB: which axis, if any, to pipeline, and why.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reality import titan_llama3_70b  # noqa: E402
from titan_llama import titan_llama3_405b  # noqa: E402

from autoshard.cli.pipeline import microbatch_inputs  # noqa: E402
from autoshard.cost.devices import get_device  # noqa: E402
from autoshard.errors import AutoshardError  # noqa: E402
from autoshard.frontend.replicate import trace_replicated  # noqa: E402
from autoshard.pipeline.axes import AxesSearch, auto_seeds, in_turn, pipeline_axes, why  # noqa: E402
from autoshard.pipeline.baseline import torchtitan_options, torchtitan_pipeline  # noqa: E402
from autoshard.pipeline.options import microbatch_counts, options_for  # noqa: E402
from autoshard.pipeline.claim import search  # noqa: E402
from autoshard.pipeline.deadline import exit_reserve  # noqa: E402
from autoshard.pipeline.results import PipelineResult  # noqa: E402
from autoshard.pipeline.search import PipelineSearch  # noqa: E402
from autoshard.sharding.mesh import parse_mesh  # noqa: E402

PUBLISHED = {"1f1b": (100, 82.5), "interleaved-1f1b": (128, 72.7)}
"""torchtitan's Table 5: schedule -> (tokens/s/GPU, GiB), with compile, Float8 and async TP."""
BATCH, SEQ, MESH = 256, 8192, "8x8x8"


def process_seconds() -> float:
    """Seconds since this process started (its imports included), from /proc."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    return float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")


def peak_rss_gib() -> float:
    """Peak resident memory of this process and of its largest child, in GiB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=480.0, help="search limit in seconds (default 480)")
    parser.add_argument("--budget", type=float, default=None, help="memory budget in GiB (default: the device's)")
    parser.add_argument("--recipes", action="store_true", help="cost torchtitan's two recipes only, no search")
    parser.add_argument("--auto-70b", action="store_true", help="--pipeline auto on LLaMA-3.1-70B on 8x8 h100")
    args = parser.parse_args()
    if args.auto_70b:
        auto_70b(args.timeout)
        return
    start = time.monotonic() - process_seconds()  # the limit is the whole process's
    model, inputs = titan_llama3_405b(seq=SEQ, batch=BATCH)
    device = get_device("h100-hbm2e")
    mesh = parse_mesh(MESH, None, None, 8, device.intra, device.inter)
    budget = None if args.budget is None else int(args.budget * 2**30)
    build = dict(mode="training", device=device, precision="bf16-mixed", memory_budget=budget,
                 recompute="full")
    engine = PipelineSearch(lambda m: trace_replicated(model, microbatch_inputs(inputs, m)), mesh, 0, build,
                            args.timeout - exit_reserve(args.timeout) - (time.monotonic() - start),
                            lambda line: print(f"[{time.monotonic() - start:5.0f}s] {line}", flush=True))
    if args.recipes:
        print_recipes(engine, mesh.size, device)
        print(f"\nwhole process: {time.monotonic() - start:.0f} s wall, peak resident memory {peak_rss_gib():.2f} GiB")
        return
    counts = microbatch_counts(8, BATCH)
    options = options_for(126, 8, counts)
    try:
        result = search(engine, options, torchtitan_options(126, 8, BATCH))
    except AutoshardError as exc:  # no plan by the time limit
        print(f"error: {exc}")
        print(f"\nwhole process: {time.monotonic() - start:.0f} s wall, peak resident memory {peak_rss_gib():.2f} GiB")
        sys.exit(1)
    wall, rss = time.monotonic() - start, peak_rss_gib()
    tokens = BATCH * SEQ
    best = result.best
    live = max(s.model_problem.problem.peak_usage(list(s.solution.choice)) for s in best.solutions.values())
    claim = claim_text(result)
    print()
    print("| plan | step | tok/s/GPU | peak GiB (reserved) | published tok/s/GPU, GiB | claim |")
    print("|---|---:|---:|---:|---|---|")
    print(f"| ours: {best.option.label} | {best.step:.2f} s | {tokens / best.step / mesh.size:,.0f} | "
          f"{device.device_bytes(live) / 2**30:.1f} | | {claim} |")
    for option in torchtitan_options(126, 8, BATCH):
        published = PUBLISHED.get(option.schedule)
        try:  # costed during the search unless its builds did not end by the time limit
            base = torchtitan_pipeline(engine, option)
        except AutoshardError:
            print(f"| torchtitan: {option.label} | not costed within the time limit | | | {published[0]}, "
                  f"{published[1]} | |")
            continue
        fits = "" if base.fits else " (over budget)"
        print(f"| torchtitan: {option.label} | {base.step:.2f} s | {tokens / base.step / mesh.size:,.0f} | "
              f"{device.device_bytes(base.peak) / 2**30:.1f}{fits} | {published[0]}, {published[1]} | "
              f"ours/torchtitan {best.step / base.step:.3f} |")
    print(f"\nwhole process: {wall:.0f} s wall, peak resident memory {rss:.2f} GiB; "
          f"{len(result.searched)} options, {sum(s.step is not None for s in result.searched)} solved")


def print_recipes(engine: PipelineSearch, devices: int, device) -> None:
    """torchtitan's two Table 5 recipes in our model, and their throughput ratio against the published."""
    tokens = BATCH * SEQ
    rates = {}
    print("| torchtitan recipe | step | tok/s/GPU | peak GiB (reserved) | published tok/s/GPU, GiB |")
    print("|---|---:|---:|---:|---|")
    for option in torchtitan_options(126, 8, BATCH):
        base = torchtitan_pipeline(engine, option)
        rates[option.schedule] = tokens / base.step / devices
        published = PUBLISHED[option.schedule]
        print(f"| {option.label}, parameters kept gathered | {base.step:.2f} s | {rates[option.schedule]:,.1f} | "
              f"{device.device_bytes(base.peak) / 2**30:.1f}{'' if base.fits else ' (over budget)'} | "
              f"{published[0]}, {published[1]} |")
    ours = rates["interleaved-1f1b"] / rates["1f1b"]
    theirs = PUBLISHED["interleaved-1f1b"][0] / PUBLISHED["1f1b"][0]
    print(f"\ninterleaved/1F1B tokens/s: predicted {ours:.3f}, published {theirs:.3f} ({100 * (ours / theirs - 1):+.1f}%)")


def claim_text(result: PipelineResult) -> str:
    """The claim over the options: proved, the gap to the least bound, or none where the bounding
    phase left options without a bound (their bound counts as 0, so a gap would read 100%)."""
    if result.unbounded:
        return f"no claim ({result.unbounded} options not bounded)"
    return "proved" if result.best.proved and result.gap <= 1e-9 else f"gap {100 * result.gap:.2f}%"


def auto_70b(timeout: float) -> None:
    """``--pipeline auto`` on LLaMA-3.1-70B, 32 x 8192 tokens, on 8x8 h100 at 80 GiB: every axis and
    no pipeline searched as one; the options table's best, the claim, and why."""
    start = time.monotonic() - process_seconds()
    batch, seq = 32, 8192
    model, inputs = titan_llama3_70b(80, seq, batch)
    device = get_device("h100")
    mesh = parse_mesh("8x8", None, None, 8, device.intra, device.inter)
    build = dict(mode="training", device=device, precision="bf16-mixed", recompute="full")
    say = lambda line: print(f"[{time.monotonic() - start:5.0f}s] {line}", flush=True)  # noqa: E731
    graph_for = lambda m: trace_replicated(model, microbatch_inputs(inputs, m))  # noqa: E731
    left = timeout - exit_reserve(timeout) - (time.monotonic() - start)
    engines = {a: PipelineSearch(graph_for, mesh, a, build, left, say) for a in pipeline_axes(mesh)}
    options = in_turn([options_for(80, 8, microbatch_counts(8, batch), axis=a) for a in engines], 80)
    seeds = auto_seeds(80, [replace(o, axis=a) for a in engines for o in torchtitan_options(80, 8, batch)])
    result = search(AxesSearch(engines, lambda: graph_for(1), mesh, build, left, say), options, seeds)
    best = result.best
    claim = claim_text(result)
    print(f"\nbest: {best.option.label}, step {best.step:.2f} s, "
          f"{batch * seq / best.step / mesh.size:,.0f} tok/s/GPU, {claim}")
    print("why: " + "; ".join(why(result)))
    print(f"whole process: {time.monotonic() - start:.0f} s wall, peak resident memory {peak_rss_gib():.2f} GiB; "
          f"{len(result.searched)} candidates, {sum(s.step is not None for s in result.searched)} solved")


if __name__ == "__main__":
    main()
