"""LLM-scale solving: how fast the solver proves the optimum of real model problems; prints a table.

    python benchmarks/llm_scale.py [--cases llama3-8b:8x8:none,llama3-8b:8:80GiB] [--limit 60] [--no-reference]

For each case (model, mesh, memory budget; training mode, models built on the meta device as in
benchmarks/models.py): the graph's nodes, the core left after the exact reductions, the time to
trace and build the problem, then our solve (``autoshard.solver.solve``, ``--timeout``): the time to the
first plan, to the proof (or the gap at the limit) and what proved it, the time at which z3 certified the
final cost (``Solution.proof_times``; "-" where the core is too large for z3), and trace + build +
solve (the CLI process is that plus about 3 s of start-up). Beside it, the same problem (unreduced,
as it would be written with --write-problem) under toulbar2's branch and bound alone and under
HiGHS's MILP alone (both in child processes, wall-clock ``--limit``): the time to their proof, or
their gap at the limit. Times are wall seconds on this machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoshard.api import build_model_problem  # noqa: E402
from autoshard.frontend.trace import trace  # noqa: E402
from autoshard.solver.model.problem import ShardingProblem  # noqa: E402
from autoshard.solver import Improved, SolveOptions, solve  # noqa: E402
from autoshard.solver.core.reduced import Core  # noqa: E402
from autoshard.solver.core.rows import attach_memory  # noqa: E402
from autoshard.solver.run.workers import EngineWorker  # noqa: E402
from autoshard.cost.units import parse_bytes  # noqa: E402
from benchmarks.models import BUILDERS  # noqa: E402

DEFAULT_CASES = (
    "llama3-8b:8x8:none,llama3-8b:8x8:80GiB,llama3-8b:8:none,llama3-8b:8:80GiB,llama3-8b:2x8:none,"
    "llama3-8b:2x8:80GiB,llama3-70b:8x8:none,llama3-70b:4x4x4:none,gpt2-xl:8:none"
)


def reference(problem: ShardingProblem, method: str, limit: float) -> str:
    """``method`` (toulbar2: branch and bound, highs: HiGHS) alone on the unreduced problem: proof time or gap."""
    core = Core(problem)
    attach_memory(core, problem)
    comp = core.freeze()
    worker = EngineWorker(comp, method, None)
    start = time.monotonic()
    best, lower, proved = None, None, None
    worker.start()
    try:
        while not worker.done and time.monotonic() - start < limit and proved is None:
            for event in worker.poll(0.05):
                if event.kind == "plan":
                    best = event.cost
                elif event.kind == "bound":
                    lower = event.cost
                elif event.kind == "optimal":
                    proved = time.monotonic() - start
    finally:
        worker.stop()
    if proved is not None:
        return f"{proved:.1f}"
    if worker.error:
        return f"error ({worker.error[:40]})"
    if best is None:
        return f"no plan in {limit:g}"
    gap = "?" if lower is None else f"{100 * (best - lower) / max(best, 1):.2g}%"
    return f"gap {gap} at {limit:g}"


def main(argv: list[str] | None = None) -> int:
    """Build each case, solve it, run the references, print one table row per case."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated model:mesh:budget (budget none or e.g. 80GiB)")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds for toulbar2 and HiGHS alone (default 60)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for our solve (default 300)")
    parser.add_argument("--no-reference", action="store_true", help="skip the toulbar2 and HiGHS columns")
    args = parser.parse_args(argv)
    print("| model | mesh | mode | budget | graph nodes | core (nodes/edges/rows) | trace s | build s | first plan s "
          "| proof s | proved by | z3 proof s | trace+build+solve s | toulbar2 alone s | HiGHS alone s |")
    print("|---|---|---|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|", flush=True)
    graphs: dict[str, tuple[object, float]] = {}
    for case in args.cases.split(","):
        name, mesh, budget = case.split(":")
        if name not in graphs:
            began = time.monotonic()
            model, inputs = BUILDERS[name]()
            graphs[name] = trace(model, inputs), time.monotonic() - began
        graph, traced = graphs[name]
        limit = None if budget == "none" else parse_bytes(budget)
        began = time.monotonic()
        mp = build_model_problem(graph, mesh, mode="training", memory_budget=limit)
        built = time.monotonic() - began
        first: list[float] = []
        solution = solve(mp.problem, SolveOptions(timeout=args.timeout),
                         lambda e: first.append(e.elapsed) if isinstance(e, Improved) and not first else None)
        z3 = solution.proof_times.get("z3")
        row = (f"| {name} | {mesh} | training | {budget} | {len(graph)} | {solution.core_nodes}/{solution.core_edges}/"
               f"{solution.core_rows} | {traced:.1f} | {built:.1f} | {first[0]:.2f} | "
               f"{solution.elapsed:.2f} | {solution.proof if solution.status == 'optimal' else f'gap {100 * (solution.gap or 0):.2g}%'} | "
               f"{'-' if z3 is None else f'{z3:.2f}'} | {traced + built + solution.elapsed:.1f} |")
        if args.no_reference:
            row += " - | - |"
        else:
            row += f" {reference(mp.problem, 'toulbar2', args.limit)} | {reference(mp.problem, 'highs', args.limit)} |"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
