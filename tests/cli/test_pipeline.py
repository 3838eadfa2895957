"""``autoshard.solve --pipeline``: the options table, the claim, the plan file, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoshard.cli.solve import main
from autoshard.cli.train import build_parser as train_parser
from autoshard.cli.train_pipeline import prepare_pipeline
from autoshard.errors import AutoshardError
from autoshard.problem.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
MODEL = f'''import sys
sys.path.insert(0, {str(ROOT / "benchmarks")!r})
import torch
from titan_llama import Transformer

torch.manual_seed(0)
model = Transformer(4, 64, 4, 2, 128, 256, 32)
tokens = torch.randint(0, 256, (4, 32))
example_inputs = (tokens, tokens.clone())
'''


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("pipeline") / "tiny_llama.py"
    path.write_text(MODEL)
    return str(path)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_pipeline_search_prints_options_claim_and_plan(capsys, model_file, tmp_path) -> None:
    out_file = tmp_path / "pipeline.json"
    code, out, err = _run(capsys, model_file, "--mesh", "2x2", "--pipeline", "0", "--mode", "training",
                          "--device", "h100", "--memory-budget", "2.3GiB", "--schedule", "1f1b",
                          "--microbatches", "2,4", "--quiet", "--baseline", "torchtitan", "--out", str(out_file))
    assert code == 0, err
    assert "Pipeline options" in out and "proved optimal over the 4 pipeline options" in out
    assert "Pipeline devices 0 (layers" in out and "Pipeline devices 1 (layers" in out
    assert "Baseline torchtitan (1f1b, 2 stages, 2 microbatches" in out
    saved = json.loads(out_file.read_text())
    assert saved["pipeline"]["schedule"] == "1f1b" and saved["pipeline"]["proved"]
    assert sum(saved["pipeline"]["layers_per_stage"]) == 4 and len(saved["devices"]) == 2
    with pytest.raises(AutoshardError, match="pipelined plan"):
        Plan.load(out_file)
    args = train_parser().parse_args([model_file, "--plan", str(out_file), "--steps", "1"])
    with pytest.raises(AutoshardError, match="for mesh 2x2 .4 ranks. but 2 were launched"):
        prepare_pipeline(args, 2)
    saved["pipeline"]["virtual_stages"] = 2
    out_file.write_text(json.dumps(saved))
    with pytest.raises(AutoshardError, match="has 2 stages, not 2 per device on 2 devices"):
        prepare_pipeline(args, 4)


@pytest.mark.parametrize("argv,message", [
    (("--mesh", "4", "--pipeline", "0", "--mode", "training"), "pipeline over one axis of a mesh with two or more"),
    (("--mesh", "2x2", "--pipeline", "0", "--mode", "training", "--microbatches", "3"),
     "--microbatches 3 does not divide the batch of 4"),
    (("--mesh", "2x2", "--pipeline", "0", "--mode", "training", "--baseline", "megatron"),
     "--baseline megatron is not costed"),
    (("--mesh", "2x2", "--pipeline", "0"), "--pipeline plans training steps"),
])
def test_bad_pipeline_flags_are_one_line_errors(capsys, model_file, argv, message) -> None:
    code, _, err = _run(capsys, model_file, "--quiet", *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_model_without_repeated_layers_cannot_be_pipelined(capsys) -> None:
    code, _, err = _run(capsys, str(ROOT / "examples" / "mlp.py"), "--mesh", "2x2", "--pipeline", "0",
                        "--mode", "training", "--microbatches", "2", "--quiet")
    assert code == 2 and "has none" in err


def test_a_recipe_not_costed_by_the_time_limit_is_named_after_the_result(monkeypatch) -> None:
    """The search printed its plan; torchtitan's recipes it had not costed say so in a line each,
    rather than ending the run in an error after the result."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    import autoshard.cli.pipeline as cli_pipeline
    from autoshard.pipeline.deadline import SearchTimeout

    def late(engine, option):
        raise SearchTimeout("the time limit passed")

    monkeypatch.setattr(cli_pipeline, "torchtitan_pipeline", late)
    engine = SimpleNamespace(mesh=SimpleNamespace(shape=(2, 2)), axis=0)
    result = SimpleNamespace(best=SimpleNamespace(step=1.0))
    text = io.StringIO()
    cli_pipeline.print_torchtitan(engine, result, 4, 4, Console(file=text, width=200))
    labels = [option.label for option in cli_pipeline.torchtitan_options(4, 2, 4)]
    assert len(labels) == 2  # 1F1B and interleaved 1F1B
    assert text.getvalue().splitlines() == [
        f"Baseline torchtitan ({label}; FSDP x TP per stage): not costed within the time limit (raise --timeout to "
        "see it)" for label in labels]
