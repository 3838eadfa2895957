"""Every optimum the solver claims on real model problems, checked by an independent exact method.

The reference is a plain linearised ILP written here from the ShardingProblem alone (no solver
code) and solved by HiGHS: one binary per (node, strategy), one continuous pair indicator per
(edge, strategy pair), memory rows at every interval start.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_array

from autoshard.api import build_model_problem, default_solve_options
from autoshard.frontend.load import load_model
from autoshard.frontend.trace import trace
from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver import solve

EXAMPLES = {}


def reference_optimum(p: ShardingProblem) -> int:
    """The exact optimum by HiGHS on the textbook ILP."""
    offsets = np.cumsum([0] + [p.num_strategies(i) for i in range(p.num_nodes)])
    nx = int(offsets[-1])
    pair_offsets = [nx]
    for m in p.edge_costs:
        pair_offsets.append(pair_offsets[-1] + m.size)
    n = pair_offsets[-1]
    cost = np.zeros(n)
    for i, c in enumerate(p.node_costs):
        cost[offsets[i]:offsets[i + 1]] = c
    for e, m in enumerate(p.edge_costs):
        cost[pair_offsets[e]:pair_offsets[e + 1]] = m.ravel()
    rows = []
    eq = lil_array((p.num_nodes + sum(m.shape[0] + m.shape[1] for m in p.edge_costs), n))
    r = 0
    for i in range(p.num_nodes):
        eq[r, offsets[i]:offsets[i + 1]] = 1
        r += 1
    for e, ((u, v), m) in enumerate(zip(p.edges, p.edge_costs)):
        ku, kv = m.shape
        base = pair_offsets[e]
        for s in range(ku):
            eq[r, [base + s * kv + t for t in range(kv)]] = 1
            eq[r, offsets[u] + s] = -1
            r += 1
        for t in range(kv):
            eq[r, [base + s * kv + t for s in range(ku)]] = 1
            eq[r, offsets[v] + t] = -1
            r += 1
    rows.append(LinearConstraint(eq.tocsr(), np.r_[np.ones(p.num_nodes), np.zeros(r - p.num_nodes)],
                                 np.r_[np.ones(p.num_nodes), np.zeros(r - p.num_nodes)]))
    if p.usage_limit is not None:
        times = sorted({start for start, end in p.intervals if start < end})
        mem = lil_array((len(times), n))
        for k, t in enumerate(times):
            for i, (start, end) in enumerate(p.intervals):
                if start <= t < end:
                    mem[k, offsets[i]:offsets[i + 1]] = p.node_usages[i]
        rows.append(LinearConstraint(mem.tocsr(), -np.inf, p.usage_limit))
    integrality = np.r_[np.ones(nx), np.zeros(n - nx)]
    result = milp(cost, constraints=rows, integrality=integrality, bounds=Bounds(0, 1),
                  options={"mip_rel_gap": 0})
    assert result.status == 0, result.message
    choice = [int(np.argmax(result.x[offsets[i]:offsets[i + 1]])) for i in range(p.num_nodes)]
    return p.cost(choice)


def graph_of(example: str):
    if example not in EXAMPLES:
        loaded = load_model(f"examples/{example}.py")
        EXAMPLES[example] = trace(loaded.model, loaded.example_inputs)
    return EXAMPLES[example]


@pytest.mark.parametrize("example,mesh,mode", [
    ("mlp", "2x4", "inference"),
    ("attention", "8", "training"),
    ("attention", "2x4", "training"),
    ("cnn_loss", "2x4", "training"),
    ("gpt2", "4", "training"),
])
def test_claimed_optimum_equals_highs(example, mesh, mode):
    mp = build_model_problem(graph_of(example), mesh, mode=mode)
    solution = solve(mp.problem, default_solve_options(mp, timeout=120))
    assert solution.status == "optimal"
    assert solution.cost == mp.problem.cost(solution.choice)
    assert solution.cost == reference_optimum(mp.problem)


def test_claimed_optimum_under_a_memory_budget_equals_highs():
    graph = graph_of("attention")
    free = build_model_problem(graph, "2x4", mode="training")
    peak = free.problem.peak_usage(solve(free.problem, default_solve_options(free, timeout=60)).choice)
    tight = build_model_problem(graph, "2x4", mode="training", memory_budget=int(0.6 * peak))
    solution = solve(tight.problem, default_solve_options(tight, timeout=120))
    assert tight.problem.peak_usage(solution.choice) <= tight.problem.usage_limit
    reference = reference_optimum(tight.problem)
    if solution.status == "optimal":
        assert solution.cost == reference
    else:  # anytime answer: feasible, never below the true optimum, bound below it
        assert solution.cost >= reference
        assert solution.lower_bound is None or solution.lower_bound <= reference
