"""Every flag of ``autoshard.solve`` has its effect in both branches (whole model and ``--pipeline``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import autoshard.api
import autoshard.pipeline.search
from autoshard.cli import options
from autoshard.cli.options import (BUILD_FLAGS, MESH_FLAGS, PIPELINE_FLAGS, RUN_FLAGS, SOLVER_FLAGS,
                                   WHOLE_MODEL_FLAGS, build_options)
from autoshard.cli.solve import build_parser, main
from autoshard.errors import AutoshardError
from autoshard.pipeline.options import on_stage_mesh
from autoshard.solver import SolveOptions

ROOT = Path(__file__).resolve().parents[2]
MIXTRAL = str(ROOT / "examples" / "mixtral.py")

NOT_DEFAULT = ["--cost-model", "slapo", "--mode", "training", "--memory-budget", "3GiB",
               "--pin", "model.layers.0.self_attn.q_proj.weight=S1R", "--device", "h100", "--peak-flops", "1e14",
               "--memory-bandwidth", "1e12", "--precision", "bf16-mixed", "--capacity-factor", "1.5",
               "--expert-parallel", "1", "--recompute", "selective", "--no-overlap",
               "--compile", "layers", "--float8", "rowwise", "--async-tp"]
"""A value other than the default for every flag of BUILD_FLAGS (checked below)."""


def test_every_flag_is_classified_once() -> None:
    classes = [set(BUILD_FLAGS), SOLVER_FLAGS, MESH_FLAGS, RUN_FLAGS, PIPELINE_FLAGS, set(WHOLE_MODEL_FLAGS)]
    dests = {a.dest for a in build_parser()._actions if a.dest != "help"}
    for dest in dests:
        assert sum(dest in c for c in classes) == 1, f"--{dest} must belong to exactly one class in cli/options.py"
    assert set().union(*classes) == dests


def test_the_non_default_values_change_every_build_option() -> None:
    parser = build_parser()
    given = build_options(parser.parse_args([MIXTRAL, *NOT_DEFAULT]))
    default = build_options(parser.parse_args([MIXTRAL]))
    assert sorted(k for k in given if given[k] != default[k]) == sorted(BUILD_FLAGS.values())


class Built(Exception):
    """Stops the CLI once the problem's options are known."""


@pytest.mark.parametrize("branch", ["whole", "pipeline"])
def test_every_build_flag_reaches_the_problem_in_each_branch(monkeypatch, capsys, branch) -> None:
    seen: dict[str, Any] = {}

    def spy(graph: Any, mesh: Any, **kwargs: Any) -> Any:
        seen.update(kwargs, mesh=mesh.shape)
        raise Built

    monkeypatch.setattr(autoshard.api, "build_model_problem", spy)
    monkeypatch.setattr(autoshard.pipeline.search, "build_model_problem", spy)
    pipeline = ["--pipeline", "0", "--microbatches", "2", "--schedule", "1f1b"] if branch == "pipeline" else []
    argv = [MIXTRAL, "--mesh", "2x2", "--quiet", *NOT_DEFAULT, *pipeline]
    with pytest.raises(Built):
        main(argv)
    want = build_options(build_parser().parse_args(argv))
    if branch == "pipeline":
        assert seen.pop("mesh") == (2,) and seen.pop("stage") is not None
        assert want["expert_parallel"] == 1 and want["pins"]["model.layers.0.self_attn.q_proj.weight"] == "S1R"
        want = on_stage_mesh(want, 0)
        assert want["expert_parallel"] == 0 and want["pins"]["model.layers.0.self_attn.q_proj.weight"] == "S0R"
        # the search first costs torchtitan's recipes as incumbents, under the budget
        assert want["memory_budget"] == 3 << 30
    else:
        assert seen.pop("mesh") == (2, 2)
    assert seen == want


@pytest.fixture(scope="module")
def pipeline_runs(tmp_path_factory) -> tuple[dict[int, list], list[SolveOptions]]:
    """Two pipeline solves of the Mixtral example on 2x2 (axis 0 the pipeline), one with
    ``--expert-parallel 1`` and the solver flags ``--seed 7 --gap 0.25 --no-reduce``: each plan
    file's per-device expert-parallel layers by the number of flags added (0 or 2), and the
    options every stage solve of the second run was given."""
    folder = tmp_path_factory.mktemp("pipeline_runs")
    got: list[SolveOptions] = []
    real = autoshard.pipeline.search.solve_model_problem

    def spy(mp: Any, opts: SolveOptions, *args: Any, **kwargs: Any) -> Any:
        got.append(opts)
        return real(mp, opts, *args, **kwargs)

    layers = {}
    for flag in ([], ["--expert-parallel", "1"]):
        out = folder / f"plan{len(flag)}.json"
        solver = ["--seed", "7", "--gap", "0.25", "--no-reduce"] if flag else []
        with pytest.MonkeyPatch.context() as patch:
            if flag:
                patch.setattr(autoshard.pipeline.search, "solve_model_problem", spy)
            assert main([MIXTRAL, "--mesh", "2x2", "--mode", "training", "--pipeline", "0", "--microbatches", "2",
                         "--schedule", "1f1b", "--quiet", "--out", str(out), *flag, *solver]) == 0
        devices = json.loads(out.read_text())["devices"]
        layers[len(flag)] = [d["plan"]["expert_parallel"] for d in devices]
    return layers, got


def test_solver_flags_reach_each_stage_solve(pipeline_runs) -> None:
    _, got = pipeline_runs
    assert got and all(o.seed == 7 and o.gap == 0.25 and not o.reduce for o in got)


def test_pipeline_pins_expert_parallelism_on_the_stage_axis(pipeline_runs) -> None:
    layers, _ = pipeline_runs
    assert layers[0] == [{}, {}]  # unpinned, this small model runs every expert on each device
    assert layers[2] == [{"model.layers.0.mlp.experts": 0}, {"model.layers.1.mlp.experts": 0}]


@pytest.mark.parametrize("argv,message", [
    (["--pipeline", "0", "--expert-parallel", "0"], "--expert-parallel 0 uses mesh axis 0, which carries the pipeline"),
    (["--pipeline", "0", "--write-problem", "p.json"], "--write-problem is not used with --pipeline"),
    (["--pipeline", "0", "--tables", "all"], "--tables is not used with --pipeline"),
    (["--schedule", "1f1b"], "--schedule sets up a pipeline search: add --pipeline AXIS"),
])
def test_flags_a_branch_cannot_use_are_refused_in_one_line(capsys, argv, message) -> None:
    assert main([MIXTRAL, "--mesh", "2x2", "--mode", "training", "--quiet", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_stage_mesh_renumbers_axes_after_the_pipeline_axis() -> None:
    build = {"expert_parallel": 2, "pins": {"w": "S2RP0"}}
    assert on_stage_mesh(build, 1) == {"expert_parallel": 1, "pins": {"w": "S1RP0"}}
    with pytest.raises(AutoshardError, match="--pin w=S2RP0 uses mesh axis 0"):
        on_stage_mesh(build, 0)
    assert options.parse_pins(["a=RS", "b = S0R"]) == {"a": "RS", "b": "S0R"}
