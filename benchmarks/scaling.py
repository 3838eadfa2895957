"""How solving scales with depth: GPT-style models of 1-48 layers on meshes 8 and 2x4.

    .venv/bin/python benchmarks/scaling.py [--layers 1 12 24 48] [--meshes 8 2x4] [--timeout 60]

Prints a markdown table (graph nodes, decision nodes, core left after reductions, trace (once
per depth), build and solve time, what proved the optimum or the gap, our cost against the Megatron baseline in the same cost model) and
writes scaling.png (solve time against layers).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoshard.api import build_model_problem, default_solve_options, solve_model_problem  # noqa: E402
from autoshard.problem.baselines.megatron import megatron_choice  # noqa: E402
from autoshard.frontend.trace import trace  # noqa: E402
from benchmarks.models import gpt2  # noqa: E402


def run_case(layers: int, mesh: str, mode: str, timeout: float, graphs: dict) -> dict:
    """Trace (cached per depth), build, solve and cost the baseline for one configuration."""
    if layers not in graphs:
        model, inputs = gpt2(layers)
        start = time.perf_counter()
        graphs[layers] = (trace(model, inputs), time.perf_counter() - start)
    graph, trace_s = graphs[layers]
    start = time.perf_counter()
    mp = build_model_problem(graph, mesh, mode=mode)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    result = solve_model_problem(mp, default_solve_options(mp, timeout))
    solve_s = time.perf_counter() - start
    sol = result.solution
    baseline = mp.problem.cost(megatron_choice(mp))
    return {
        "layers": layers, "mesh": mesh, "mode": mode, "graph": len(graph), "nodes": mp.problem.num_nodes,
        "core": getattr(sol, "core_nodes", None), "trace_s": trace_s, "build_s": build_s, "solve_s": solve_s,
        "status": sol.status, "proof": sol.proof, "gap": sol.gap, "ours": sol.cost, "megatron": baseline,
        "format": mp.cost_model.format,
    }


def markdown(rows: list[dict]) -> str:
    """The results as a markdown table."""
    head = ("| layers | mesh | mode | graph nodes | decision nodes | core after reductions | trace s | build s | solve s | proved by / gap "
            "| ours | Megatron | ours/Megatron |")
    lines = [head, "|" + "|".join(["---"] * 13) + "|"]
    for r in rows:
        proved = (r["proof"] or "proved") if r["status"] == "optimal" else ("gap ?" if r["gap"] is None else f"gap {100 * r['gap']:.2f}%")
        lines.append(
            f"| {r['layers']} | {r['mesh']} | {r['mode']} | {r['graph']} | {r['nodes']} | "
            f"{'-' if r['core'] is None else r['core']} | {r['trace_s']:.2f} | {r['build_s']:.2f} | {r['solve_s']:.2f} | {proved} | "
            f"{r['format'](r['ours'])} | {r['format'](r['megatron'])} | {r['ours'] / r['megatron']:.3f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """Solve time against layers, one line per (mesh, mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key in sorted({(r["mesh"], r["mode"]) for r in rows}):
        pts = [(r["layers"], r["solve_s"]) for r in rows if (r["mesh"], r["mode"]) == key]
        ax.plot(*zip(*pts), marker="o", label=f"mesh {key[0]}, {key[1]}")
    ax.set_xlabel("GPT-2 layers (hidden 1024, seq 512, batch 8)")
    ax.set_ylabel("solve time (s)")
    ax.set_title("autoshard: time to a proved optimal plan")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    """Run every configuration and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, nargs="+", default=[1, 12, 24, 48])
    p.add_argument("--meshes", nargs="+", default=["8", "2x4"])
    p.add_argument("--modes", nargs="+", default=["inference", "training"])
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--plot", default="scaling.png")
    args = p.parse_args()
    graphs: dict = {}
    rows = []
    for layers in args.layers:
        for mesh in args.meshes:
            for mode in args.modes:
                rows.append(run_case(layers, mesh, mode, args.timeout, graphs))
                print(f"done {layers} layers, mesh {mesh}, {mode}: {rows[-1]['solve_s']:.2f}s {rows[-1]['status']}",
                      file=sys.stderr)
    print(markdown(rows))
    plot(rows, Path(args.plot))
    print(f"\nplot written to {args.plot}")


if __name__ == "__main__":
    main()
