"""What a device's solution proves below its plans: the pipeline claim's bounds are built from it, so
a plan found without a bound (or a recipe's plan taken as it is) must bound nothing."""

from __future__ import annotations

from types import SimpleNamespace

from autoshard.pipeline.search import _seconds, floor_ticks
from autoshard.solver import Solution


def _solution(cost: int, lower: int | None, status: str) -> Solution:
    return Solution([0], cost, lower, status, None, 0.0, 0)


def test_only_a_bound_or_a_proof_bounds_the_plans() -> None:
    assert floor_ticks(_solution(500, 420, "feasible")) == 420
    assert floor_ticks(_solution(500, None, "optimal")) == 500
    assert floor_ticks(_solution(500, None, "feasible")) == 0  # found in time, nothing proved
    assert floor_ticks(_solution(500, None, "over budget")) == 0


def test_seconds_read_the_floor_for_bounds_and_the_cost_for_steps() -> None:
    found = SimpleNamespace(solution=_solution(3_000, None, "feasible"),
                            model_problem=SimpleNamespace(cost_model=SimpleNamespace(ticks_per_unit=1_000)))
    assert _seconds(found, lower=False) == 3.0
    assert _seconds(found, lower=True) == 0.0
