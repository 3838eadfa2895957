"""Large arrays held once: the Core and the exact evaluation read the problem's int64 arrays without
copying them, TRW-S's float matrices are built once per core (and before a fork, shared with the
child), and a forked child's collector leaves the parent's objects alone."""

from __future__ import annotations

import gc
import os
import pickle

import numpy as np

from autoshard.solver.bounds.trws import MessagePassing, float_matrices
from autoshard.solver.core.evaluation import FlatProblem
from autoshard.solver.core.reduced import INF, Core, saturated
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


def test_float_matrices_are_each_edge_oriented_lower_node_first_built_once_and_not_pickled():
    for seed in range(8):
        problem = random_problem(np.random.default_rng(seed), 9, max_k=4, forbid_prob=0.2)
        comp = Core(problem).freeze()  # unreduced: its edges both ways round, forbidden entries kept
        got = float_matrices(comp)
        assert float_matrices(comp) is got and MessagePassing(comp).edges is got.edges
        for (u, v, m), (a, b, f) in zip(comp.edges, got.edges):
            oriented = m.T if u > v else m
            assert (a, b) == (min(u, v), max(u, v))
            assert np.array_equal(f, np.where(oriented < INF, oriented.astype(np.float64), np.inf))
            assert np.shares_memory(f, got.mats)
        assert "_float_matrices" not in pickle.loads(pickle.dumps(comp)).__dict__


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
