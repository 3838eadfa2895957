"""The penalised elimination (penalised.py) against brute force on small random parts: at every
multiplier, in any order of multipliers (its fixed steps computed at the first and reused), the
minimum and the minimiser's value are the brute-force minimum of cost plus lam times bytes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autoshard.pipeline.penalised import PenalisedElimination
from autoshard.solver.core.reduced import Core
from autoshard.solver.engines.elimination import EliminationPlan
from autoshard.solver.model.problem import FORBIDDEN, ShardingProblem


def _random_part(seed: int) -> tuple[ShardingProblem, list[np.ndarray]]:
    """A cycle of 5-6 nodes with a chord and a tail of two, 2-3 strategies each, one forbidden;
    the odd nodes' and the tail's bytes equal over their strategies (fixed), the others' not."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 7))
    sizes = [int(rng.integers(2, 4)) for _ in range(n + 2)]
    costs = [rng.integers(0, 50, size=k).astype(np.int64) for k in sizes]
    costs[1][0] = FORBIDDEN
    edges = [(i, (i + 1) % n) for i in range(n)] + [(0, n // 2), (n + 1, n), (n, 1)]  # a fixed tail off node 1
    matrices = [rng.integers(0, 30, size=(sizes[u], sizes[v])).astype(np.int64) for u, v in edges]
    row = [np.full(k, int(rng.integers(0, 9))) if i % 2 or i >= n else rng.integers(0, 20, size=k)
           for i, k in enumerate(sizes)]
    problem = ShardingProblem(costs, [np.zeros(k, dtype=np.int64) for k in sizes], [(0, 0)] * (n + 2), edges, matrices)
    return problem, row


def _brute(problem: ShardingProblem, row: list[np.ndarray], lam: float) -> float:
    return min(problem.cost(list(x)) + lam * sum(float(r[s]) for r, s in zip(row, x))
               for x in itertools.product(*(range(len(c)) for c in problem.node_costs))
               if all(c[s] < FORBIDDEN for c, s in zip(problem.node_costs, x)))


@pytest.mark.parametrize("seed", range(8))
def test_the_penalised_minimum_is_the_brute_force_minimum(seed: int) -> None:
    problem, row = _random_part(seed)
    comp = Core(problem).freeze()
    penalised = PenalisedElimination(comp, EliminationPlan(comp), row)
    assert penalised.varying and len(penalised.varying) < problem.num_nodes
    for lam in (0.0, 3.0, 0.5, 10.0, 0.5, 1.75):
        x, value = penalised.solve(lam)
        exact = _brute(problem, row, lam)
        assert value == pytest.approx(exact, rel=1e-12, abs=1e-9)
        assert problem.cost(x) + lam * sum(float(r[s]) for r, s in zip(row, x)) == pytest.approx(exact, rel=1e-12)
    assert penalised.choices  # the fixed steps were kept


def test_a_part_too_wide_to_eliminate_is_refused() -> None:
    problem, row = _random_part(0)
    comp = Core(problem).freeze()
    with pytest.raises(ValueError, match="too wide"):
        PenalisedElimination(comp, EliminationPlan(comp, max_table=1), row)


@pytest.mark.parametrize("seed", range(4))
def test_two_rows_penalised_minimum_is_the_brute_force_minimum(seed: int) -> None:
    """Two rows of bytes per node (the second fixed where the first is, else its own): at every
    pair of multipliers the minimum is the brute-force minimum of cost plus lam . bytes."""
    problem, first = _random_part(seed)
    rng = np.random.default_rng(100 + seed)
    second = [r if r.max() == r.min() else rng.integers(0, 20, size=len(r)) for r in first]
    rows = [np.stack([a, b]) for a, b in zip(first, second)]
    comp = Core(problem).freeze()
    penalised = PenalisedElimination(comp, EliminationPlan(comp), rows)
    for lam in ((0.0, 0.0), (3.0, 0.5), (0.5, 10.0), (0.0, 1.75), (3.0, 0.5)):
        x, value = penalised.solve(lam)
        exact = min(problem.cost(list(y)) + sum(lam[k] * float(r[k, s]) for r, s in zip(rows, y) for k in (0, 1))
                    for y in itertools.product(*(range(len(c)) for c in problem.node_costs))
                    if all(c[s] < FORBIDDEN for c, s in zip(problem.node_costs, y)))
        assert value == pytest.approx(exact, rel=1e-12, abs=1e-9)
