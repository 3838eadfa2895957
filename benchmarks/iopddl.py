"""Benchmark autoshard's solver against HiGHS on IOPDDL instances; prints a markdown table.

    python benchmarks/iopddl.py ../shared/iopddl/asplos-2025-iopddl-*.json.gz [--timeout S] [--no-highs]

For every instance: our cost, the wall time of our solver's whole process (start-up and reading
the file included, as the contest counts it) and its peak RSS (the process and its engine
children), whether it was proved optimal (and by what) or the gap to our lower bound, the ratio
to best_known_cost, the contest winner's cost (benchmarks/data/iopddl_winner.csv), and our
certified lower bound beside the published one (ti2-group/iopddl_experiments' results.db, as
benchmarks/data/iopddl_published_bounds.csv has it; read by iopddl_bounds.py); then the same for HiGHS
(highspy on the standard linearised ILP of the unreduced problem) under the same time
limit. The time limit defaults to the contest's limit for the instance (best_known.csv).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autoshard.errors import AutoshardError
from autoshard.solver.model.iopddl import load_problem, parse_solution
from autoshard.solver.engines.milp import solve_problem_milp

SHARED = Path(os.environ.get("AUTOSHARD_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
"""shared/ beside the repository (as CI has it), or AUTOSHARD_SHARED."""
DEFAULT_BEST_KNOWN = SHARED / "iopddl" / "best_known.csv"
WINNER = Path(__file__).resolve().parent / "data" / "iopddl_winner.csv"


def read_best_known(path: Path) -> dict[str, tuple[int, float]]:
    """benchmark name -> (best known cost, contest time limit in seconds)."""
    if not path.exists():
        return {}
    with path.open() as f:
        return {row["benchmark"]: (int(row["best_known_cost"]), float(row["timeout_s"])) for row in csv.DictReader(f)}


def read_winner(path: Path = WINNER) -> dict[str, int]:
    """benchmark name -> the contest winner's cost (comment lines start with #)."""
    with path.open() as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return {row["benchmark"]: int(row["winner_cost"]) for row in rows}


def instance_name(path: str) -> str:
    """File name without .json / .json.gz."""
    name = Path(path).name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name


def ours(path: str, timeout: float, seed: int) -> dict:
    """Run ``python -m autoshard.solve`` on a file as the contest would: one process whose
    whole wall time (start-up and reading included) is limited; its plan is checked here."""
    command = [sys.executable, "-m", "autoshard.solve", path, "--timeout", str(timeout), "--seed", str(seed)]
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak RSS (KiB on Linux)
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read().strip()
    lines = stdout.strip().splitlines()
    if child.returncode != 0 or not lines:
        raise AutoshardError(stderr.splitlines()[-1] if stderr else "no output")
    problem = load_problem(path)
    ev = problem.evaluate(parse_solution(lines[-1], problem))
    if not ev.feasible:
        raise AutoshardError("the printed plan does not fit or uses a forbidden strategy")
    summary = next((line for line in lines if line.startswith(("optimal:", "time limit:"))), "")
    gap = re.search(r"gap ([0-9.]+%)", summary)
    by = re.search(r"proved by (\S+)", summary)
    proof = f"proved ({by.group(1)})" if by else f"gap {gap.group(1) if gap else '?'}"
    lower = re.search(r"lower bound (\d+)", summary)
    bound = ev.cost if by else int(lower.group(1)) if lower else None
    core = re.search(r"-> (\d+) / (\d+)", stdout)
    return {"cost": ev.cost, "time": wall, "proof": proof, "rss": usage.ru_maxrss / 1024, "bound": bound,
            "core": f"{core.group(1)}n/{core.group(2)}e" if core else "-"}


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
    from iopddl_bounds import read_published  # it imports this module: read here, not at the top

    best_known = read_best_known(args.best_known)
    winner = read_winner()
    published = read_published()
    header = ("| instance | limit s | best known | winner | ours | ratio | time s | peak RSS MB | proved/gap | core "
              "| our bound | published bound |")
    rule = "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|"
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
        row = (f"| {name} | {timeout:g} | {best if best is not None else '-'} | {winner.get(name, 'not available')} | {mine['cost']} | "
               f"{_ratio(mine['cost'], best)} | {mine['time']:.1f} | {mine['rss']:.0f} | {mine['proof']} | {mine['core']} | "
               f"{mine['bound'] if mine['bound'] is not None else 'none'} | {published.get(name, 'not published')} |")
        if not args.no_highs:
            ref = highs(path, timeout)
            row += f" {ref['cost'] if ref['cost'] is not None else 'none'} | {ref['time']:.1f} | {ref['proof']} | {_ratio(ref['cost'], best)} |"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
