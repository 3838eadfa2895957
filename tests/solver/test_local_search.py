"""Local search: the vectorised repair makes exactly the moves of a plain per-strategy reference."""

from __future__ import annotations

import time

import numpy as np
import pytest

from autoshard.solver.core.reduced import INF, FrozenCore, Core
from autoshard.solver.core.local_search import Search
from autoshard.solver.core.rows import attach_memory

from tests.solver.helpers import random_problem


def compact(seed: int, nodes: int) -> FrozenCore:
    problem = random_problem(np.random.default_rng(seed), nodes, max_k=5, forbid_prob=0.1)
    core = Core(problem)
    attach_memory(core, problem)
    return core.freeze()


def reference_repair(comp: FrozenCore, x: list[int]) -> list[int]:
    """On the worst row, the (node, strategy) of least extra cost per unit freed, first in node
    then strategy order, until every row fits or no move frees memory there."""
    x = list(x)
    while comp.overflow(x) > 0:
        slack = comp.capacity - comp.profile(x)
        row = int(np.argmin(slack))
        best = None
        for i in range(comp.n):
            covering = [u for start, stop, u in comp.segments[i] if start <= row < stop]
            if not covering:
                continue
            local = [min(int(comp.costs[i][s]) + sum(int(m[s, x[j]]) for j, m in comp.nbrs[i]), INF)
                     for s in range(len(comp.costs[i]))]
            for s in range(len(local)):
                freed = sum(int(u[x[i]]) - int(u[s]) for u in covering)
                if freed <= 0 or local[s] >= INF:
                    continue
                score = max(float(local[s]) - float(local[x[i]]), 0.0) / max(freed, 1)
                if best is None or score < best[0]:
                    best = (score, i, s)
        if best is None:
            return x
        x[best[1]] = best[2]
    return x


@pytest.mark.parametrize("seed", range(12))
def test_repair_moves_as_the_reference_does(seed):
    comp = compact(seed, 9)
    if comp.capacity is None or not len(comp.capacity):
        pytest.skip("no memory rows")
    rng = np.random.default_rng(seed)
    # every node on its most memory: the rows overflow whenever anything can
    x = [int(np.argmax(sum(u for _, _, u in comp.segments[i]))) if comp.segments[i] else 0 for i in range(comp.n)]
    search = Search(comp, np.array(x), rng)
    fits = search.repair(time.monotonic() + 10)
    assert search.x.tolist() == reference_repair(comp, x)
    assert fits == (comp.overflow(search.x.tolist()) == 0 and comp.cost(search.x) < INF)
    if comp.cost(search.x) < INF:
        assert search.total == comp.cost(search.x)  # the running cost stayed exact
