"""Our certified lower bounds on IOPDDL instances beside the published ones; prints a markdown table.

    python benchmarks/iopddl_bounds.py DIR/asplos-2025-iopddl-*.json.gz [--timeout S] [--seed N]

Per instance, one ``python -m autoshard.solve`` process under the contest's limit (best_known.csv,
as benchmarks/iopddl.py runs it): our certified integer lower bound (the proved cost when proved
optimal), the published lower bound (benchmarks/data/iopddl_published_bounds.csv: ti2-group's
toulbar2 Lagrangian ascent then Gurobi, hours on 18-32 threads), the ratio of ours to theirs
(at least 1 is as good), our plan's cost, the best known cost and the whole process's wall time.
A closing line counts the instances where ours is at least the published bound.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

from iopddl import DEFAULT_BEST_KNOWN, instance_name, ours, read_best_known

from autoshard.errors import AutoshardError

PUBLISHED = Path(__file__).resolve().parent / "data" / "iopddl_published_bounds.csv"


def read_published(path: Path = PUBLISHED) -> dict[str, float]:
    """benchmark name -> the published lower bound (a float; comment lines start with #)."""
    with path.open() as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return {row["benchmark"]: float(row["published_lower_bound"]) for row in rows}


def at_least(bound: int | None, published: float | None) -> bool:
    """Whether our integer bound is as good as the published float one: costs are integers, so a
    published bound v proves no more than ceil(v)."""
    return bound is not None and published is not None and bound >= math.ceil(published)


def main(argv: list[str] | None = None) -> int:
    """Run every instance, print its row as it ends, then the count of bounds at least theirs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instances", nargs="+", help="IOPDDL problem files (.json or .json.gz)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per instance; default: the contest limit from best_known.csv")
    parser.add_argument("--best-known", type=Path, default=DEFAULT_BEST_KNOWN, help="best_known.csv")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    best_known = read_best_known(args.best_known)
    published = read_published()
    print("| instance | limit s | our bound | published bound | ours / published | our cost | best known "
          "| cost / best | time s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    good = 0
    for path in args.instances:
        name = instance_name(path)
        best, limit = best_known.get(name, (None, 60.0))
        timeout = args.timeout if args.timeout is not None else limit
        theirs = published.get(name)
        try:
            mine = ours(path, timeout, args.seed)
        except AutoshardError as err:
            print(f"| {name} | {timeout:g} | error: {err} |", flush=True)
            continue
        bound = mine["bound"]
        good += at_least(bound, theirs)
        ratio = f"{bound / theirs:.4f}" if bound is not None and theirs else "-"
        to_best = f"{mine['cost'] / best:.4f}" if best else "-"
        print(f"| {name} | {timeout:g} | {bound if bound is not None else 'none'} | "
              f"{theirs if theirs is not None else 'not published'} | {ratio} | {mine['cost']} | "
              f"{best if best is not None else '-'} | {to_best} | {mine['time']:.1f} |", flush=True)
    print(f"\nours at least the published bound on {good} of {len(args.instances)} instances")
    return 0


if __name__ == "__main__":
    sys.exit(main())
