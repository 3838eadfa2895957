"""Reading IOPDDL files and solutions: the example, gzip, and one-line errors for bad files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.errors import AutoshardError
from autoshard.solver.model.iopddl import format_solution, load_problem, parse_solution, problem_from_json, write_problem
from autoshard.solver.model.problem import FORBIDDEN

from tests.solver.helpers import EXAMPLE, needs_shared, random_problem



def example_json() -> dict:
    return json.loads(EXAMPLE.read_text())


@needs_shared
def test_example_loads_with_row_major_edges():
    p = load_problem(EXAMPLE)
    assert p.num_nodes == 5 and len(p.edges) == 5 and p.usage_limit == 50
    assert p.edge_costs[2].tolist() == [[90, 10], [20, 80]]
    assert p.intervals[0] == (30, 70)


@needs_shared
def test_gzip_file_loads(tmp_path):
    path = tmp_path / "example.json.gz"
    path.write_bytes(gzip.compress(EXAMPLE.read_bytes()))
    assert load_problem(path).num_nodes == 5


@needs_shared
def test_example_cost_and_memory_by_hand():
    p = load_problem(EXAMPLE)
    ev = p.evaluate([0, 0, 2, 1, 0])
    # nodes 15+55+35+75+95, edges 30+40+10+30+60 (row-major: edge (1,3) picks entry 0*2+1)
    assert ev.cost == 275 + 170 and ev.feasible
    assert ev.peak == 50


def _write(tmp_path, data) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _one_line_error(path) -> str:
    with pytest.raises(AutoshardError) as err:
        load_problem(path)
    message = str(err.value)
    assert "\n" not in message
    return message


@needs_shared
def test_truncated_json(tmp_path):
    message = _one_line_error(_write(tmp_path, EXAMPLE.read_text()[:300]))
    assert "not valid JSON" in message and "truncated" in message


@needs_shared
def test_truncated_gzip(tmp_path):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(gzip.compress(EXAMPLE.read_bytes())[:60])
    assert "gzip" in _one_line_error(path)


def test_missing_file(tmp_path):
    assert "cannot read" in _one_line_error(tmp_path / "nope.json")


@needs_shared
def test_wrong_number_of_usages(tmp_path):
    data = example_json()
    data["problem"]["nodes"]["usages"].pop()
    assert "usages has 4 entries" in _one_line_error(_write(tmp_path, data))


@needs_shared
def test_wrong_edge_cost_length(tmp_path):
    data = example_json()
    data["problem"]["edges"]["costs"][2].append(5)
    assert "expected 2 x 2 = 4" in _one_line_error(_write(tmp_path, data))


@needs_shared
def test_negative_values(tmp_path):
    data = example_json()
    data["problem"]["nodes"]["costs"][1][0] = -3
    assert "negative" in _one_line_error(_write(tmp_path, data))


@needs_shared
def test_node_without_strategies(tmp_path):
    data = example_json()
    data["problem"]["nodes"]["costs"][4] = []
    data["problem"]["nodes"]["usages"][4] = []
    assert "no strategies" in _one_line_error(_write(tmp_path, data))


@needs_shared
def test_edge_to_missing_node(tmp_path):
    data = example_json()
    data["problem"]["edges"]["nodes"][0] = [0, 9]
    assert "numbered 0..4" in _one_line_error(_write(tmp_path, data))


def test_not_a_problem(tmp_path):
    assert "missing 'problem'" in _one_line_error(_write(tmp_path, [1, 2]))


@needs_shared
def test_huge_costs_are_clipped_to_forbidden():
    data = example_json()
    data["problem"]["nodes"]["costs"][1] = [10**30, 65]
    p = problem_from_json(data)
    assert int(p.node_costs[1][0]) == FORBIDDEN


@needs_shared
def test_solution_parsing_and_format():
    p = load_problem(EXAMPLE)
    assert parse_solution("[0, 0, 2, 1, 0]", p) == [0, 0, 2, 1, 0]
    assert format_solution([0, 0, 2, 1, 0]) == "[0, 0, 2, 1, 0]"
    for text, fragment in (
        ("[0, 0, 3, 1, 0]", "strategy 3 for node 2"),
        ("[0, 0, 2, 1]", "4 entries"),
        ("[0, 0, -1, 1, 0]", "strategy -1"),
        ("[0, 0, 2, 1", "not valid JSON"),
        ("[0, 0, 2.5, 1, 0]", "not an integer"),
    ):
        with pytest.raises(AutoshardError) as err:
            parse_solution(text, p)
        assert fragment in str(err.value) and "\n" not in str(err.value)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_evaluator_matches_naive_recomputation(seed):
    rng = np.random.default_rng(seed)
    p = random_problem(rng, int(rng.integers(1, 8)))
    choice = [int(rng.integers(p.num_strategies(i))) for i in range(p.num_nodes)]
    ev = p.evaluate(choice)
    cost = sum(int(p.node_costs[i][s]) for i, s in enumerate(choice))
    cost += sum(int(m[choice[u], choice[v]]) for (u, v), m in zip(p.edges, p.edge_costs))
    top = max(e for _, e in p.intervals) + 1
    peak = max(
        sum(int(p.node_usages[i][choice[i]]) for i, (s, e) in enumerate(p.intervals) if s <= t < e)
        for t in range(top)
    )
    assert ev.cost == cost and ev.peak == peak
    forbidden = any(int(p.node_costs[i][s]) >= FORBIDDEN for i, s in enumerate(choice)) or any(
        int(m[choice[u], choice[v]]) >= FORBIDDEN for (u, v), m in zip(p.edges, p.edge_costs)
    )
    assert ev.uses_forbidden == forbidden
    assert ev.within_limit == (p.usage_limit is None or peak <= p.usage_limit)


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_write_problem_round_trips(tmp_path, suffix):
    rng = np.random.default_rng(3)
    for memory in (True, False):
        problem = random_problem(rng, 9, memory=memory)
        path = tmp_path / f"p{memory}{suffix}"
        write_problem(problem, path)
        back = load_problem(path)
        assert back.usage_limit == problem.usage_limit and back.edges == problem.edges
        assert back.intervals == [tuple(iv) for iv in problem.intervals]
        for a, b in zip(back.node_costs + back.node_usages + back.edge_costs,
                        problem.node_costs + problem.node_usages + problem.edge_costs):
            assert np.array_equal(a, b)


@needs_shared
def test_write_problem_to_a_missing_folder_is_one_line(tmp_path):
    with pytest.raises(AutoshardError) as err:
        write_problem(load_problem(EXAMPLE), tmp_path / "no" / "such.json")
    assert "cannot write" in str(err.value) and "\n" not in str(err.value)
