"""``python -m autoshard.run``: the README's torchrun command end to end, and its one-line refusals.

The refusals run ``main`` in this process with torchrun's environment variables: every check
happens before ``init_process_group``, so no process group may exist afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from autoshard.api import build_model_problem
from autoshard.problem.baselines.megatron import megatron_choice
from autoshard.frontend.load import load_model
from autoshard.frontend.trace import trace
from autoshard.problem.plan import Plan
from autoshard.problem.readback import make_plan
from autoshard.cli.run import main
from autoshard.runtime.executor import parallelize
from autoshard.runtime.placements import gather_full
from autoshard.runtime.groups import MeshGroups

from .dist import run_on_a_free_port, run_ranks
from .plans import EXAMPLES, MLP, plans, problem, sequence_parallel_plan, traced

ROOT = EXAMPLES.parent
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _seed_plan(path: Path, mesh: str) -> None:
    """The Megatron training plan of the seed example (examples/mlp.py), saved to ``path``."""
    mp = problem(traced("mlp"), mesh, "training")
    make_plan(mp, megatron_choice(mp), model="mlp").save(path)


def _torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run([str(TORCHRUN), "--standalone", f"--nproc_per_node={nproc}", "-m", "autoshard.run", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def test_readme_torchrun_command(tmp_path: Path) -> None:
    """The README's two commands: solve the seed for 2 devices in training mode, then run it."""
    plan = tmp_path / "plan.json"
    solved = subprocess.run([sys.executable, "-m", "autoshard.solve", "examples/mlp.py", "--mesh", "2",
                             "--mode", "training", "--out", str(plan)], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert solved.returncode == 0, solved.stderr
    assert "proved optimal" in solved.stdout
    done = _torchrun(2, "examples/mlp.py", "--plan", str(plan))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "mlp on mesh 2 (training plan, 2 ranks, gloo, traced with torch.fx)" in out
    assert "grad fc2.bias [1024]" in out and "largest relative error" in out and ": ok" in out
    assert "rank 1: parameters 16 MiB of 32 MiB unsharded; sent all_reduce 1x 32 MiB" in out
    assert "collectives: 1 executed per rank, 1 planned, equal to the plan's list" in out


def test_torchrun_with_the_wrong_world_size_prints_one_line(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    _seed_plan(plan, "2")
    done = _torchrun(1, "examples/mlp.py", "--plan", str(plan))
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if line.startswith("autoshard.run: error:")]
    assert ours == ["autoshard.run: error: plan is for mesh 2 (2 devices) but the world has 1 ranks: "
                    "launch torchrun --nproc_per_node=2"]
    assert "exitcode  : 2" in done.stderr  # torchrun's own failure report names our status


@pytest.fixture
def rank0(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's variables for rank 0 of 2."""
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)


def _refusal(capsys: pytest.CaptureFixture, argv: list[str], **kwargs: object) -> str:
    assert main(argv, **kwargs) == 2
    assert not dist.is_initialized()
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("autoshard.run: error: ")
    return lines[0]


def _model_file(tmp_path: Path, cls: str) -> str:
    """A model file for a test model class of tests/runtime/plans.py, built as ``traced`` builds it."""
    path = tmp_path / f"{cls}.py"
    path.write_text(f"import torch\nfrom tests.runtime.plans import {cls}\n\ntorch.manual_seed(0)\nmodel = {cls}()\n"
                    "example_inputs = (torch.randn(8, 8, 16, generator=torch.Generator().manual_seed(1)),)\n")
    return str(path)


@pytest.mark.usefixtures("rank0")
def test_refusals_before_any_computation(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    mlp = _model_file(tmp_path, "MLP")
    for mesh, name in (("4", "wrong_world"), ("2", "mlp")):
        plans(traced("tiny_mlp"), mesh, "training", 0)["megatron"].save(tmp_path / f"{name}.json")
    plans(traced("attention"), "2", "training", 0)["megatron"].save(tmp_path / "attention.json")
    sequence_parallel_plan(traced("sp_block"), "2", "inference").save(tmp_path / "sp.json")

    line = _refusal(capsys, [mlp, "--plan", str(tmp_path / "wrong_world.json")])
    assert "plan is for mesh 4 (4 devices) but the world has 2 ranks: launch torchrun --nproc_per_node=4" in line
    line = _refusal(capsys, [mlp, "--plan", str(tmp_path / "attention.json")])
    assert "plan was made for another model (attention)" in line
    line = _refusal(capsys, [_model_file(tmp_path, "SequenceParallelBlock"), "--plan", str(tmp_path / "sp.json"), "--backend", "mpi"])
    assert "the plan needs reduce_scatter, which the mpi backend cannot run: use the gloo backend (--backend gloo)" in line
    reduced = {"gloo": frozenset({"all_gather"})}
    line = _refusal(capsys, [mlp, "--plan", str(tmp_path / "mlp.json")], collectives=reduced)
    assert "the plan needs all_reduce, which the gloo backend cannot run: re-plan" in line
    line = _refusal(capsys, [mlp, "--plan", str(tmp_path / "missing.json")])
    assert "does not exist" in line
    edited = json.loads((tmp_path / "mlp.json").read_text())
    next(edge for edge in edited["edges"] if edge["steps"])["steps"] = []  # a hand edit: still valid JSON
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    line = _refusal(capsys, [mlp, "--plan", str(tmp_path / "edited.json")])
    assert "plan of tiny_mlp is inconsistent: the edge linear_1->output[0]'s steps (none) do not lead from RRRP to RRR, " \
           "which needs all_reduce(axis0); the file was edited or damaged" in line


def test_refusal_outside_torchrun(tmp_path: Path, capsys: pytest.CaptureFixture,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    line = _refusal(capsys, ["examples/mlp.py", "--plan", str(tmp_path / "plan.json")])
    assert "RANK and WORLD_SIZE are not set: launch with torchrun" in line


def _unseeded_run(rank: int, world: int, plan: Plan) -> dict:
    """Each rank builds its own random MLP; the parallel module must hold rank 0's and compute with it."""
    torch.manual_seed(100 + rank)
    model = MLP().eval()
    inputs = traced("tiny_mlp").inputs
    parallel = parallelize(model, plan, example_inputs=inputs)
    groups = MeshGroups.create(plan.mesh)
    out = gather_full(parallel(*inputs).detach(), parallel.output_specs[0], groups)
    weights = {n: p.detach().full_tensor() for n, p in parallel.named_parameters()}
    mine = {n: p.detach() for n, p in model.named_parameters()}
    return {"output": out.tolist(), "reference": model(*inputs).detach().tolist(),
            "weights": {n: w.tolist() for n, w in weights.items()}, "mine": {n: w.tolist() for n, w in mine.items()}}


def test_ranks_that_build_different_weights_run_rank_0s() -> None:
    plan = plans(traced("tiny_mlp"), "2", "training", 0)["megatron"]
    first, second = run_ranks(2, _unseeded_run, plan)
    assert first["mine"] != second["mine"]  # the model file did not seed
    for result in (first, second):
        assert result["weights"] == first["mine"]
        assert torch.allclose(torch.tensor(result["output"]), torch.tensor(first["reference"]), rtol=1e-5, atol=1e-6)


def _main_on_ranks(rank: int, world: int, port: int, argv: list[str]) -> int:
    """``main`` as torchrun runs it: its variables set, and the random state of a process of its own."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.manual_seed(100 + rank)
    return main(argv)


def test_a_model_file_drawing_unseeded_inputs_passes_the_run_check(tmp_path: Path) -> None:
    """Weights, inputs and targets drawn without a seed: every rank runs rank 0's."""
    path = tmp_path / "unseeded.py"
    path.write_text("import torch\nfrom tests.runtime.plans import MLP\n\nmodel = MLP()\n"
                    "example_inputs = (torch.randn(8, 8, 16),)\nexample_targets = (torch.randn(8, 8, 16),)\n\n\n"
                    "def loss(outputs, target):\n    return torch.nn.functional.mse_loss(outputs, target)\n")
    loaded = load_model(str(path)).for_training()
    mp = build_model_problem(trace(loaded.model, loaded.example_inputs), "2", mode="training")
    make_plan(mp, megatron_choice(mp), model="unseeded").save(tmp_path / "plan.json")
    assert run_on_a_free_port(2, _main_on_ranks, [str(path), "--plan", str(tmp_path / "plan.json")]) == [0, 0]
