"""Anytime behaviour under short limits: a feasible plan on time, also on large problems."""

from __future__ import annotations

import gzip
import importlib.util
import json
import time
from pathlib import Path

import numpy as np

from autoshard.solver.model.iopddl import load_problem, problem_from_json
from autoshard.solver import SolveOptions, solve

from tests.solver.helpers import EXAMPLE, large_problem, needs_shared

SYNTHETIC = Path(__file__).parents[2] / "benchmarks" / "synthetic_iopddl.py"


def test_short_limit_on_a_large_problem_returns_a_fitting_plan_on_time():
    """The LP (HiGHS ignores its time limit while it builds the model), the Lagrangian set-up and
    the engines' teardown all end with the limit: the call returns (a generous margin for a loaded
    machine; how close to the limit is benchmarks/iopddl.py's measurement) with a fitting plan."""
    problem = large_problem(np.random.default_rng(0), 4000)
    start = time.monotonic()
    solution = solve(problem, SolveOptions(timeout=3.0))
    elapsed = time.monotonic() - start
    assert elapsed < 3.0 + 7.0, f"{elapsed:.2f} s; phases past the deadline: {solution.overruns}"
    assert solution.cost is not None and problem.evaluate(solution.choice).feasible
    assert solution.cost == problem.evaluate(solution.choice).cost


def test_a_tiny_limit_still_gives_the_greedy_plan():
    """Reductions are cut short and the rest is skipped, but the minimum-memory start is kept."""
    problem = large_problem(np.random.default_rng(1), 1500)
    solution = solve(problem, SolveOptions(timeout=0.3))
    assert solution.cost is not None and problem.evaluate(solution.choice).feasible


def _synthetic():
    spec = importlib.util.spec_from_file_location("synthetic_iopddl", SYNTHETIC)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_shared
def test_synthetic_union_is_feasible_and_keeps_the_tightness(tmp_path):
    source = json.loads(EXAMPLE.read_text())
    one = load_problem(EXAMPLE)
    problem = problem_from_json(_synthetic().union(source, copies=3, shift=0.0, extra_edges=0))
    assert problem.num_nodes == 3 * one.num_nodes and problem.usage_limit == 3 * one.usage_limit
    assert solve(problem, SolveOptions(timeout=10)).cost == 3 * 445  # each copy at its optimum fits
    denser = problem_from_json(_synthetic().union(source, copies=3, shift=0.0, extra_edges=4))
    assert len(denser.edges) == 3 * len(one.edges) + 4
    assert solve(denser, SolveOptions(timeout=10)).cost is not None
    path = tmp_path / "x.json.gz"
    _synthetic().main([str(EXAMPLE), str(path), "--copies", "2", "--shift", "1"])
    shifted = problem_from_json(json.loads(gzip.decompress(path.read_bytes())))
    assert shifted.usage_limit == one.usage_limit  # one after the other: the same peak
