"""Layer moves (``search/layer_copies.py``): a change to one repeated layer tried on the others,
and earlier changes tried again, the tied units outside the layers following, checked against
brute force; and the model builder's layers (``problem/repeated.py``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autoshard.api import build_model_problem
from autoshard.errors import AutoshardError
from autoshard.frontend.load import load_model
from autoshard.frontend.trace import trace
from autoshard.solver.core.evaluation import FlatProblem
from autoshard.solver.model.problem import FORBIDDEN, ShardingProblem
from autoshard.solver.search.layer_copies import LayerCopies

F = FORBIDDEN
LAYERS = 3


def _chain(limit: int) -> ShardingProblem:
    """Three layers (p_l, q_l), strategy 0 slow and small, 1 fast and big, each layer's two nodes
    dearer apart; between layers a reshard node c_l with a repeat r_l, its strategy the pair
    (q_l, p_{l+1}) and dearer where they differ. All live at once: ``limit`` bytes hold two fast layers."""
    costs = [np.array([10, 4]), np.array([10, 4])] * LAYERS
    usages = [np.array([2, 10]), np.array([2, 10])] * LAYERS
    edges, matrices = [], []
    for layer in range(LAYERS):
        edges.append((2 * layer, 2 * layer + 1))
        matrices.append(np.array([[0, 5], [5, 0]]))
    for layer in range(LAYERS - 1):
        c = len(costs)
        costs += [np.array([0 if s // 2 == s % 2 else 3 for s in range(4)]), np.zeros(4, dtype=np.int64)]
        usages += [np.zeros(4, dtype=np.int64)] * 2
        edges += [(2 * layer + 1, c), (c, 2 * layer + 2), (c, c + 1)]
        matrices += [np.array([[0 if s // 2 == q else F for s in range(4)] for q in range(2)]),
                     np.array([[0 if s % 2 == p else F for p in range(2)] for s in range(4)]),
                     np.where(np.eye(4, dtype=bool), 0, F)]
    return ShardingProblem([c.astype(np.int64) for c in costs], [u.astype(np.int64) for u in usages],
                           [(0, 1)] * len(costs), edges, [m.astype(np.int64) for m in matrices], usage_limit=limit,
                           layers=[(2 * k, 2 * k + 1) for k in range(LAYERS)])


def _optimum(problem: ShardingProblem) -> int:
    """The least cost of a plan that fits, by enumeration."""
    plans = itertools.product(*(range(problem.num_strategies(i)) for i in range(problem.num_nodes)))
    return min(ev.cost for plan in plans if (ev := problem.evaluate(list(plan))).feasible)


def _plan(fast: set[int]) -> np.ndarray:
    """The plan with the ``fast`` layers fast and every tie consistent."""
    x = [1 if k // 2 in fast else 0 for k in range(2 * LAYERS)]
    for layer in range(LAYERS - 1):
        pair = 2 * x[2 * layer + 1] + x[2 * layer + 2]
        x += [pair, pair]
    return np.array(x, dtype=np.int64)


@pytest.mark.parametrize("limit", [50, 70])
def test_a_change_to_one_layer_is_copied_onto_as_many_as_fit_and_reaches_the_optimum(limit: int) -> None:
    problem = _chain(limit)
    before, after = _plan(set()), _plan({0})
    cost = problem.evaluate(after.tolist()).cost
    found = LayerCopies(problem, FlatProblem.of(problem)).improve(before, after, cost)
    assert found is not None
    plan, copied = found
    ev = problem.evaluate(plan.tolist())
    assert ev.feasible and ev.cost == copied < cost
    assert copied == _optimum(problem)  # two fast layers at 50 bytes, all three at 70


def test_a_copy_needs_its_tied_units_to_follow() -> None:
    """Without moving the reshard nodes and their repeats, every copy is forbidden."""
    problem = _chain(70)
    after = _plan({0})
    copies = LayerCopies(problem, FlatProblem.of(problem))
    y = after.copy()
    y[list(problem.layers[1])] = after[list(problem.layers[0])]
    assert not problem.evaluate(y.tolist()).feasible
    positions = np.arange(len(problem.layers[0]))
    assert copies._moved(after, positions, after[list(problem.layers[0])], [1]) is not None


def test_nothing_is_offered_where_the_changed_layer_is_not_worth_copying() -> None:
    problem = _chain(50)
    before, after = _plan({0, 1}), _plan({1})  # a step back: copying layer 0 (now slow) costs more
    cost = problem.evaluate(after.tolist()).cost
    assert LayerCopies(problem, FlatProblem.of(problem)).improve(before, after, cost) is None


def _unlinked(p_costs: list[list[int]], q_cost: list[int], q_usage: list[int], p_usage: list[int],
              limit: int) -> ShardingProblem:
    """Three layers of two nodes (p_l, q_l) without edges, all live at once: p_l's costs per layer
    as given, every q alike."""
    costs = [np.array(c) for layer in range(LAYERS) for c in (p_costs[layer], q_cost)]
    usages = [np.array(u) for _ in range(LAYERS) for u in (p_usage, q_usage)]
    return ShardingProblem([c.astype(np.int64) for c in costs], [u.astype(np.int64) for u in usages],
                           [(0, 1)] * len(costs), [], [], usage_limit=limit,
                           layers=[(2 * k, 2 * k + 1) for k in range(LAYERS)])


def test_a_move_keeps_the_other_positions_each_layer_chose() -> None:
    """Layer 0 keeps p slow (its fast p costs more), the others take p fast; a new best makes layer
    0's q fast. Copying layer 0 whole would undo the others' p; the move (q alone) reaches the optimum."""
    problem = _unlinked([[10, 12], [10, 4], [10, 4]], [10, 4], [1, 1], [1, 1], 100)
    before = np.array([0, 0, 1, 0, 1, 0])
    after = np.array([0, 1, 1, 0, 1, 0])
    cost = problem.evaluate(after.tolist()).cost
    found = LayerCopies(problem, FlatProblem.of(problem)).improve(before, after, cost)
    assert found is not None and found[1] == _optimum(problem) == problem.evaluate(found[0].tolist()).cost


def test_a_move_that_did_not_fit_is_tried_again_once_another_frees_memory() -> None:
    """p fast costs 8 more bytes, and at first only layer 0's fits; a later new best makes layer 1's q
    fast and small, which then fits on every layer and frees room for p fast everywhere: the
    remembered move reaches the optimum, which forgetting it misses."""
    problem = _unlinked([[10, 4]] * LAYERS, [10, 8], [10, 2], [2, 10], 44)
    start, first = np.zeros(6, dtype=np.int64), np.array([1, 0, 0, 0, 0, 0])
    second = np.array([1, 0, 0, 1, 0, 0])
    costs = [problem.evaluate(plan.tolist()).cost for plan in (first, second)]
    for remembered in (True, False):
        moves = LayerCopies(problem, FlatProblem.of(problem))
        assert moves.improve(start, first, costs[0]) is None  # the p move fits nowhere else yet
        if not remembered:
            moves.moves.clear()
        plan, cost = moves.improve(first, second, costs[1])
        assert problem.evaluate(plan.tolist()).feasible and problem.evaluate(plan.tolist()).cost == cost
        assert (cost == _optimum(problem)) is remembered


def test_layers_that_do_not_match_node_for_node_are_refused() -> None:
    problem = _chain(50)
    problem.layers = [(0, 1), (2, 6)]  # node 6 has 4 strategies where node 1 has 2
    with pytest.raises(AutoshardError, match="does not match the first layer node for node"):
        problem.validate()


def test_the_builder_gives_each_repeated_layer_of_a_model_its_nodes_in_one_order() -> None:
    loaded = load_model("examples/llama.py")
    mp = build_model_problem(trace(loaded.model, loaded.example_inputs), "2x2", mode="training", memory_budget=2**40)
    layers = mp.problem.layers
    assert len(layers) == loaded.model.config.num_hidden_layers and len(layers[0]) > 5
    names = [[mp.names[i] for i in layer] for layer in layers]
    for position in range(len(layers[0])):
        first = mp.candidates[names[0][position]].strategies
        assert all(mp.candidates[layer[position]].strategies == first for layer in names)
    mp.problem.validate()
