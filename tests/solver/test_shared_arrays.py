"""Large arrays held once: the Core and the exact evaluation read the problem's int64 arrays without
copying them, a solve's frozen core reads its numbers from its flat arrays and the Core lets its
own go, TRW-S reads the core's pool in place, and a forked child's collector leaves the parent's
objects alone."""

from __future__ import annotations

import gc
import os
import pickle

import numpy as np

from autoshard.solver.bounds.trws import MessagePassing, lower_first
from autoshard.solver.core.evaluation import FlatProblem
from autoshard.solver.core.pool import POOLED_LENGTH
from autoshard.solver.core.reduced import INF, Core, FrozenCore, saturated
from autoshard.solver.core.rows import attach_memory
from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver.procs.forks import fork_child, read_frame, send_frame
from tests.solver.helpers import exited, large_problem, random_problem


def test_saturated_shares_an_int64_array_that_fits_and_leaves_it_writeable():
    values = np.array([3, INF, 0], dtype=np.int64)
    got = saturated(values)
    assert np.shares_memory(got, values) and not got.flags.writeable and values.flags.writeable
    assert got.tolist() == [3, INF, 0]


def test_saturated_copies_what_it_must_clip_or_convert():
    over = np.array([INF + 5, 1], dtype=np.int64)
    got = saturated(over)
    assert got.tolist() == [INF, 1] and not np.shares_memory(got, over) and over[0] == INF + 5
    assert saturated([2, 7]).dtype == np.int64 and saturated([2, 7]).tolist() == [2, 7]
    assert saturated(np.zeros(0, dtype=np.int64)).size == 0


def test_the_core_reads_the_problems_costs_and_matrices_in_place():
    problem = large_problem(np.random.default_rng(3), 30)
    problem.node_costs = [np.asarray(c, dtype=np.int64) for c in problem.node_costs]
    problem.edge_costs = [np.asarray(m, dtype=np.int64) for m in problem.edge_costs]
    core = Core(problem)
    for v, c in enumerate(problem.node_costs):
        assert np.shares_memory(core.costs[v], c) and core.strategies[v].tolist() == list(range(len(c)))
    for (u, v), m in zip(problem.edges, problem.edge_costs):
        assert np.shares_memory(core.adj[u][v], m)


def frozen_and_handed_over(problem: ShardingProblem) -> tuple:
    """The problem's core frozen twice: plainly (the reference) and as a solve hands it over."""
    plain = Core(problem)
    attach_memory(plain, problem)
    core = Core(problem)
    attach_memory(core, problem)
    return plain.freeze(), core.hand_over(), core


def test_a_handed_over_core_reads_every_number_from_its_flat_arrays_and_the_core_lets_go():
    for seed in range(6):
        problem = random_problem(np.random.default_rng(seed), 9, max_k=4, forbid_prob=0.2)
        plain, comp, core = frozen_and_handed_over(problem)
        a = comp.arrays
        for got, want in zip(comp.costs, plain.costs):
            assert np.array_equal(got, want) and np.shares_memory(got, a.costs)
        for (u, v, m), (pu, pv, pm) in zip(comp.edges, plain.edges):
            assert (u, v) == (pu, pv) and np.array_equal(m, pm) and np.shares_memory(m, a.nb_mats)
        for row, want in zip(comp.nbrs, plain.nbrs):
            assert [j for j, _ in row] == [j for j, _ in want]
            assert all(np.array_equal(m, w) and np.shares_memory(m, a.nb_mats) for (_, m), (_, w) in zip(row, want))
        for row, want in zip(comp.segments, plain.segments):
            assert [(s, t) for s, t, _ in row] == [(s, t) for s, t, _ in want]
            assert all(np.array_equal(u, w) and np.shares_memory(u, a.seg_use)
                       for (_, _, u), (_, _, w) in zip(row, want))
        assert not any(core.adj) and all(c is None for c in core.costs) and not any(core.segments)
        sent = pickle.loads(pickle.dumps(comp))  # as neighbourhood search sends cores: without the arrays
        assert "_arrays" not in sent.__dict__ and sent.cost([0] * comp.n) == comp.cost([0] * comp.n)
        rng = np.random.default_rng(seed)
        for _ in range(5):  # the same plans cost the same, and expand the same way
            x = np.array([rng.integers(len(c)) for c in comp.costs], dtype=np.int64)
            assert comp.cost(x) == plain.cost(x) and np.array_equal(comp.profile(x), plain.profile(x))
            expanded = Core(problem).expand(dict(zip(plain.nodes, x.tolist())))
            assert core.expand(dict(zip(comp.nodes, x.tolist()))) == expanded


def test_every_neighbour_entry_reads_its_edge_either_way_round_from_one_stored_block():
    rng = np.random.default_rng(7)
    for _ in range(6):
        k = rng.integers(1, 5, size=6)
        edges = [(int(u), int(v), rng.integers(0, 9, size=(k[u], k[v])).astype(np.int64))
                 for u, v in ((0, 1), (3, 1), (2, 5), (5, 4), (4, 0))]  # some with the higher node first
        comp = FrozenCore(list(range(6)), [np.zeros(int(n), dtype=np.int64) for n in k], edges, None, [[]] * 6)
        a = comp.arrays
        assert a.nb_mats.size <= sum(m.size for _, _, m in edges)  # each edge once, not once per end
        for i, row in enumerate(comp.nbrs):
            for p, (j, m) in enumerate(row, int(a.nb_ptr[i])):
                assert a.nb_other[p] == j
                got = [[a.nb_mats[a.nb_moff[p] + s * a.nb_own[p] + t * a.nb_their[p]] for t in range(k[j])]
                       for s in range(k[i])]
                assert np.array_equal(np.array(got).reshape(m.shape), m)


def test_trws_reads_each_edge_lower_node_first_from_the_cores_pool():
    for seed in range(8):
        problem = random_problem(np.random.default_rng(seed), 9, max_k=4, forbid_prob=0.2)
        comp = Core(problem).freeze()  # unreduced: its edges both ways round, forbidden entries kept
        edges, m_off = lower_first(comp)
        pool = comp.arrays.nb_mats
        for (u, v, m), (a, b, got), at in zip(comp.edges, edges, m_off.tolist()):
            assert (a, b) == (min(u, v), max(u, v))
            assert np.array_equal(got, m.T if u > v else m) and np.shares_memory(got, pool)
            assert np.array_equal(pool[at:at + got.size], got.ravel())
        assert MessagePassing(comp).flat.mats is pool


def test_a_forked_child_has_the_parents_objects_frozen_and_the_parent_does_not():
    read, write = os.pipe()
    pid = fork_child(lambda: send_frame(write, gc.get_freeze_count()), [read], [write])
    whole, frozen = read_frame(read)
    os.close(read)
    assert exited(pid)
    assert whole and frozen > 0
    assert gc.get_freeze_count() == 0


def test_the_exact_evaluation_reads_the_problems_matrices_in_place():
    problem = large_problem(np.random.default_rng(5), 60)
    shared = problem.edge_costs[0]
    problem.edge_costs = [shared if m.shape == shared.shape else m for m in problem.edge_costs]
    flat = FlatProblem.of(problem)
    held = [m for m, _, _ in flat.edges]
    assert all(any(m is e for e in problem.edge_costs) for m in held) and len(held) == len({id(m) for m in held})
    rng = np.random.default_rng(0)
    for _ in range(10):
        choice = np.array([rng.integers(problem.num_strategies(i)) for i in range(problem.num_nodes)])
        assert flat.evaluate(choice) == problem.evaluate(choice.tolist())


def test_the_exact_evaluation_stores_each_distinct_cost_and_usage_vector_once():
    problem = large_problem(np.random.default_rng(9), 40, max_k=POOLED_LENGTH + 2)
    for i, c in enumerate(problem.node_costs):  # every vector long enough to be pooled
        if len(c) < POOLED_LENGTH:
            problem.node_costs[i] = np.resize(c, POOLED_LENGTH)
            problem.node_usages[i] = np.resize(problem.node_usages[i], POOLED_LENGTH)
    problem.edge_costs = [np.resize(m, (len(problem.node_costs[u]), len(problem.node_costs[v])))
                          for (u, v), m in zip(problem.edges, problem.edge_costs)]
    for i in range(0, problem.num_nodes, 2):  # every other node repeats node 0's or 1's vectors (by value)
        j = i % 4 // 2
        if len(problem.node_costs[j]) == len(problem.node_costs[i]):
            problem.node_costs[i] = problem.node_costs[j].copy()
            problem.node_usages[i] = problem.node_usages[j].copy()
    flat = FlatProblem.of(problem)
    assert flat.costs.size == sum(len(c) for c in {tuple(c.tolist()) for c in problem.node_costs})
    assert flat.usages.size == sum(len(u) for u in {tuple(u.tolist()) for u in problem.node_usages})
    rng = np.random.default_rng(1)
    for _ in range(10):
        choice = np.array([rng.integers(problem.num_strategies(i)) for i in range(problem.num_nodes)])
        assert flat.evaluate(choice) == problem.evaluate(choice.tolist())


def test_edge_sums_past_int64_are_left_to_python():
    """Eight edges sharing one matrix of 2**59 prices: each below FORBIDDEN, their sum 2**62."""
    big = np.full((1, 1), 2**59, dtype=np.int64)
    problem = ShardingProblem([np.array([0])] * 9, [np.array([0])] * 9, [(0, 1)] * 9,
                              [(0, v) for v in range(1, 9)], [big] * 8)
    flat = FlatProblem.of(problem)
    assert flat.compiled and flat.evaluate(np.zeros(9, dtype=np.int64)).cost == 2**62


def test_a_fork_leaves_objects_the_caller_froze_frozen():
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        read, write = os.pipe()
        pid = fork_child(lambda: send_frame(write, 0), [read], [write])
        read_frame(read)
        os.close(read)
        assert exited(pid)
        # frozen objects that die leave the count, and only a freeze adds to it: the caller's freeze
        # stands (not undone: above 0) and the fork made none of its own (not above ``before``)
        assert 0 < gc.get_freeze_count() <= before
    finally:
        gc.unfreeze()
