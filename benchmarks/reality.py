"""Our time and memory model against published runs: predicted tokens/s/GPU and memory beside measured.

    .venv/bin/python benchmarks/reality.py [--rows table1 table3] [--layers 32] [--timeout 60]

Each published run this model can express is rebuilt as published (model, devices, local batch,
sequence length, bf16 mixed precision, torchtitan's selective activation checkpointing as the
recomputation policy), its plan as the run's authors ran it is costed in our model
(``--baseline torchtitan``'s choice: FSDP on a 1-D mesh, re-gathered for backward, every layer
recomputed under the policy), and the table prints its predicted step time, tokens/s/GPU and
memory beside the published figures, the ratios, and our optimum's figures in the same model, on the preset of the hosts the runs had (``h100-hbm2e``).
The memory compared is what the caching allocator reserves (torchtitan logs its peak reserved
bytes): the plan's live peak times the preset's allocator headroom. A ratio of predicted to
measured tokens/s above 1 means our model is optimistic. The published figures (and their
source) are in ``RUNS``; the device preset's figures have their own sources (devices.toml), and
nothing here is tuned to these rows.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from titan_llama import titan_llama3_8b  # noqa: E402

from autoshard.cost.compute import kernel_classes  # noqa: E402
from autoshard.api import build_model_problem, default_solve_options, solve_model_problem  # noqa: E402
from autoshard.errors import AutoshardError  # noqa: E402
from autoshard.frontend.trace import trace  # noqa: E402
from autoshard.problem.baselines.torchtitan import torchtitan_choice  # noqa: E402
from autoshard.problem.build import ModelProblem  # noqa: E402

GIB = 2**30
SOURCE = "pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md (H100 96 GB HBM2e, 500 W, NVLink, 400 Gb/s per GPU)"
DEVICE = "h100-hbm2e"
"""The preset of the published runs' hosts (devices.toml: HBM2e at 2.4 TB/s, the lower end of its peak)."""


@dataclass(frozen=True)
class Run:
    """One published run: what was trained where, and what was measured."""

    key: str
    label: str
    gpus: int
    local_batch: int
    seq: int
    tokens_per_s_per_gpu: float
    memory_gib: float
    not_modelled: str


RUNS = [
    Run("table1", "Table 1, FSDP, LLaMA-3.1-8B, 8 H100", 8, 2, 8192, 5762, 82.4,
        "kernel rates at 500 W (preset: measured on an H100 SXM at 700 W)"),
    Run("table3", "Table 3, FSDP, LLaMA-3.1-8B, 128 H100", 128, 2, 8192, 5605, 67.0,
        "kernel rates at 500 W (preset: measured on an H100 SXM at 700 W)"),
]
"""torchtitan's 1-D (FSDP) rows without torch.compile or Float8 (SOURCE); the others need
Float8, context or pipeline parallelism, which the model does not express yet."""


def figures(mp: ModelProblem, choice: list[int], run: Run) -> tuple[float, float, float]:
    """(step seconds, tokens/s/GPU, reserved GiB) of ``choice`` in our model."""
    seconds = mp.problem.cost(choice) / mp.cost_model.ticks_per_unit
    device = mp.cost_model.device
    reserved = device.device_bytes(mp.problem.peak_usage(choice))
    return seconds, run.local_batch * run.seq / seconds, reserved / GIB


def breakdown(mp: ModelProblem, choice: list[int]) -> str:
    """Seconds of the plan's step by kernel class (GEMM, attention, other ops) and exposed communication."""
    classes = {"matmul": 0, "attention_forward": 0, "peak": 0}
    for i, name in enumerate(mp.names):
        classes[kernel_classes(mp.candidates[name].node.op)[0]] += int(mp.problem.node_costs[i][choice[i]])
    edges = sum(int(m[choice[a], choice[b]]) for (a, b), m in zip(mp.problem.edges, mp.problem.edge_costs))
    tick = mp.cost_model.ticks_per_unit
    return " / ".join(f"{v / tick:.2f}" for v in (*classes.values(), edges))


def row(run: Run, layers: int, timeout: float) -> str:
    """One table row: the published run, torchtitan's plan in our model, our optimum in our model."""
    start = time.monotonic()
    model, inputs = titan_llama3_8b(layers, seq=run.seq, batch=run.local_batch * run.gpus)
    graph = trace(model, inputs)
    mp = build_model_problem(graph, str(run.gpus), mode="training", device=DEVICE, precision="bf16-mixed",
                             recompute="selective")
    built = time.monotonic() - start
    titan = torchtitan_choice(mp)
    t_step, t_tps, t_mem = figures(mp, titan, run)
    try:
        solution = solve_model_problem(mp, default_solve_options(mp, timeout)).solution
        o_step, o_tps, o_mem = figures(mp, list(solution.choice), run)
        ours = f"{o_step:.3f} s | {o_tps:,.0f} | {o_mem:.1f} | {solution.status}"
    except AutoshardError as err:
        ours = f"none fits: {err} | | |"
    return (f"| {run.label} | {run.tokens_per_s_per_gpu:,.0f} | {run.memory_gib:.1f} | {t_step:.3f} s | "
            f"{t_tps:,.0f} | {t_tps / run.tokens_per_s_per_gpu:.2f} | {t_mem:.1f} | {t_mem / run.memory_gib:.2f} | "
            f"{breakdown(mp, titan)} | {ours} | {run.not_modelled} | {built:.0f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", default=[r.key for r in RUNS], choices=[r.key for r in RUNS])
    parser.add_argument("--layers", type=int, default=32, help="decoder layers (32 as published; fewer for a quick look)")
    parser.add_argument("--timeout", type=float, default=60.0, help="the solver's limit for our optimum (s)")
    args = parser.parse_args()
    print(f"source: {SOURCE}")
    print("| run | published tok/s/GPU | published GiB | torchtitan's plan: step | tok/s/GPU | predicted/published | "
          "GiB | predicted/published | s in GEMM / attention / other ops / exposed comm | ours: step | tok/s/GPU | "
          "GiB | proof | not modelled | trace+build |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---|---:|", flush=True)
    for run in RUNS:
        if run.key in args.rows:
            print(row(run, args.layers, args.timeout), flush=True)


if __name__ == "__main__":
    main()
