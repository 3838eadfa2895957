"""Random small problems and a brute-force reference for the solver tests."""

from __future__ import annotations

import itertools
import os
import select
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from autoshard.solver.model.problem import FORBIDDEN, ShardingProblem
from autoshard.solver.core.reduced import INF, FrozenCore, Core
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.core.reduce import NoAssignment, reduce_core

SHARED = Path(os.environ.get("AUTOSHARD_SHARED", Path(__file__).resolve().parents[2].parent / "shared"))
"""The shared/ folder beside the repository (CI clones the repository with shared/ beside it);
AUTOSHARD_SHARED points elsewhere, e.g. from a git worktree."""
EXAMPLE = SHARED / "iopddl" / "example.json"
needs_shared = pytest.mark.skipif(not EXAMPLE.is_file(), reason=f"needs {EXAMPLE} (shared/ beside the repository, "
                                  "or AUTOSHARD_SHARED pointing to it)")
"""Marks a test that reads the IOPDDL example from shared/: skipped, with the reason, without it."""


HANG = 60.0
"""Seconds after which a child that has not exited counts as hung: a guard against a test that
would never end, not a measure (the children waited on here exit in well under a second)."""


def exited(pid: int, guard: float = HANG) -> bool:
    """True once process ``pid`` has exited (a zombie has; one already reaped is gone too): its
    pidfd turns readable at exit, so a test waits on that event rather than polling the clock."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], guard)[0])
    finally:
        os.close(fd)


def random_problem(
    rng: np.random.Generator,
    nodes: int,
    max_k: int = 4,
    edge_prob: float = 0.4,
    forbid_prob: float = 0.15,
    memory: bool = True,
    functional_prob: float = 0.2,
) -> ShardingProblem:
    """A random problem with forbidden entries, functional edges and (optionally) a memory limit."""
    ks = [int(rng.integers(1, max_k + 1)) for _ in range(nodes)]
    costs = [rng.integers(0, 50, size=k).astype(np.int64) for k in ks]
    for c in costs:
        c[rng.random(len(c)) < forbid_prob / 2] = FORBIDDEN
    usages = [rng.integers(0, 20, size=k).astype(np.int64) for k in ks]
    intervals = []
    for _ in range(nodes):
        start = int(rng.integers(0, 10))
        intervals.append((start, start + int(rng.integers(0, 6))))
    edges, mats = [], []
    for u in range(nodes):
        for v in range(u + 1, nodes):
            if rng.random() < edge_prob:
                a, b = (u, v) if rng.random() < 0.5 else (v, u)
                m = rng.integers(0, 60, size=(ks[a], ks[b])).astype(np.int64)
                if rng.random() < functional_prob:
                    m[:] = FORBIDDEN
                    m[np.arange(ks[a]), rng.integers(0, ks[b], size=ks[a])] = rng.integers(0, 30, size=ks[a])
                else:
                    m[rng.random(m.shape) < forbid_prob] = FORBIDDEN
                edges.append((a, b))
                mats.append(m)
    limit = None
    if memory:
        low = _peak(usages, intervals, [int(np.argmin(u)) for u in usages])
        high = _peak(usages, intervals, [int(np.argmax(u)) for u in usages])
        limit = int(rng.integers(low, high + 1))
    return ShardingProblem(costs, usages, intervals, edges, mats, usage_limit=limit, name="random")


def _peak(usages, intervals, pick) -> int:
    top = max((e for _, e in intervals), default=0) + 1
    level = np.zeros(top + 1, dtype=np.int64)
    for (s, e), u, p in zip(intervals, usages, pick):
        level[s:e] += u[p]
    return int(level.max())


def brute_force(problem: ShardingProblem) -> tuple[int, list[int]] | None:
    """The optimal (cost, choice) among allowed, fitting assignments, or None when there is none;
    of equal optima, the first in ``itertools.product`` order. Every assignment is priced at once
    in numpy (a row per assignment, the last node varying fastest), the answer's cost and fit then
    confirmed by ``problem.evaluate``."""
    ks = [problem.num_strategies(i) for i in range(problem.num_nodes)]
    choices = np.indices(ks, dtype=np.int8).reshape(len(ks), -1)
    allowed = np.ones(choices.shape[1], dtype=bool)
    cost = np.zeros(choices.shape[1], dtype=np.int64)
    for c, x in zip(problem.node_costs, choices):
        picked = c[x]
        allowed &= picked < FORBIDDEN
        cost += np.where(picked < FORBIDDEN, picked, 0)  # 10**18 twice would overflow int64
    for (u, v), m in zip(problem.edges, problem.edge_costs):
        picked = m[choices[u], choices[v]]
        allowed &= picked < FORBIDDEN
        cost += np.where(picked < FORBIDDEN, picked, 0)
    if problem.usage_limit is not None:
        live = [(i, start, end) for i, (start, end) in enumerate(problem.intervals) if start < end]
        for t in sorted({start for _, start, _ in live}):  # the level only rises where a node starts
            level = np.zeros(choices.shape[1], dtype=np.int64)
            for i, start, end in live:
                if start <= t < end:
                    level += problem.node_usages[i][choices[i]]
            allowed &= level <= problem.usage_limit
    if not allowed.any():
        return None
    best = int(np.flatnonzero(allowed)[np.argmin(cost[allowed])])
    choice = [int(x) for x in choices[:, best]]
    ev = problem.evaluate(choice)
    assert ev.feasible and ev.cost == int(cost[best]), "numpy's pricing disagrees with ShardingProblem.evaluate"
    return ev.cost, choice


def large_problem(rng: np.random.Generator, nodes: int, max_k: int = 8) -> ShardingProblem:
    """A model-like problem of many nodes: each node joins one to three recent ones, no forbidden
    entries, intervals along a time axis, and a memory limit a third of the way from the smallest
    peak to the largest (so it binds but the smallest-memory plan fits)."""
    ks = rng.integers(2, max_k + 1, size=nodes)
    costs = [rng.integers(0, 1000, size=k).astype(np.int64) for k in ks]
    usages = [rng.integers(0, 100, size=k).astype(np.int64) for k in ks]
    intervals = []
    for i in range(nodes):
        start = i // 4
        intervals.append((start, start + int(rng.integers(1, 40))))
    edges, mats = [], []
    for v in range(1, nodes):
        for u in set(rng.integers(max(0, v - 8), v, size=int(rng.integers(1, 4))).tolist()):
            edges.append((u, v))
            mats.append(rng.integers(0, 1000, size=(ks[u], ks[v])).astype(np.int64))
    low = _peak(usages, intervals, [int(np.argmin(u)) for u in usages])
    high = _peak(usages, intervals, [int(np.argmax(u)) for u in usages])
    return ShardingProblem(costs, usages, intervals, edges, mats, usage_limit=low + (high - low) // 3, name="large")


def infeasible_beyond_the_smallest_peak_bound() -> ShardingProblem:
    """Six nodes whose limit passes the smallest-peak check, yet no plan fits: toulbar2 reports
    nothing on it and HiGHS's verdict is no proof with memory rows, so z3 must decide."""
    rng = np.random.default_rng(271)
    return random_problem(rng, int(rng.integers(1, 7)), memory=True)


def core_of(seed: int, nodes: int | None = 7, memory: bool = True) -> FrozenCore | None:
    """The reduced core of a small random problem with forbidden pairs and, if ``memory``, a memory
    limit (None: no plan); ``nodes`` None draws 2-7 nodes from the seed."""
    rng = np.random.default_rng(seed)
    if nodes is None:
        nodes = int(rng.integers(2, 8))
    problem = random_problem(rng, nodes, max_k=4, memory=memory, forbid_prob=0.1)
    core = Core(problem)
    attach_memory(core, problem)
    try:
        reduce_core(core)
    except NoAssignment:
        return None
    return core.freeze()


def optimum(comp: FrozenCore) -> int | None:
    """The core's optimum by enumeration (None when nothing fits)."""
    costs = [comp.cost(list(x)) for x in itertools.product(*[range(len(c)) for c in comp.costs])
             if comp.is_feasible(list(x))]
    return min(costs, default=None)


def memory_cores(seeds: range, nodes: int) -> Iterator[tuple[int, FrozenCore, int]]:
    """(seed, core, optimum by enumeration) for the seeds whose random ``nodes``-node core has
    memory rows and at least one plan that fits."""
    for seed in seeds:
        comp = core_of(seed, nodes=nodes)
        if comp is None or comp.n == 0 or not comp.has_memory:
            continue
        best = optimum(comp)
        if best is not None and best < INF:
            yield seed, comp, best


class FakeClock:
    """A clock to inject where the solver takes one (procs/clock.py): it reads ``now`` and then
    moves on by ``step`` seconds, so deadlines pass after a known number of readings and never
    because the machine was slow."""

    def __init__(self, now: float = 1000.0, step: float = 0.0) -> None:
        self.now, self.step = now, step

    def __call__(self) -> float:
        now = self.now
        self.now += self.step
        return now
