"""The compiled dominance test (reduce.prune_dominated): every strategy it drops is never better
than one it keeps, whatever the neighbours pick (enumerated), and it drops what the array
formulation of the same test drops."""

from __future__ import annotations

import itertools

import numpy as np

from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver.core.reduced import INF, Core
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.core.reduce import _SAFE, prune_dominated

from tests.solver.helpers import random_problem


def array_formulation(core: Core, v: int) -> np.ndarray | None:
    """The same test written over whole k x k x k_w arrays (the formulation before it was
    compiled): total[a, b] = c[b] - c[a] + sum over edges of max over the t a allows of
    m[b,t] - m[a,t]; b is no dominator of a where it forbids such a t or uses more memory."""
    k, c = core.k(v), core.costs[v]
    total = c[None, :] - c[:, None]
    blocked = np.repeat((c >= INF)[None, :], k, axis=0)
    for m in core.adj[v].values():
        fa = (m < INF).astype(np.float32)
        blocked |= (fa @ fa.T) < fa.sum(axis=1)[:, None]
        gap = (m[None, :, :] - np.where(fa > 0, m, 4 * INF)[:, None, :]).max(axis=2)
        blocked |= np.abs(gap) > _SAFE
        total += gap
    for seg in core.segments[v]:
        blocked |= seg.usage[None, :] > seg.usage[:, None]
    dominated = ~blocked & (total <= 0)
    np.fill_diagonal(dominated, False)
    if not dominated.any():
        return None
    keep = np.ones(k, dtype=bool)
    for a in np.flatnonzero(dominated.any(axis=1)):
        if (dominated[a] & keep).any():
            keep[a] = False
    return keep


def never_better(core: Core, v: int, a: int, b: int) -> bool:
    """Enumerated: for every pick of v's neighbours where strategy a is allowed, b is allowed and
    costs no more, and b uses no more memory than a in any segment."""
    if any(seg.usage[b] > seg.usage[a] for seg in core.segments[v]):
        return False
    neighbours = list(core.adj[v].values())
    for picks in itertools.product(*[range(m.shape[1]) for m in neighbours]):
        cost_a = [int(core.costs[v][a])] + [int(m[a, t]) for m, t in zip(neighbours, picks)]
        cost_b = [int(core.costs[v][b])] + [int(m[b, t]) for m, t in zip(neighbours, picks)]
        if max(cost_a) >= INF:
            continue
        if max(cost_b) >= INF or sum(cost_b) > sum(cost_a):
            return False
    return True


def test_dropped_strategies_are_never_better_than_a_kept_one():
    tested = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        problem = random_problem(rng, 6, max_k=5, edge_prob=0.5, functional_prob=0.0, memory=seed % 2 == 0)
        core = Core(problem)
        attach_memory(core, problem)
        for v in sorted(core.alive):
            keep, reference = prune_dominated(core, v), array_formulation(core, v)
            assert (keep is None) == (reference is None)
            if keep is None:
                continue
            tested += 1
            assert keep.tolist() == reference.tolist()
            for a in np.flatnonzero(~keep):
                assert any(never_better(core, v, int(a), int(b)) for b in np.flatnonzero(keep))
    assert tested >= 40  # nodes where something was dropped (not a vacuous check)


def test_equal_strategies_keep_the_last_and_a_forbidden_partner_blocks():
    """Two equal strategies: the last stays (each is dropped for a later one still kept). A
    strategy that forbids a neighbour's pick the other allows dominates nothing, however cheap."""
    costs = [np.array([5, 5, 0], dtype=np.int64), np.array([0, 0], dtype=np.int64)]
    m = np.array([[1, 2], [1, 2], [0, INF]], dtype=np.int64)
    problem = ShardingProblem(costs, [np.zeros(3, dtype=np.int64), np.zeros(2, dtype=np.int64)], [(0, 0)] * 2,
                              [(0, 1)], [m], usage_limit=None, name="equal")
    core = Core(problem)
    assert prune_dominated(core, 0).tolist() == [False, True, True]
