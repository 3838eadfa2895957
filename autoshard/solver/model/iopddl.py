"""Read IOPDDL contest files (plain ``.json`` or ``.json.gz``) into a ShardingProblem, and solutions.

The format (ASPLOS 2025 IOPDDL contest)::

    {"problem": {"name": ..., "usage_limit": L,
                 "nodes": {"intervals": [[start, end], ...], "costs": [[...], ...], "usages": [[...], ...]},
                 "edges": {"nodes": [[u, v], ...], "costs": [[...], ...]}}}

Edge cost lists are the (k_u x k_v) matrix flattened row-major. A solution is a JSON list with one
strategy index per node, ``[i, j, ...]``. Every defect in a file is reported as one
AutoshardError line naming the file, the place and the fix.
"""

from __future__ import annotations

import gzip
import itertools
import json
import zlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from autoshard.errors import AutoshardError
from autoshard.solver.model.problem import FORBIDDEN, ShardingProblem

_INT64_MAX = np.iinfo(np.int64).max


def load_problem(path: str | Path) -> ShardingProblem:
    """Read and validate an IOPDDL problem file (``.json`` or ``.json.gz``)."""
    data = _read_json(Path(path))
    return problem_from_json(data, source=str(path))


def problem_from_json(data: Any, source: str = "problem") -> ShardingProblem:
    """Build a validated ShardingProblem from parsed IOPDDL JSON."""
    where = source
    root = _get(data, "problem", dict, where)
    nodes = _get(root, "nodes", dict, f"{where}: problem")
    edges = _get(root, "edges", dict, f"{where}: problem")
    costs = _get(nodes, "costs", list, f"{where}: nodes")
    usages = _get(nodes, "usages", list, f"{where}: nodes")
    intervals = _get(nodes, "intervals", list, f"{where}: nodes")
    edge_nodes = _get(edges, "nodes", list, f"{where}: edges")
    edge_costs = _get(edges, "costs", list, f"{where}: edges")
    n = len(costs)
    for name, seq in (("usages", usages), ("intervals", intervals)):
        if len(seq) != n:
            raise AutoshardError(
                f"{where}: nodes.{name} has {len(seq)} entries but nodes.costs has {n}: give one per node"
            )
    if len(edge_costs) != len(edge_nodes):
        raise AutoshardError(
            f"{where}: edges.nodes has {len(edge_nodes)} entries but edges.costs has {len(edge_costs)}: "
            "give one cost list per edge"
        )
    node_costs = _int_vectors(costs, f"{where}: nodes.costs")
    node_usages = _int_vectors(usages, f"{where}: nodes.usages")
    for i, c in enumerate(node_costs):
        if len(c) == 0:
            raise AutoshardError(f"{where}: node {i} has no strategies: give every node at least one cost")
        if len(node_usages[i]) != len(c):
            raise AutoshardError(
                f"{where}: node {i} has {len(c)} costs but {len(node_usages[i])} usages: give one usage per strategy"
            )
    ivs = _pairs(intervals, f"{where}: nodes.intervals")
    for i, (start, end) in enumerate(ivs):
        if start > end:
            raise AutoshardError(f"{where}: node {i} has interval [{start}, {end}) that ends before it starts")
    pairs = _pairs(edge_nodes, f"{where}: edges.nodes")
    flats = _int_vectors(edge_costs, f"{where}: edges.costs")
    matrices = []
    for k, ((u, v), vec) in enumerate(zip(pairs, flats)):
        if not (0 <= u < n and 0 <= v < n):
            raise AutoshardError(f"{where}: edge {k} joins nodes {u} and {v} but nodes are numbered 0..{n - 1}")
        ku, kv = len(node_costs[u]), len(node_costs[v])
        if len(vec) != ku * kv:
            raise AutoshardError(
                f"{where}: edge {k} ({u}, {v}) has {len(vec)} costs, expected {ku} x {kv} = {ku * kv} "
                "(strategies of u times strategies of v, row-major)"
            )
        matrices.append(vec.reshape(ku, kv))
    limit = root.get("usage_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise AutoshardError(f"{where}: usage_limit is {limit!r}: give an integer or leave it out")
    problem = ShardingProblem(
        node_costs=node_costs,
        node_usages=node_usages,
        intervals=ivs,
        edges=pairs,
        edge_costs=matrices,
        usage_limit=limit,
        name=str(root.get("name", "")),
    )
    try:
        problem.validate()
    except AutoshardError as err:
        raise AutoshardError(f"{where}: {err}") from None
    return problem


def parse_solution(text: str, problem: ShardingProblem, source: str = "solution") -> list[int]:
    """Parse a solution ``[i, j, ...]`` and check it has one in-range strategy per node."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise AutoshardError(f"{source}: not valid JSON ({err}): write [i, j, ...]") from None
    if not isinstance(data, list):
        raise AutoshardError(f"{source}: expected a list of strategy indices [i, j, ...], got {type(data).__name__}")
    try:
        return problem.check_choice(data)
    except AutoshardError as err:
        raise AutoshardError(f"{source}: {err}") from None


def problem_to_json(problem: ShardingProblem) -> dict[str, Any]:
    """The IOPDDL JSON of a problem (forbidden costs written as FORBIDDEN; names are not part of
    the format)."""
    return {
        "problem": {
            "name": problem.name,
            "nodes": {
                "intervals": [[int(a), int(b)] for a, b in problem.intervals],
                "costs": [np.minimum(c, FORBIDDEN).tolist() for c in problem.node_costs],
                "usages": [u.tolist() for u in problem.node_usages],
            },
            "edges": {
                "nodes": [[int(u), int(v)] for u, v in problem.edges],
                "costs": [np.minimum(m, FORBIDDEN).ravel().tolist() for m in problem.edge_costs],
            },
            **({} if problem.usage_limit is None else {"usage_limit": int(problem.usage_limit)}),
        }
    }


def write_problem(problem: ShardingProblem, path: str | Path) -> None:
    """Write ``problem`` as an IOPDDL file (gzip-compressed when the name ends in .gz), so any
    solver can be compared on it; ``load_problem`` reads it back unchanged."""
    path = Path(path)
    data = json.dumps(problem_to_json(problem), separators=(",", ":")).encode()
    if path.suffix == ".gz":
        data = gzip.compress(data, 6)
    try:
        path.write_bytes(data)
    except OSError as err:
        raise AutoshardError(f"cannot write {path}: {err.strerror}: check the path") from None


def format_solution(choice: Sequence[int]) -> str:
    """The contest's solution line: ``[i, j, ...]``."""
    return "[" + ", ".join(str(int(s)) for s in choice) + "]"


def _read_json(path: Path) -> Any:
    """Load JSON from a plain or gzip file, turning every read or parse failure into one line."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise AutoshardError(f"cannot read {path}: {err.strerror}: check the path") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as err:
            raise AutoshardError(f"{path}: broken gzip data ({err}): the file is truncated or corrupt") from None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise AutoshardError(f"{path}: not valid JSON ({err}): the file is truncated or corrupt") from None


def _get(obj: Any, key: str, kind: type, where: str) -> Any:
    """obj[key] checked to be of ``kind``."""
    if not isinstance(obj, dict) or key not in obj:
        raise AutoshardError(f"{where}: missing '{key}': not an IOPDDL problem file")
    value = obj[key]
    if not isinstance(value, kind):
        raise AutoshardError(f"{where}: '{key}' should be a {kind.__name__}, got {type(value).__name__}")
    return value


def _int_vectors(lists: Any, where: str) -> list[np.ndarray]:
    """Lists of non-negative integers as int64 arrays (values beyond int64 are clipped to FORBIDDEN).

    Converted in one numpy call over the concatenation: the large benchmark files hold millions of
    numbers in tens of thousands of lists.
    """
    lengths = []
    for i, values in enumerate(lists):
        if not isinstance(values, list):
            raise AutoshardError(f"{where}[{i}]: expected a list of integers, got {type(values).__name__}")
        lengths.append(len(values))
    flat = list(itertools.chain.from_iterable(lists))
    try:
        arr = np.asarray(flat)
    except (ValueError, TypeError):
        arr = np.asarray(flat, dtype=object)
    if arr.dtype.kind in "iu" or len(flat) == 0:
        out = arr.astype(np.int64)
    elif arr.dtype.kind == "O" and all(isinstance(x, int) and not isinstance(x, bool) for x in flat):
        out = np.array([min(x, FORBIDDEN) if x > _INT64_MAX else x for x in flat], dtype=np.int64)
    elif arr.dtype.kind == "f" and arr.ndim == 1 and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
        out = np.minimum(arr, float(FORBIDDEN)).astype(np.int64)
    else:
        bad = next((x for x in flat if isinstance(x, bool) or not isinstance(x, (int, float))), flat[:1])
        raise AutoshardError(f"{where}: expected integers, found {bad!r}")
    offsets = np.cumsum(lengths)
    negative = np.flatnonzero(out < 0)
    if len(negative):
        i = int(np.searchsorted(offsets, negative[0], side="right"))
        raise AutoshardError(
            f"{where}[{i}]: negative value {int(out[negative[0]])}: costs and usages must be >= 0"
        )
    return np.split(out, offsets[:-1]) if lengths else []


def _pairs(values: Any, where: str) -> list[tuple[int, int]]:
    """A list of two-integer lists such as intervals or edges."""
    for i, value in enumerate(values):
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in value)
        ):
            raise AutoshardError(f"{where}[{i}]: expected a pair of integers [a, b], got {value!r}")
    return [(a, b) for a, b in values]
