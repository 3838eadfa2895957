"""Plans that fit: LLaMA-3-8B training under a per-device memory budget, ours against the hand plans.

    .venv/bin/python benchmarks/fit.py [--meshes 8 2x8 8x8] [--budgets 80GiB 40GiB]
                                       [--attention sdpa eager] [--layers 32] [--timeout 120]
                                       [--compile [model|layers]] [--float8 tensorwise|rowwise]

LLaMA-3-8B as published (bf16, 8 sequences of 4096 tokens, Hugging Face's own next-token loss,
built on the meta device), ``--mode training --device h100``, each budget. Per row: the
torchtitan plan (FSDP re-gathered + TP with sequence-parallel norms + full activation
checkpointing, ``autoshard/problem/baselines/torchtitan.py``) and the Megatron plan costed in the same
model (``-`` where it does not fit), our plan's step time and peak, the proof (or the gap at the
time limit), what ours recomputes and re-gathers, and the solve time (the time limit is the
solver's; tracing and building the problem are timed apart, once per attention kind).
``--compile`` and ``--float8`` price the step as torch.compile and torchao's Float8 linears run it
(``autoshard.solve``'s flags of the same names), for every plan of the row alike.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import CausalLMLoss, llama3_8b  # noqa: E402

from autoshard.api import build_model_problem, default_solve_options, solve_model_problem  # noqa: E402
from autoshard.problem.baselines.megatron import megatron_choice  # noqa: E402
from autoshard.problem.baselines.torchtitan import torchtitan_choice  # noqa: E402
from autoshard.problem.build import ModelProblem  # noqa: E402
from autoshard.errors import AutoshardError  # noqa: E402
from autoshard.frontend.trace import trace  # noqa: E402
from autoshard.cost.float8 import RECIPES as FLOAT8_RECIPES  # noqa: E402
from autoshard.cost.fusion import COMPILE_SCOPES  # noqa: E402
from autoshard.cost.units import format_bytes, parse_bytes  # noqa: E402


def _baseline(mp: ModelProblem, choice: list[int]) -> str:
    """A baseline's step time, or ``-`` with its peak when it does not fit."""
    if not mp.problem.is_feasible(choice):
        return f"- ({format_bytes(mp.problem.peak_usage(choice))})"
    return mp.cost_model.format(mp.problem.cost(choice))


def row(mp: ModelProblem, label: str, timeout: float) -> str:
    """One table row: the baselines, then ours solved within ``timeout`` seconds."""
    titan, megatron = torchtitan_choice(mp), megatron_choice(mp)
    start = time.monotonic()
    try:
        result = solve_model_problem(mp, default_solve_options(mp, timeout))
    except AutoshardError as err:  # no plan fits: the message names the smallest peak
        return f"| {label} | {_baseline(mp, titan)} | {_baseline(mp, megatron)} | none fits: {err} |"
    took = time.monotonic() - start
    solution, plan = result.solution, result.plan
    ours = mp.problem.cost(list(solution.choice))
    proof = "proved" if solution.status == "optimal" else \
        f"gap {100 * (ours - (solution.lower_bound or 0)) / ours:.2f}%"
    ratio = f"{ours / mp.problem.cost(titan):.3f}" if mp.problem.is_feasible(titan) else "-"
    regathered = len({e.src for e in plan.edges if e.regather})
    return (f"| {label} | {_baseline(mp, titan)} | {_baseline(mp, megatron)} | {mp.cost_model.format(ours)} | "
            f"{ratio} | {format_bytes(mp.problem.peak_usage(list(solution.choice)))} | {len(plan.recompute)} | "
            f"{regathered} | {proof} | {took:.1f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meshes", nargs="*", default=["8", "2x8", "8x8"])
    parser.add_argument("--budgets", nargs="*", default=["80GiB", "40GiB"])
    parser.add_argument("--attention", nargs="*", default=["sdpa", "eager"])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--compile", nargs="?", const="model", choices=COMPILE_SCOPES, default=None,
                        help="price every plan under torch.compile (the whole model, or each layer alone)")
    parser.add_argument("--float8", choices=FLOAT8_RECIPES, default=None,
                        help="price every plan with torchao's Float8 linears of this scaling")
    args = parser.parse_args()
    print("| attention, mesh, budget | torchtitan | Megatron | ours | ours/torchtitan | our peak | layers "
          "recomputed | parameters re-gathered | proof | solve |\n|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
          flush=True)
    for attention in args.attention:
        start = time.monotonic()
        model, (tokens,) = llama3_8b(args.layers, attention=attention)
        graph = trace(CausalLMLoss(model), (tokens, tokens.clone()))
        traced = time.monotonic() - start
        for mesh in args.meshes:
            for budget in args.budgets:
                start = time.monotonic()
                mp = build_model_problem(graph, mesh, mode="training", memory_budget=parse_bytes(budget),
                                         device="h100", compile=args.compile, float8=args.float8)
                built = time.monotonic() - start
                print(row(mp, f"{attention}, {mesh}, {budget}", args.timeout), flush=True)
                print(f"<!-- traced in {traced:.1f} s, built in {built:.1f} s -->", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
