"""``make fuzz``: the long differential test, every model, more random plans, a seed to vary them.

    python -m tests.differential.fuzz --seed 3 --plans 12
    python -m tests.differential.fuzz --models qwen2 t5 --meshes 2x2 --modes training

Prints one line per (model, mesh, mode) with the number of plans run, then one line per plan
that differs from the unsharded model; exits 1 if any did. ``make test`` runs a fixed sample
of the same cases (tests/differential/test_differential.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from tests.differential.harness import findings, plans_for, run_plans, traced_model
from tests.differential.models import MODELS


def main(argv: Sequence[str] | None = None) -> int:
    """Run the differential test over the chosen models, meshes and modes; 1 if any plan failed."""
    p = argparse.ArgumentParser(prog="python -m tests.differential.fuzz", description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), metavar="MODEL",
                   help=f"models to test (default all: {', '.join(MODELS)})")
    p.add_argument("--meshes", nargs="+", default=["2x2", "4"], help="meshes of 4 devices (default 2x2 4)")
    p.add_argument("--modes", nargs="+", default=["training", "inference"], choices=["training", "inference"])
    p.add_argument("--plans", type=int, default=8, help="random plans per model, mesh and mode (default 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random plans (default 0)")
    p.add_argument("--no-optimal", action="store_true", help="skip the optimal plan (no solver run)")
    args = p.parse_args(argv)
    failed = 0
    for name in args.models:
        start = time.perf_counter()
        t = traced_model(name)
        for mesh in args.meshes:
            plans = {}
            for mode in args.modes:
                plans |= plans_for(t, mesh, mode, args.plans, args.seed, optimal=not args.no_optimal)
            lines = findings(plans, run_plans(t, plans))
            failed += len(lines)
            print(f"{name} on {mesh} ({t.graph.frontend}): {len(plans)} plans, {len(lines)} failed "
                  f"({time.perf_counter() - start:.1f}s)", flush=True)
            for line in lines:
                print(f"  {line}", flush=True)
    print(f"{failed} failing plans" if failed else "all plans match the unsharded model")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
