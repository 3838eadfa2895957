"""Compile the solver's numba loops ahead of use: ``python -m autoshard.solver.precompile``.

numba compiles a loop on its first call and caches the machine code beside the source
(``__pycache__``); every later process loads it in a fraction of the time compiling them all
takes, which a solve under a contest limit should not pay (measured: see benchmarks/README.md,
"Solver throughput"), so ``make`` runs this once after installing.
"""

from __future__ import annotations

import time

import numpy as np

from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver.core.reduced import FrozenCore, Core
from autoshard.solver.core.evaluation import Expansion, FlatProblem
from autoshard.solver.core.local_search import Search
from autoshard.solver.bounds.relaxed_minimiser import relaxed_lagrangian
from autoshard.solver.search.lns import NeighbourhoodSearch, node_costs, restrict
from autoshard.solver.core.rows import attach_memory, drop_dominated_rows
from autoshard.solver.core.reduce import reduce_core
from autoshard.solver.bounds.trws import MessagePassing


def tiny_core() -> FrozenCore:
    """Two nodes of two strategies, one edge, one memory row: every loop has something to do."""
    return FrozenCore(
        nodes=[0, 1],
        costs=[np.array([1, 2], dtype=np.int64), np.array([3, 1], dtype=np.int64)],
        edges=[(0, 1, np.array([[0, 2], [2, 0]], dtype=np.int64))],
        capacity=np.array([3], dtype=np.int64),
        segments=[[(0, 1, np.array([2, 1], dtype=np.int64))], [(0, 1, np.array([1, 2], dtype=np.int64))]],
    )


def tiny_problem(usage_limit: int | None) -> ShardingProblem:
    """The same two nodes as a problem, live over overlapping intervals (two memory rows)."""
    costs = [np.array([1, 2], dtype=np.int64), np.array([3, 1], dtype=np.int64)]
    usages = [np.array([2, 1], dtype=np.int64), np.array([1, 2], dtype=np.int64)]
    return ShardingProblem(costs, usages, [(0, 2), (1, 3)], [(0, 1)], [np.array([[0, 2], [2, 0]], dtype=np.int64)],
                           usage_limit=usage_limit, name="tiny")


def warm() -> float:
    """Call every compiled loop once on ``tiny_core``; returns the seconds it took."""
    began = time.monotonic()
    comp, rng = tiny_core(), np.random.default_rng(0)
    lag = relaxed_lagrangian(comp, rng)
    lag.lam[:] = 1.0
    penalty = lag.penalties()
    mp = MessagePassing(comp)
    mp.sweep(penalty)
    mp.bound(penalty)
    x = mp.primal(penalty)
    Search(comp, x, rng, penalty=penalty).descend(time.monotonic() + 10.0)
    Search(comp, x, rng).descend(time.monotonic() + 10.0)
    comp.cost(x)
    comp.profile(x)
    node_costs(comp, x)
    restrict(comp, x, NeighbourhoodSearch(comp, rng).neighbourhood(x, 1))
    reduce_core(Core(tiny_problem(None)))  # the separability and dominance tests
    problem = tiny_problem(3)
    core = Core(problem)
    attach_memory(core, problem)
    drop_dominated_rows(core)
    reduce_core(core)  # dominance with memory segments
    frozen = core.freeze()  # an offer's expansion and evaluation
    FlatProblem.of(problem).evaluate(Expansion.of(core, frozen.nodes).expand(np.zeros(frozen.n, dtype=np.int64)))
    return time.monotonic() - began


if __name__ == "__main__":
    print(f"autoshard: the solver's compiled loops are ready ({warm():.1f} s)")
