"""Mixtral-8x7B as published (meta device, bf16, 8 x 4096 tokens, training): our plan against torchtitan's.

    .venv/bin/python benchmarks/moe.py [--meshes 8 2x8] [--layers 32] [--timeout 600] [--capacity-factor 1.0]

Prints a markdown table: mesh, graph and decision nodes, trace / build / solve seconds (solve:
the solver alone, reductions included), what proved the optimum (or the gap at the time limit),
our cost, the torchtitan-style MoE baseline (experts parallel on the last mesh axis, FSDP on the
first, tensor-parallel attention: ``autoshard/problem/baselines/torchtitan.py``) in the same cost model, and
which MoE layers our plan runs expert-parallel, over which mesh axis, and how its experts are
stored. Default device: the generic roofline and links (100 Tflop/s, 300 GB/s inside a node).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoshard.api import build_model_problem, default_solve_options, solve_model_problem  # noqa: E402
from autoshard.problem.baselines.torchtitan import torchtitan_choice  # noqa: E402
from autoshard.frontend.trace import trace  # noqa: E402
from autoshard.lower.fold import fold  # noqa: E402
from benchmarks.models import mixtral_8x7b  # noqa: E402


def run_case(graph, trace_s: float, mesh: str, timeout: float, capacity: float) -> dict:
    """Build, solve and cost the baseline for one mesh."""
    start = time.perf_counter()
    mp = build_model_problem(graph, mesh, mode="training", capacity_factor=capacity)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    result = solve_model_problem(mp, default_solve_options(mp, timeout))
    solve_s = time.perf_counter() - start
    sol, plan = result.solution, result.plan
    layers = plan.expert_parallel()
    axes = sorted(set(layers.values()))
    experts = next((n for n in plan.nodes.values() if n.op == "moe_experts"), None)
    stored = plan.param_specs.get(f"{experts.module}.gate_up_proj") if experts is not None else None
    return {
        "mesh": mesh, "graph": len(graph), "nodes": mp.problem.num_nodes, "trace_s": trace_s, "build_s": build_s,
        "solve_s": solve_s, "status": sol.status, "proof": sol.proof, "gap": sol.gap, "ours": sol.cost,
        "baseline": mp.problem.cost(torchtitan_choice(mp)), "format": mp.cost_model.format,
        "ep": f"{fold(list(layers)) if layers else 'none'}" + (f" (axis {', '.join(map(str, axes))})" if axes else ""),
        "experts": "-" if stored is None else stored.format(mp.mesh.ndim),
        "moe_layers": sum(1 for n in plan.nodes.values() if n.op == "moe_experts"), "ep_layers": len(layers),
    }


def markdown(rows: list[dict]) -> str:
    """The results as a markdown table."""
    lines = ["| mesh | graph nodes | decision nodes | trace s | build s | solve s | proved by / gap | ours "
             "| torchtitan | ours/baseline | expert-parallel layers | experts stored |",
             "|" + "|".join(["---"] * 12) + "|"]
    for r in rows:
        proved = (r["proof"] or "proved") if r["status"] == "optimal" else (
            "gap ?" if r["gap"] is None else f"gap {100 * r['gap']:.2g}%")
        lines.append(f"| {r['mesh']} | {r['graph']} | {r['nodes']} | {r['trace_s']:.1f} | {r['build_s']:.1f} | "
                     f"{r['solve_s']:.1f} | {proved} | {r['format'](r['ours'])} | {r['format'](r['baseline'])} | "
                     f"{r['ours'] / r['baseline']:.3f} | {r['ep_layers']}/{r['moe_layers']}: {r['ep']} | "
                     f"gate_up {r['experts']} |")
    return "\n".join(lines)


def main() -> None:
    """Trace once, then solve every mesh and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--meshes", nargs="+", default=["8", "2x8"])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--capacity-factor", type=float, default=1.0)
    args = p.parse_args()
    model, inputs = mixtral_8x7b(layers=args.layers)
    start = time.perf_counter()
    graph = trace(model, inputs, "export")
    trace_s = time.perf_counter() - start
    rows = []
    for mesh in args.meshes:
        rows.append(run_case(graph, trace_s, mesh, args.timeout, args.capacity_factor))
        print(f"done mesh {mesh}: {rows[-1]['solve_s']:.1f}s {rows[-1]['status']}", file=sys.stderr)
    print(markdown(rows))


if __name__ == "__main__":
    main()
