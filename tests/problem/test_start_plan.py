"""The solver's starting plan (problem/baselines/start.py): the cheapest hand-written recipe that
fits the budget, and the answer is it or cheaper even when the search finds nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from autoshard.api import build_model_problem, solve_model_problem
from autoshard.frontend.trace import trace
from autoshard.problem.baselines.start import recipes, starting_plan
from autoshard.solver import SolveOptions
from benchmarks.titan_llama import Transformer


@pytest.fixture(scope="module")
def mp():
    model = Transformer(1, 64, 4, 2, 128, 256, 128).to(torch.bfloat16)
    tokens = torch.zeros(8, 128, dtype=torch.long)
    graph = trace(model, (tokens, tokens.clone()))
    return build_model_problem(graph, "2x2x2", mode="training", device="h100", precision="bf16-mixed")


def test_the_start_is_the_cheapest_recipe_that_fits(mp):
    p = mp.problem
    start = starting_plan(mp)
    assert start is not None and start.peak == p.peak_usage(start.choice) <= p.usage_limit
    assert start.cost == p.cost(start.choice)
    costs = {name: p.cost(choose(mp)) for name, choose in recipes(mp) if p.is_feasible(choose(mp))}
    assert "FSDP over mesh axes 0,1" in next(iter(costs)) and start.cost == min(costs.values())


def test_no_recipe_starts_after_the_deadline(mp):
    assert starting_plan(mp, deadline=5.0, clock=lambda: 5.0) is None


def test_no_start_without_a_limit(mp):
    assert starting_plan(replace(mp, problem=replace(mp.problem, usage_limit=None))) is None


def test_the_answer_is_the_start_when_the_search_finds_nothing(mp):
    nothing = SolveOptions(reduce=False, warm_start=False, prove=False)
    result = solve_model_problem(mp, nothing)
    assert result.start is not None and tuple(result.solution.choice) == result.start.choice
    searched = solve_model_problem(mp, SolveOptions(timeout=5.0))
    assert searched.solution.cost <= searched.start.cost
