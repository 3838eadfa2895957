"""The ``python -m autoshard.solve`` command line on model files: output, plan file, one-line errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autoshard.cli.solve import build_parser, main

from tests.solver.helpers import FakeClock

ROOT = Path(__file__).resolve().parents[2]
MLP = str(ROOT / "examples" / "mlp.py")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_documents_every_flag():
    text = build_parser().format_help()
    for action in build_parser()._actions:
        for flag in action.option_strings:
            assert flag in text
        assert action.help, f"{action.option_strings or action.dest} has no help text"


def test_seed_run_under_slapo_costs(capsys, tmp_path):
    out_file = tmp_path / "plan.json"
    code, out, err = run_cli(capsys, MLP, "--mesh", "8", "--cost-model", "slapo", "--out", str(out_file))
    assert code == 0, err
    totals = [int(t) for t in re.findall(r"Iteration \d+ \([^)]*\): total (\d+) elements", out)]
    assert totals and totals[-1] == 131072
    assert all(a > b for a, b in zip(totals, totals[1:])), totals
    assert "proved optimal" in out
    assert 'sch["fc1"].sync(mode="fwd_pre", sync_op_or_fn="RR->SR")' in out
    assert 'sch["fc2"].sync(mode="fwd_post", sync_op_or_fn="SR->RR")' in out
    assert out.index('sch["fc1"]') < out.index('sch["fc2"]')
    plan = json.loads(out_file.read_text())
    assert plan["total_cost"] == 131072 and plan["proved_optimal"]
    assert "fc1.weight" in plan["param_specs"]


def test_graph_table_lists_ops_and_parameters(capsys):
    code, out, _ = run_cli(capsys, MLP, "--mesh", "8", "--tables", "none")
    assert code == 0
    for name in ("linear", "gelu", "linear_1", "fc1.weight", "fc2.bias", "float32"):
        assert name in out
    assert "[8, 1024, 4096]" in out or "8, 1024, 4096" in out


def test_default_cost_model_proves_its_plan(capsys):
    code, out, _ = run_cli(capsys, MLP, "--mesh", "2x4", "--tables", "last")
    assert code == 0
    assert "proved optimal" in out
    assert "Schedule" in out


def _error(capsys, *argv: str) -> str:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


def test_missing_file(capsys, tmp_path):
    assert "does not exist" in _error(capsys, str(tmp_path / "nope.py"))


def test_file_without_a_model(capsys, tmp_path):
    path = tmp_path / "empty.py"
    path.write_text("x = 1\n")
    assert "model" in _error(capsys, str(path))


def test_untraceable_model(capsys, tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        if x.sum().item() > 0:\n"
        "            return x.nonzero()\n"
        "        return x\n"
        "model = M()\n"
        "example_inputs = (torch.ones(4),)\n"
    )
    assert "cannot trace" in _error(capsys, str(path))


@pytest.mark.parametrize("mesh", ["0", "-1", "2.5", "eight"])
def test_bad_meshes(capsys, mesh):
    assert "--mesh" in _error(capsys, MLP, "--mesh", mesh)


def test_bad_pin_and_budget(capsys):
    assert "--pin" in _error(capsys, MLP, "--pin", "fc9.weight=SR")
    assert "memory" in _error(capsys, MLP, "--memory-budget", "lots")


def test_module_entry_point_runs():
    done = subprocess.run([sys.executable, "-m", "autoshard.solve", "--help"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0 and "--mesh" in done.stdout


def test_infeasible_budget_names_the_smallest_peak(capsys):
    line = _error(capsys, MLP, "--memory-budget", "1MiB")
    assert "smallest peak" in line and "52 MiB" in line


def test_megatron_baseline_is_never_cheaper(capsys):
    code, out, _ = run_cli(capsys, MLP, "--mesh", "8", "--mode", "training", "--baseline", "megatron", "--tables", "none")
    assert code == 0
    ratio = float(re.search(r"= ([0-9.]+)x Megatron", out).group(1))
    assert ratio <= 1.0


def test_prints_pytorch_tensor_parallel_export(capsys):
    code, out, _ = run_cli(capsys, MLP, "--mesh", "8", "--mode", "training", "--tables", "none", "--quiet")
    assert code == 0
    source = out.split("PyTorch-native (torchtitan style):\n", 1)[1]
    namespace: dict = {}
    exec(compile(source, "<export>", "exec"), namespace)
    assert callable(namespace["parallelize"]) and callable(namespace["build_mesh"])
    assert '"fc1": ColwiseParallel()' in source and '"fc2": RowwiseParallel()' in source
    # The row-parallel bias gets its whole gradient on every device, as in Megatron: no all-reduce.
    assert 'sch["fc2"].sync(mode="fwd_post", sync_op_or_fn="all_reduce")' in out and "gradient of" not in out


def test_says_which_choices_have_no_pytorch_form(capsys):
    code, out, _ = run_cli(capsys, MLP, "--mesh", "2x4", "--tables", "none", "--quiet")
    assert code == 0
    assert ("# not exported: mesh axis 0 (2 devices): input x reaches linear as RSR, where the axis shards no "
            "weight: only data parallelism maps there") in out


def test_piped_model_solve_prints_its_status_after_silence():
    """On a console that is not a terminal (no live line) the model path's progress prints its
    status line after silence, and no more once closed."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from autoshard.cli.model_progress import ModelProgress

    out = io.StringIO()
    mp = SimpleNamespace(cost_model=SimpleNamespace(format=str))
    clock = FakeClock()
    progress = ModelProgress(mp, Console(file=out, force_terminal=False), "lines", SimpleNamespace(update=lambda _: None),
                             every=0.1, clock=clock)
    clock.now += 0.1
    assert progress.heartbeat.tick() and "iterations 0  bound < -" in out.getvalue()
    progress.close()
    clock.now += 1.0
    assert not progress.heartbeat.tick()
    live = SimpleNamespace(update=lambda _: None)
    terminal, piped = Console(file=io.StringIO(), force_terminal=True), Console(file=io.StringIO(), force_terminal=False)
    assert ModelProgress(mp, terminal, "lines", live).heartbeat.thread is None
    assert ModelProgress(mp, piped, "lines", None).heartbeat.thread is None  # --quiet


def test_long_work_prints_a_line_now_and_then_when_piped_and_nothing_when_quiet(monkeypatch):
    """Piped output has no spinner: loading and tracing a large model (tens of seconds) prints
    ``what (N s)`` every heartbeat instead of staying silent; --quiet prints nothing."""
    import io

    from rich.console import Console

    import autoshard.cli.solve as cli_solve
    from autoshard.cli.progress import Heartbeat

    clock, hearts = FakeClock(), []

    def ticked(beat, every):  # _working's heartbeat on the test's clock: the test ticks it
        hearts.append(Heartbeat(beat, every, clock=clock))
        return hearts[-1]

    monkeypatch.setattr(cli_solve, "Heartbeat", ticked)
    for quiet in (False, True):
        out, hearts[:] = io.StringIO(), []
        with cli_solve._working(Console(file=out, force_terminal=False), "loading and tracing m.py", quiet, every=0.1):
            for _ in range(3):
                clock.now += 0.1
                assert all(heart.tick() for heart in hearts)
        lines = out.getvalue().splitlines()
        if quiet:
            assert lines == []
        else:
            assert lines and all(re.fullmatch(r"loading and tracing m\.py \(\d+ s\)", line) for line in lines)


def test_a_preset_budget_bounds_reserved_bytes_and_says_what_it_leaves_live(capsys):
    # h100 keeps 1.30 GiB outside the allocator and reserves 1.198 bytes per live byte
    line = _error(capsys, MLP, "--device", "h100", "--memory-budget", "1380MiB")
    assert "--memory-budget 1.35 GiB (40.7 MiB live)" in line and "smallest peak" in line
    code, out, _ = run_cli(capsys, MLP, "--device", "h100", "--memory-budget", "2GiB", "--tables", "none")
    assert code == 0 and "memory budget 2 GiB (598 MiB live)" in out and "as the allocator reserves it" in out


def test_recompute_policy_and_overlap_flags_reach_the_costs(capsys):
    llama = str(ROOT / "examples" / "llama.py")
    common = (llama, "--mesh", "2", "--mode", "training", "--device", "h100", "--memory-budget", "2.3GiB",
              "--baseline", "torchtitan", "--tables", "none", "--quiet")
    baselines = {}
    for flags in (("--recompute", "selective"), ("--recompute", "selective", "--no-overlap")):
        code, out, _ = run_cli(capsys, *common, *flags)
        assert code == 0 and "torchtitan baseline" in out
        baselines[flags] = int(re.search(r"torchtitan baseline: .*?\((\d+) ps\)", out).group(1))
    hidden, exposed = baselines.values()
    assert exposed > hidden  # torchtitan's FSDP gathers charged in full instead of hidden under compute


def test_plans_whose_total_prints_the_same_share_one_line():
    """One line per plan: a run of plans whose short total reads as the last printed one (a
    neighbourhood search shaving picoseconds) prints as one line with its count, sources and the
    last exact total, when the total shown changes and when the run ends."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from autoshard.cli.model_progress import ModelProgress
    from autoshard.solver.model.events import Improved

    out = io.StringIO()
    mp = SimpleNamespace(cost_model=SimpleNamespace(format=lambda t: f"{t // 1000} ms", unit="s"))
    progress = ModelProgress(mp, Console(file=out, force_terminal=False, width=200), "lines", None)
    for k, (cost, source) in enumerate([(9500, "z3"), (7400, "lns"), (7300, "lns"), (7200, "milp"), (5100, "lns"),
                                        (5050, "lns")], start=1):
        progress(Improved(k, cost, (), None, 0.0, source, None))
    progress.close()
    lines = [line for line in out.getvalue().splitlines() if line.startswith("Iteration")]
    assert [line.split(": total ")[0] for line in lines] == [
        "Iteration 1 (z3)", "Iteration 2 (lns)", "Iterations 3-4 (2 plans: lns 1, milp 1)", "Iteration 5 (lns)",
        "Iteration 6 (lns)"]
    assert lines[2].endswith("total 7 ms (7200 ps)") and lines[4].endswith("total 5 ms (5050 ps)")
