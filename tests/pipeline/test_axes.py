"""``--pipeline auto``: whether to pipeline and over which axis, searched with the rest, and why."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import torch

from autoshard.cli.options import build_options
from autoshard.cli.pipeline import microbatch_inputs
from autoshard.cli.solve import build_parser, main
from autoshard.frontend.replicate import trace_replicated
from autoshard.pipeline.axes import AxesSearch, auto_seeds, in_turn, pipeline_axes
from autoshard.pipeline.baseline import torchtitan_options
from autoshard.pipeline.claim import search
from autoshard.pipeline.options import NO_PIPELINE, microbatch_counts, options_for
from autoshard.pipeline.search import PipelineSearch
from autoshard.sharding.mesh import parse_mesh
from tests.pipeline.models import tiny_llama

ROOT = Path(__file__).resolve().parents[2]
META_MODEL = f'''import sys
sys.path.insert(0, {str(ROOT / "benchmarks")!r})
import torch
from titan_llama import Transformer

with torch.device("meta"):
    model = Transformer(4, 64, 4, 2, 128, 256, 32)
tokens = torch.zeros(8, 32, dtype=torch.long, device="meta")
example_inputs = (tokens, tokens.clone())
'''


UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def _seconds(text: str) -> float:
    number, unit = text.split()
    return float(number) * UNITS[unit]


def _why(out: str) -> dict[str, str]:
    line = next(line for line in out.splitlines() if line.startswith("Why this degree: "))
    return dict(part.split(": ", 1) for part in line.removeprefix("Why this degree: ").split("; "))


def test_auto_picks_an_axis_or_none_and_bounds_every_other(tmp_path: Path, capsys) -> None:
    """A meta-device LLaMA on 2x4 h100 under a budget: both axes and no pipeline are candidates;
    the chosen one's step is at most the least bound of every other (the claim is proved)."""
    path = tmp_path / "meta_llama.py"
    path.write_text(META_MODEL)
    code = main([str(path), "--mesh", "2x4", "--device", "h100", "--mode", "training", "--pipeline", "auto",
                 "--schedule", "1f1b", "--microbatches", "4", "--memory-budget", "3GiB", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    why = _why(out)
    assert set(why) == {"pipeline over axis 0 (2 devices)", "pipeline over axis 1 (4 devices)", "no pipeline"}
    chosen = [name for name, text in why.items() if text.startswith("chosen")]
    assert len(chosen) == 1 and "proved optimal over the 4 pipeline options" in out
    step = _seconds(re.search(r"chosen, step ([\d.]+ \w+)", why[chosen[0]]).group(1))
    for name, text in why.items():
        if name != chosen[0]:
            assert _seconds(re.search(r"least bound ([\d.]+ \w+) >= the chosen step", text).group(1)) >= step


def test_auto_solves_the_unpipelined_candidate_first_so_its_plan_survives_a_limit_that_ends_there() -> None:
    """``--pipeline auto`` seeds the unpipelined candidate before the pipelined recipes: on a fake
    clock that passes the limit as soon as that solve is asked for, the search still ends with it
    (the plan ``solve`` gives without ``--pipeline``), and no pipelined recipe was costed before it."""
    model = tiny_llama()
    tokens = torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(0))
    inputs = (tokens, tokens.clone())
    args = build_parser().parse_args(["m.py", "--mesh", "2x4", "--device", "h100", "--mode", "training",
                                      "--memory-budget", "3GiB"])
    build = build_options(args)
    mesh = parse_mesh("2x4", None, None, 8, build["device"].intra, build["device"].inter)
    now, lines = [0.0], []

    def solver(options):
        now[0] = 1e6  # the limit passes as soon as the first solve is asked for
        return options

    graph_for = lambda m: trace_replicated(model, microbatch_inputs(inputs, m))  # noqa: E731
    clock = lambda: now[0]  # noqa: E731
    engines = {a: PipelineSearch(graph_for, mesh, a, build, 100.0, lines.append, solver=solver, clock=clock)
               for a in pipeline_axes(mesh)}
    options = in_turn([options_for(4, mesh.shape[a], microbatch_counts(mesh.shape[a], 8), axis=a)
                       for a in engines], 4)
    recipes = [replace(o, axis=a) for a in engines for o in torchtitan_options(4, mesh.shape[a], 8)]
    engine = AxesSearch(engines, lambda: graph_for(1), mesh, build, 100.0, lines.append, solver, clock)
    result = search(engine, options, auto_seeds(4, recipes))
    assert result.best.option.schedule == NO_PIPELINE and result.best.origin == "search"
    assert result.best.step == result.best.solutions[()].solution.cost / \
        result.best.solutions[()].model_problem.cost_model.ticks_per_unit
    first = next(i for i, line in enumerate(lines) if line.startswith("whole model without a pipeline"))
    assert not any("baseline" in line for line in lines[:first])
    assert any(line.startswith("the baseline plan was not costed") for line in lines[first:])
