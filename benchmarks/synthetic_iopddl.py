"""Large synthetic IOPDDL instances from a real one: disjoint unions of shifted copies.

    python benchmarks/synthetic_iopddl.py S.json.gz out.json.gz --copies 2 --shift 0.5 --extra-edges 20000

Stand-ins for the contest's hidden instances (up to 65k nodes / 103k edges, some with 60 s
limits), built without looking at them: copy c of the source has its node ids offset by c * n and
its intervals shifted by ``c * shift * span`` (shift 0: the copies run at the same times, 1: one
after the other). ``--extra-edges`` copies randomly chosen edges (u, v) of the source onto
(u in copy a, v in copy b), a != b, with the same cost matrix, to reach the denser graphs of the
suite. The usage limit keeps the source's tightness: limit / (the lower-bound peak of per-node
smallest usages) is the same as the source's. With shift 0 every copy taking the same fitting
plan of the source fits and avoids forbidden entries, so the instance is feasible; with other
shifts feasibility is likely, not guaranteed (check with the solver).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def union(
    source: dict[str, Any], copies: int, shift: float, extra_edges: int, seed: int = 0
) -> dict[str, Any]:
    """The IOPDDL JSON of ``copies`` shifted copies of ``source`` plus ``extra_edges`` cross edges."""
    prob = source["problem"]
    nodes, edges = prob["nodes"], prob["edges"]
    n = len(nodes["costs"])
    intervals = np.array(nodes["intervals"], dtype=np.int64).reshape(-1, 2)
    span = int(intervals.max() - intervals.min()) if n else 0
    offsets = [int(round(c * shift * span)) for c in range(copies)]
    out_intervals, out_pairs, out_edge_costs = [], [], []
    for c, off in enumerate(offsets):
        out_intervals += (intervals + off).tolist()
        out_pairs += [[u + c * n, v + c * n] for u, v in edges["nodes"]]
        out_edge_costs += edges["costs"]
    rng = np.random.default_rng(seed)
    if copies > 1 and edges["nodes"]:
        for e in rng.integers(0, len(edges["nodes"]), size=extra_edges):
            a, b = rng.choice(copies, size=2, replace=False)
            u, v = edges["nodes"][int(e)]
            out_pairs.append([u + int(a) * n, v + int(b) * n])
            out_edge_costs.append(edges["costs"][int(e)])
    usages = nodes["usages"]
    limit = prob.get("usage_limit")
    if limit is not None:
        low = np.array([min(u) if u else 0 for u in usages], dtype=np.int64)
        one = _peak(intervals, low, [0])
        many = _peak(intervals, low, offsets)
        limit = int(limit) * copies if one == 0 else int(round(int(limit) * many / one))
    return {
        "problem": {
            "name": f"{prob.get('name', 'problem')}x{copies}",
            "nodes": {
                "intervals": out_intervals,
                "costs": nodes["costs"] * copies,
                "usages": usages * copies,
            },
            "edges": {"nodes": out_pairs, "costs": out_edge_costs},
            "usage_limit": limit,
        }
    }


def _peak(intervals: np.ndarray, usage: np.ndarray, offsets: list[int]) -> int:
    """Peak of the summed usage profile of copies shifted by ``offsets`` (half-open intervals)."""
    starts = np.concatenate([intervals[:, 0] + off for off in offsets])
    ends = np.concatenate([intervals[:, 1] + off for off in offsets])
    weights = np.tile(usage, len(offsets))
    times = np.unique(np.concatenate([starts, ends]))
    diff = np.zeros(len(times) + 1, dtype=np.int64)
    np.add.at(diff, np.searchsorted(times, starts), weights)
    np.add.at(diff, np.searchsorted(times, ends), -weights)
    return int(np.cumsum(diff).max(initial=0))


def main(argv: list[str] | None = None) -> int:
    """Read the source, write the union (gzip when the output name ends in .gz)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="IOPDDL problem file (.json or .json.gz)")
    parser.add_argument("output", type=Path, help="where to write the union (.json or .json.gz)")
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--shift", type=float, default=0.0, help="time shift between copies, in source spans")
    parser.add_argument("--extra-edges", type=int, default=0, help="cross-copy edges to add")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    raw = args.source.read_bytes()
    source = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    result = union(source, args.copies, args.shift, args.extra_edges, args.seed)
    data = json.dumps(result, separators=(",", ":")).encode()
    args.output.write_bytes(gzip.compress(data, 6) if args.output.suffix == ".gz" else data)
    p = result["problem"]
    print(f"{args.output}: {len(p['nodes']['costs'])} nodes, {len(p['edges']['nodes'])} edges, "
          f"usage limit {p['usage_limit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
