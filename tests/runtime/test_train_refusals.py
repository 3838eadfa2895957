"""``autoshard.train`` refuses bad checkpoints and plans in one line, writing nothing, on every rank.

A checkpoint of another model (other shapes, other parameters) and a damaged one (a truncated
data file, an unreadable ``.metadata``) are refused by ``train`` on forked gloo ranks before any
step. Refusals reach torchrun's report through its error file (``process.refuse``), and one real
torchrun run on 4 ranks checks what a user sees: our line once on stderr, once as the root
cause of torchrun's report, no traceback of ours, a non-zero exit, the checkpoint untouched.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch.distributed as dist

from autoshard.errors import AutoshardError
from autoshard.cli.process import refuse
from autoshard.cli.train import Training, main, quiet_dtensor_hints, train
from autoshard.cli.training import make_optimizer, save_checkpoint

from .dist import run_ranks
from .plans import EXAMPLES
from .test_train import TINY, TORCHRUN, _args, tiny_training

WIDER = TINY.replace("nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)",
                     "nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16)")
DEEPER = TINY.replace("nn.Linear(32, 16))", "nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 16))")
FROZEN = TINY.replace("example_inputs =", "model[0].requires_grad_(False)\nexample_inputs =")


def _listing(folder: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*"))


def _refusals(rank: int, world: int, trained: Training, others: dict[str, Training], frozen: Training,
              folder: str) -> dict[str, str]:
    """Train 2 steps with a checkpoint, then resume it as each of ``others`` (by label) and as damaged copies;
    also resume ``trained`` from a checkpoint of ``frozen`` (its first layer frozen)."""
    quiet_dtensor_hints()
    train(_args("--steps", "2", "--checkpoint", folder), trained, rank, io.StringIO())
    train(_args("--steps", "2", "--checkpoint", f"{folder}_frozen"), frozen, rank, io.StringIO())
    damaged = {"truncated": f"{folder}_truncated", "metadata": f"{folder}_metadata"}
    if rank == 0:
        for copy in damaged.values():
            shutil.copytree(folder, copy)
        data = Path(damaged["truncated"], "step_000002", "__1_0.distcp")
        data.write_bytes(data.read_bytes()[:100])
        Path(damaged["metadata"], "step_000002", ".metadata").write_bytes(b"\x80\x04not a pickle")
    dist.barrier()
    cases = {label: (training, folder) for label, training in others.items()}
    cases |= {label: (trained, copy) for label, copy in damaged.items()} | {"thawed": (trained, f"{folder}_frozen")}
    messages = {}
    for label, (training, where) in cases.items():
        before = _listing(Path(where))
        with pytest.raises(AutoshardError) as refused:
            train(_args("--steps", "4", "--checkpoint", where, "--resume"), training, rank, io.StringIO())
        assert _listing(Path(where)) == before, f"{label}: something was written"
        messages[label] = str(refused.value)
    return messages


def test_checkpoints_of_another_model_or_damaged_are_refused_before_any_step(tmp_path: Path) -> None:
    trained = tiny_training(tmp_path / "tiny.py")
    others = {name: tiny_training(tmp_path / f"{name}.py", source) for name, source in (("wider", WIDER),
                                                                                         ("deeper", DEEPER))}
    frozen = tiny_training(tmp_path / "frozen.py", FROZEN)
    first, second = run_ranks(2, _refusals, trained, others, frozen, str(tmp_path / "ckpt"))
    assert first == second
    where = tmp_path / "ckpt" / "step_000002"
    assert first["wider"] == (f"checkpoint {where} holds another model (4 parameters and buffers, this model 4; its "
                              "0.weight is [32, 16], this model's [64, 16]): resume with the model file it was trained "
                              "with, or train this one in a new --checkpoint folder")
    assert "holds another model (4 parameters and buffers, this model 6; it has no 4.weight (nor 1 more of this " \
           "model's))" in first["deeper"]
    assert first["truncated"].startswith(f"checkpoint {tmp_path / 'ckpt_truncated' / 'step_000002'} cannot be loaded (")
    assert first["truncated"].endswith("it is damaged or was written by another program; delete it to resume from "
                                       "the one before")
    assert first["metadata"].startswith(f"checkpoint {tmp_path / 'ckpt_metadata' / 'step_000002'} cannot be read (")
    assert first["thawed"].startswith(f"checkpoint {tmp_path / 'ckpt_frozen' / 'step_000002'} holds no AdamW state "
                                      "for 0.weight, which this model trains (was it frozen then?)")
    assert all("\n" not in message for message in first.values())


def test_refusals_reach_torchrun_through_its_error_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    """torchrun kills rank 0 as soon as another rank exits: the error file carries the line to its report."""
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"),
                        ("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))):
        monkeypatch.setenv(name, value)
    training = tiny_training(tmp_path / "tiny.py")
    training.plan.mode = "inference"
    training.plan.save(tmp_path / "inference.json")
    assert main([str(tmp_path / "tiny.py"), "--plan", str(tmp_path / "inference.json"), "--steps", "2"]) == 2
    line = f"autoshard.train: error: {tmp_path / 'inference.json'} is an inference plan: re-solve with " \
           "autoshard.solve --mode training"
    assert capsys.readouterr().err == line + "\n"
    assert json.loads((tmp_path / "error.json").read_text())["message"]["extraInfo"]["py_callstack"] == line


def test_a_worker_that_outlives_the_wait_prints_its_own_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture) -> None:
    """Rank 2 refuses but rank 0 did not (torchrun did not end rank 2 while it waited): rank 2's line is printed."""
    monkeypatch.setattr("autoshard.cli.process.FIRST_RANK_WAIT_S", 0.0)
    environ = {"TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json"), "LOCAL_RANK": "2"}
    assert refuse("autoshard.train", AutoshardError("no GPU 2"), 2, environ) == 2
    assert capsys.readouterr().err == "autoshard.train: error: no GPU 2\n"
    assert json.loads((tmp_path / "error.json").read_text())["message"]["message"] == "autoshard.train: error: no GPU 2"


def test_the_torchrun_hint_names_the_required_steps(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_ERROR_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert main(["model.py", "--plan", "plan.json", "--steps", "2"]) == 2
    assert capsys.readouterr().err.endswith("launch with torchrun --nproc_per_node=N -m autoshard.train model.py "
                                            "--plan plan.json --steps N\n")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # the checkpoint saved here, in one process
def test_torchrun_on_4_ranks_prints_one_line_for_a_checkpoint_of_another_model(tmp_path: Path) -> None:
    wider = tiny_training(tmp_path / "wider.py", WIDER)
    model = wider.loaded.model
    save_checkpoint(tmp_path / "ckpt", 2, model, make_optimizer(model, _args()))
    tiny_training(tmp_path / "tiny.py", mesh="4").plan.save(tmp_path / "plan.json")
    before = _listing(tmp_path / "ckpt")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([str(TORCHRUN), "--standalone", "--nproc_per_node=4", "-m", "autoshard.train", str(tmp_path / "tiny.py"),
                           "--plan", str(tmp_path / "plan.json"), "--steps", "4",
                           "--checkpoint", str(tmp_path / "ckpt"), "--resume"],
                          cwd=EXAMPLES.parent, env=env | {"OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0 and done.stdout == ""
    line = f"autoshard.train: error: checkpoint {tmp_path / 'ckpt' / 'step_000002'} holds another model"
    lines = done.stderr.splitlines()
    ours = [n for n in lines if n.startswith("autoshard.train: error:")]
    assert len(ours) == 1 and ours[0].startswith(line), done.stderr
    assert [n.strip() for n in lines if line in n and n != ours[0]] == [f"traceback : {ours[0]}"]
    assert not [n for n in lines if "autoshard/" in n and n.strip().startswith("File ")], done.stderr
    assert _listing(tmp_path / "ckpt") == before
