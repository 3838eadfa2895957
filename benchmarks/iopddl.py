"""Benchmark autoshard's solver against HiGHS on IOPDDL instances; prints a markdown table.

    python benchmarks/iopddl.py /work/shared/iopddl/asplos-2025-iopddl-*.json.gz [--timeout S] [--no-highs]

For every instance: our cost, wall time (reading the file included), whether it was proved
optimal or the gap to our lower bound, and the ratio to best_known_cost; then the same for HiGHS
(scipy.optimize.milp on the standard linearised ILP of the unreduced problem) under the same time
limit. The time limit defaults to the contest's limit for the instance (best_known.csv).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from autoshard.errors import AutoshardError
from autoshard.iopddl import load_problem
from autoshard.solver import SolveOptions, solve
from autoshard.solver.milp import solve_problem_milp

DEFAULT_BEST_KNOWN = Path("/work/shared/iopddl/best_known.csv")


def read_best_known(path: Path) -> dict[str, tuple[int, float]]:
    """benchmark name -> (best known cost, contest time limit in seconds)."""
    if not path.exists():
        return {}
    with path.open() as f:
        return {row["benchmark"]: (int(row["best_known_cost"]), float(row["timeout_s"])) for row in csv.DictReader(f)}


def instance_name(path: str) -> str:
    """File name without .json / .json.gz."""
    name = Path(path).name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name


def ours(path: str, timeout: float, seed: int) -> dict:
    """Run autoshard's solver on a file within ``timeout`` seconds (loading included)."""
    start = time.monotonic()
    problem = load_problem(path)
    left = max(1.0, timeout - (time.monotonic() - start))
    solution = solve(problem, SolveOptions(timeout=left, seed=seed))
    return {
        "cost": solution.cost,
        "time": time.monotonic() - start,
        "proof": "proved" if solution.status == "optimal" else _gap(solution.gap),
        "core": f"{solution.core_nodes}n/{solution.core_edges}e",
    }


def highs(path: str, timeout: float) -> dict:
    """HiGHS on the unreduced problem within ``timeout`` seconds (loading included)."""
    start = time.monotonic()
    problem = load_problem(path)
    result = solve_problem_milp(problem, max(1.0, timeout - (time.monotonic() - start)))
    gap = None
    if result.cost is not None and result.bound is not None:
        gap = max(0.0, (result.cost - result.bound) / max(abs(result.cost), 1))
    return {
        "cost": result.cost,
        "time": time.monotonic() - start,
        "proof": "proved" if result.optimal else _gap(gap),
    }


def _gap(gap: float | None) -> str:
    return "gap ?" if gap is None else f"gap {100 * gap:.2f}%"


def _ratio(cost: int | None, best: int | None) -> str:
    if cost is None:
        return "no plan"
    if best is None:
        return "-"
    return f"{cost / best:.4f}"


def main(argv: list[str] | None = None) -> int:
    """Run every instance and print the table row by row."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instances", nargs="+", help="IOPDDL problem files (.json or .json.gz)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per instance and solver; default: the contest limit from best_known.csv")
    parser.add_argument("--best-known", type=Path, default=DEFAULT_BEST_KNOWN, help="best_known.csv")
    parser.add_argument("--no-highs", action="store_true", help="skip the HiGHS column")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    best_known = read_best_known(args.best_known)
    header = "| instance | limit s | best known | ours | time s | proved/gap | ratio | core |"
    rule = "|---|---:|---:|---:|---:|---|---:|---|"
    if not args.no_highs:
        header += " HiGHS | time s | proved/gap | ratio |"
        rule += "---:|---:|---|---:|"
    print(header)
    print(rule, flush=True)
    for path in args.instances:
        name = instance_name(path)
        best, limit = best_known.get(name, (None, 60.0))
        timeout = args.timeout if args.timeout is not None else limit
        try:
            mine = ours(path, timeout, args.seed)
        except AutoshardError as err:
            print(f"| {name} | {timeout:g} | {best or '-'} | error: {err} |", flush=True)
            continue
        row = (f"| {name} | {timeout:g} | {best if best is not None else '-'} | {mine['cost']} | {mine['time']:.1f} | "
               f"{mine['proof']} | {_ratio(mine['cost'], best)} | {mine['core']} |")
        if not args.no_highs:
            ref = highs(path, timeout)
            row += f" {ref['cost'] if ref['cost'] is not None else 'none'} | {ref['time']:.1f} | {ref['proof']} | {_ratio(ref['cost'], best)} |"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
