"""Predicted peaks of one-GPU training plans against an H100's measured peaks of the same plans.

``benchmarks/data/h100_recompute_measured.json`` is ``benchmarks/gpu_recompute.py``'s output:
6 layers of torchtitan's LLaMA-3-8B at 2 x 8192 tokens, bf16, AdamW, the first K layers
checkpointed, peak bytes allocated per K. The model prices the same plans.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.kernels import llama_graph, llama_problem, recomputing_first

MEASURED = json.loads((Path(__file__).parents[2] / "benchmarks" / "data" / "h100_recompute_measured.json").read_text())


@pytest.fixture(scope="module")
def problem():
    return llama_problem(llama_graph(MEASURED["layers"]), "h100", "full")


def test_every_recompute_count_is_predicted_within_one_percent_of_the_h100(problem) -> None:
    runs = MEASURED["recompute"]
    assert [r["recomputed"] for r in runs] == list(range(MEASURED["layers"] + 1))
    for run in runs:
        predicted = problem.problem.peak_usage(recomputing_first(problem, run["recomputed"]))
        assert predicted == pytest.approx(run["peak_allocated"], rel=0.01), run["recomputed"]


def test_each_recomputed_layer_saves_what_the_h100_saved(problem) -> None:
    runs = MEASURED["recompute"]
    measured = (runs[0]["peak_allocated"] - runs[-1]["peak_allocated"]) / (len(runs) - 1)
    peaks = [problem.problem.peak_usage(recomputing_first(problem, r["recomputed"])) for r in (runs[0], runs[-1])]
    assert (peaks[0] - peaks[1]) / (len(runs) - 1) == pytest.approx(measured, rel=0.06)
