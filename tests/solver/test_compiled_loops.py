"""The solver's compiled (numba) loops against plain references on random cores: TRW-S's message
updates, bound and primal, the local search's descent, the core's cost, memory profile and
Lagrangian penalties."""

from __future__ import annotations

import itertools
import time
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.solver.core.flat_core import views
from autoshard.solver.core.reduced import INF, FrozenCore, Core
from autoshard.solver.core.local_search import Search
from autoshard.solver.bounds.relaxed_minimiser import relaxed_lagrangian
from autoshard.solver.search.lns import node_costs
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.bounds.trws import _CAP, MessagePassing

from tests.solver.helpers import random_problem


def compact(seed: int, nodes: int, forbid: float = 0.1) -> FrozenCore:
    problem = random_problem(np.random.default_rng(seed), nodes, max_k=5, forbid_prob=forbid)
    core = Core(problem)
    attach_memory(core, problem)
    return core.freeze()


def penalty_of(comp: FrozenCore, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.random(len(c)) * 40 for c in comp.costs]


def joined(penalty: list[np.ndarray] | None) -> np.ndarray | None:
    """A per-node penalty as the solver takes it: flat, node after node."""
    return None if penalty is None else np.concatenate(penalty)


def as_float(m: np.ndarray) -> np.ndarray:
    """An int64 edge matrix as TRW-S prices it: float64, forbidden entries at +inf."""
    return np.where(m < INF, m.astype(np.float64), np.inf)


def reference_sweep(mp: MessagePassing, penalty: list[np.ndarray] | None) -> None:
    """One forward and one backward TRW-S pass, message by message in numpy."""
    n = mp.comp.n
    for forward in (True, False):
        for i in range(n) if forward else range(n - 1, -1, -1):
            hat = mp.theta[i] if penalty is None else mp.theta[i] + penalty[i]
            for e, _, is_u in mp.inc[i]:
                hat = hat + (mp.to_u[e] if is_u else mp.to_v[e])
            for e, j, is_u in mp.inc[i]:
                if (j > i) != forward:
                    continue
                m = as_float(mp.edges[e][2])
                if is_u:
                    msg = np.minimum(((mp.gamma[i] * hat - mp.to_u[e])[:, None] + m).min(axis=0), _CAP)
                    mp.to_v[e][:] = msg - msg.min()
                else:
                    msg = np.minimum(((mp.gamma[i] * hat - mp.to_v[e])[None, :] + m).min(axis=1), _CAP)
                    mp.to_u[e][:] = msg - msg.min()


def reference_parts(mp: MessagePassing, penalty: list[np.ndarray] | None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every node's reparametrised costs, and every edge's part of them: its matrix less the
    messages plus an even split of its ends' reparametrised costs."""
    hats = []
    for i in range(mp.comp.n):
        hat = mp.theta[i] if penalty is None else mp.theta[i] + penalty[i]
        for e, _, is_u in mp.inc[i]:
            hat = hat + (mp.to_u[e] if is_u else mp.to_v[e])
        hats.append(hat)
    parts = [(as_float(m) + (hats[u] / len(mp.inc[u]) - mp.to_u[e])[:, None])
             + (hats[v] / len(mp.inc[v]) - mp.to_v[e])[None, :] for e, (u, v, m) in enumerate(mp.edges)]
    return hats, parts


def reference_bound(mp: MessagePassing, penalty: list[np.ndarray] | None) -> float:
    """The split bound: isolated nodes' minima plus each edge part's minimum."""
    hats, parts = reference_parts(mp, penalty)
    total = sum(float(hats[i].min()) for i in range(mp.comp.n) if not mp.inc[i])
    return total + sum(float(part.min()) for part in parts)


def reference_pair_terms(mp: MessagePassing, penalty: list[np.ndarray] | None) -> dict[tuple[int, int, int], int]:
    """The cut's pair weights: each edge part's excess over its minimum, floored below by the
    rounding margin, keyed by edge and the pair in the edge's own orientation."""
    weights = {}
    for e, part in enumerate(reference_parts(mp, penalty)[1]):
        low = float(part.min())
        excess = np.floor(np.where(np.isfinite(part) & (part < 1e250), part - low, 0.0)
                          - 1e-9 * (np.abs(part) + abs(low)) - 1e-6)
        for s, t in zip(*np.nonzero(excess >= 1)):
            key = (e, int(t), int(s)) if mp.flipped[e] else (e, int(s), int(t))
            weights[key] = int(excess[s, t])
    return weights


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), penalised=st.booleans())
def test_trws_pass_bound_and_primal_match_the_numpy_reference(seed, penalised):
    """Messages equal to the bit after three sweeps; the bound equal up to the rounding of its
    sum (clipped messages of forbidden pairs make terms of 1e234 cancel); the primal decided as
    the reference decides it."""
    comp = compact(seed, int(np.random.default_rng(seed).integers(2, 10)))
    rng = np.random.default_rng(seed)
    penalty = penalty_of(comp, rng) if penalised else None
    ours, ref = MessagePassing(comp), MessagePassing(comp)
    for _ in range(3):
        ours.sweep(joined(penalty))
        reference_sweep(ref, penalty)
    for a, b in zip(ours.to_u + ours.to_v, ref.to_u + ref.to_v):
        np.testing.assert_array_equal(a, b)
    value, scale = ours.bound(joined(penalty))
    expected = reference_bound(ref, penalty)
    if np.isfinite(expected):  # equal within the rounding margin safe_bound allows for
        assert abs(value - expected) <= 1e-12 * (scale + abs(expected)) + 1e-6
    else:
        assert value == expected
    cut = ours.cut(joined(penalty), 0.0)
    assert {(e, s, t): w for e, s, t, w, _ in cut.pair_terms} == reference_pair_terms(ref, penalty)
    x = ours.primal(joined(penalty))
    for i in range(comp.n):  # each node's choice is the cheapest given decided neighbours and messages
        vec = ref.theta[i] if penalty is None else ref.theta[i] + penalty[i]
        for e, j, is_u in ref.inc[i]:
            m = ref.edges[e][2]
            if j < i:
                vec = vec + (m[:, x[j]] if is_u else m[x[j], :])
            else:
                vec = vec + (ref.to_u[e] if is_u else ref.to_v[e])
        assert x[i] == int(np.argmin(vec))


def test_a_deadline_in_the_past_stops_a_sweep_and_leaves_the_messages():
    comp = compact(3, 9)
    mp = MessagePassing(comp)
    assert not mp.sweep(None, time.monotonic() - 1.0)
    assert all(not m.any() for m in mp.to_u + mp.to_v)


def local_costs(comp: FrozenCore, x: np.ndarray, i: int) -> np.ndarray:
    vec = comp.costs[i].copy()
    for j, m in comp.nbrs[i]:
        vec = np.minimum(vec + m[:, x[j]], INF)
    return vec


def reference_descend(comp: FrozenCore, x: np.ndarray, order: np.ndarray, penalty: list[np.ndarray] | None) -> np.ndarray:
    """Nodes off a FIFO queue (``order`` first), each to the first of its cheapest strategies
    (penalised with a penalty; else among those after which every row the node covers fits),
    its neighbours queued when it moves; memory judged on whole profiles."""
    x = x.copy()
    memory = penalty is None and comp.capacity is not None and len(comp.capacity) > 0
    queue, queued = deque(int(i) for i in order), set(int(i) for i in order)
    while queue:
        i = queue.popleft()
        queued.discard(i)
        true = local_costs(comp, x, i)
        vec = true if penalty is None else np.where(true < INF, true + penalty[i], np.inf)
        rows = [r for start, stop, _ in comp.segments[i] for r in range(start, stop)] if memory else []
        if rows:
            allowed = []
            for s in range(len(true)):
                y = x.copy()
                y[i] = s
                allowed.append(bool((comp.profile(y)[rows] <= comp.capacity[rows]).all()))
            vec = np.where(allowed, vec, INF)
        best, now = int(np.argmin(vec)), x[i]
        if true[best] < INF and (true[now] >= INF or vec[best] < vec[now]):
            x[i] = best
            for j, _ in comp.nbrs[i]:
                if j not in queued:
                    queued.add(j)
                    queue.append(j)
    return x


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), penalised=st.booleans())
def test_descent_moves_as_the_reference_does_with_exact_cost_and_slack(seed, penalised):
    """``descend`` ends where the reference ends from the same start and order, with the
    running total and slack of the final plan; a feasible start stays feasible."""
    comp = compact(seed, int(np.random.default_rng(seed).integers(2, 12)), forbid=0.15)
    rng = np.random.default_rng(seed)
    penalty = penalty_of(comp, rng) if penalised else None
    start = np.array([rng.integers(len(c)) for c in comp.costs])
    search = Search(comp, start, np.random.default_rng(seed + 1), penalty=joined(penalty))
    fitted = search.memory and search.feasible  # (a forbidden strategy is left even for one that overflows)
    search.descend(time.monotonic() + 10)
    order = np.random.default_rng(seed + 1).permutation(comp.n)
    np.testing.assert_array_equal(search.x, reference_descend(comp, start, order, penalty))
    assert search.total == comp.cost(search.x)
    if search.memory:
        np.testing.assert_array_equal(search.slack, comp.capacity - comp.profile(search.x))
        assert not fitted or search.feasible


@pytest.mark.parametrize("seed", range(30))
def test_cost_profile_and_penalties_match_plain_sums(seed):
    """FrozenCore.cost (exact Python ints, forbidden terms included), FrozenCore.profile, the nodes'
    shares of a plan's cost (neighbourhood search's sampling weights) and the Lagrangian
    penalties against per-node, per-edge, per-segment sums."""
    comp = compact(seed, 8, forbid=0.3)
    rng = np.random.default_rng(seed)
    for _ in range(10):
        x = [int(rng.integers(len(c))) for c in comp.costs]
        expected = comp.const + sum(int(c[s]) for c, s in zip(comp.costs, x)) \
            + sum(int(m[x[u], x[v]]) for u, v, m in comp.edges)
        assert comp.cost(x) == expected and comp.cost(np.array(x)) == expected
        share = np.array([float(c[s]) for c, s in zip(comp.costs, x)])
        for u, v, m in comp.edges:
            share[u] += 0.5 * float(m[x[u], x[v]])
            share[v] += 0.5 * float(m[x[u], x[v]])
        np.testing.assert_allclose(node_costs(comp, np.array(x)), np.minimum(share, 1e30), rtol=1e-12)
        if comp.capacity is not None:
            usage = np.zeros(len(comp.capacity), dtype=np.int64)
            for segs, s in zip(comp.segments, x):
                for start, stop, u in segs:
                    usage[start:stop] += u[s]
            np.testing.assert_array_equal(comp.profile(x), usage)
    if comp.capacity is None or not len(comp.capacity):
        return
    lag = relaxed_lagrangian(comp, rng)
    lag.lam = rng.random(len(lag.lam)) * 3
    for pen, segs in zip(views(lag.penalties(), comp.arrays.c_off), comp.segments):
        expected = np.zeros(len(pen))
        for start, stop, u in segs:
            expected += u * lag.lam[start:stop].sum()
        np.testing.assert_allclose(pen, expected, rtol=1e-12, atol=1e-9)


def test_cost_of_many_forbidden_terms_is_exact_past_int64():
    """Sums of forbidden terms leave int64's range: the cost falls back to Python ints."""
    comp = FrozenCore(nodes=list(range(12)), costs=[np.array([INF]) for _ in range(12)], edges=[],
                   capacity=None, segments=[[] for _ in range(12)])
    assert comp.cost([0] * 12) == 12 * INF


def test_small_problems_are_unchanged_by_the_layout():
    """Every plan of a small core: the flat cost equals the dict-free definition (brute force)."""
    comp = compact(11, 5, forbid=0.2)
    for x in itertools.product(*[range(len(c)) for c in comp.costs]):
        expected = comp.const + sum(int(c[s]) for c, s in zip(comp.costs, x)) \
            + sum(int(m[x[u], x[v]]) for u, v, m in comp.edges)
        assert comp.cost(list(x)) == expected


def test_edges_sharing_a_large_matrix_pass_as_the_numpy_reference_does():
    """A chain whose edges all hold one 64 x 64 matrix (a repeated layer's), one edge reversed so
    its matrix is used transposed: the float copy is stored once per orientation, and the compiled
    passes over that pooled layout give the reference's messages, bound and cut."""
    rng = np.random.default_rng(7)
    k, n = 64, 5
    shared = rng.integers(0, 1000, (k, k)).astype(np.int64)
    shared[rng.random((k, k)) < 0.05] = INF
    costs = [rng.integers(0, 500, k).astype(np.int64) for _ in range(n)]
    ends = [(0, 1), (1, 2), (3, 2), (3, 4)]
    comp = FrozenCore(list(range(n)), costs, [(u, v, shared) for u, v in ends], None, [[] for _ in range(n)])
    ours, ref = MessagePassing(comp), MessagePassing(comp)
    assert len(ours.flat.mats) == 2 * k * k  # as stored and transposed, not once per edge
    for _ in range(3):
        ours.sweep()
        reference_sweep(ref, None)
    for a, b in zip(ours.to_u + ours.to_v, ref.to_u + ref.to_v):
        np.testing.assert_array_equal(a, b)
    value, scale = ours.bound()
    assert abs(value - reference_bound(ref, None)) <= 1e-12 * scale + 1e-6
    assert {(e, s, t): w for e, s, t, w, _ in ours.cut(None, 0.0).pair_terms} == reference_pair_terms(ref, None)
