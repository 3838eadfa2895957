"""What a user reads: a short piped solve of a Hugging Face model with whole columns, the tracer named,
the graph table on request, and plans that shard nothing saying so (solve and run)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autoshard.problem.readback import make_plan
from autoshard.cli.run import _check_ranks
from autoshard.cli.solve import PROGRESS_LINE, main
from tests.runtime.plans import problem, traced

ROOT = Path(__file__).resolve().parents[2]
LLAMA = str(ROOT / "examples" / "llama.py")


@pytest.fixture(scope="module")
def piped_llama() -> str:
    """``python -m autoshard.solve examples/llama.py --mesh 2x2 --baseline megatron`` with stdout piped."""
    done = subprocess.run([sys.executable, "-m", "autoshard.solve", LLAMA, "--mesh", "2x2", "--baseline", "megatron"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def _tables(text: str) -> list[list[str]]:
    """Each rich table of ``text`` as its lines (box-drawing characters at both ends)."""
    tables, current = [], []
    for line in text.splitlines():
        if line[:1] in "┏┃┡│└":
            current.append(line)
            if line.startswith("└"):
                tables.append(current)
                current = []
    return tables


def test_piped_solve_of_a_causal_lm_is_short_and_every_column_whole(piped_llama: str) -> None:
    lines = [line for line in piped_llama.splitlines() if not PROGRESS_LINE.fullmatch(line)]  # a loaded machine's
    assert len(lines) < 80, len(lines)
    assert lines[0].startswith("traced with torch.export (torch.fx failed: ")
    assert "graph: " not in piped_llama  # 209 nodes: the graph table only with --graph
    tables = _tables(piped_llama)
    assert tables
    for table in tables:
        assert len({len(line) for line in table}) == 1  # no row wraps
        assert "…" not in "".join(table)  # no cell is cut
    assert "model.layers.1.post_attention_layernorm.weight" in piped_llama  # the longest name, whole


def test_a_plan_that_shards_nothing_says_so_instead_of_a_ratio(piped_llama: str) -> None:
    assert "all replicated: the model is too small to be worth sharding at these costs" in piped_llama
    megatron = next(line for line in piped_llama.splitlines() if line.startswith("Megatron baseline:"))
    assert "x Megatron" not in megatron and megatron.endswith("too small to be worth sharding at these costs")


def test_graph_table_on_request_and_iteration_tables_for_small_models(capsys: pytest.CaptureFixture) -> None:
    assert main([LLAMA, "--mesh", "2x2", "--graph", "--tables", "none"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"export graph: \d+ ops", out) and "|-model.layers.0.self_attn.q_proj.weight" in out
    assert main([str(ROOT / "examples" / "mlp.py"), "--mesh", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("traced with torch.fx\nfx graph: 3 ops")
    iterations = len(re.findall(r"^Iteration \d+ \(z3[^)]*\): total", out, re.M))
    assert iterations >= 1 and "proved optimal" in out
    assert out.count("┏") == iterations + 2  # one cost table per improving plan, the graph table, the layouts


def test_the_run_check_says_a_replicated_plan_sent_nothing_because_it_shards_nothing(
        capsys: pytest.CaptureFixture) -> None:
    mp = problem(traced("tiny_mlp"), "2", "training")
    replicated = [next(k for k, s in enumerate(mp.candidates[n].strategies)
                       if all(spec is None or spec.is_replicated for spec in (s.out_spec, *s.in_specs)))
                  for n in mp.names]
    plan = make_plan(mp, replicated, model="mlp")
    assert plan.shards_nothing()
    summary = {"param_bytes": 10, "full_bytes": 10, "calls": {}, "sent": {}, "matches_plan": True, "count": 0,
               "collectives": [], "digests": {}}
    assert _check_ranks(plan, [summary, summary], False)
    out = capsys.readouterr().out
    assert "sent nothing (replicated plan)" in out
    sharded = make_plan(mp, [next((k for k, s in enumerate(mp.candidates[n].strategies) if not s.out_spec.is_replicated),
                                  0) for n in mp.names], model="mlp")
    assert not sharded.shards_nothing()


def test_a_refusal_is_one_line_and_torchruns_error_file_repeats_it(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun reports any non-zero exit of a worker at length; its ``traceback :`` field then shows our line."""
    from autoshard.cli.run import main as run_main

    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"),
                        ("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))):
        monkeypatch.setenv(name, value)
    assert run_main([str(ROOT / "examples" / "mlp.py"), "--plan", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("autoshard.run: error: plan file ")
    assert json.loads((tmp_path / "error.json").read_text())["message"]["message"] == err[0]  # torchrun's format
