"""``autoshard.train``: loss curves equal to single-device training, crash and resume, checkpoints across plans.

The LLaMA example is trained with its own loss (next-token cross-entropy whose labels hold no
-100, so a token-sharded mean is exact with or without the ignore-index fix) on forked gloo
ranks, 20 steps of AdamW with clipping, against the same loop on the unsharded model: every
step's loss within 1e-4 relative. A run that dies after step 13 resumes from its step-10
checkpoint and repeats steps 11-13 exactly; the same checkpoint resumed under a plan for
another mesh shape (4 instead of 2x2) continues the reference curve. The plans are the
Megatron-style ones, which shard almost every weight (the example's proved optimum replicates
them all: it is too small for any split to pay). One torchrun run checks the command line.
"""

from __future__ import annotations

import argparse
import copy
import functools
import io
import os
import re
import shutil
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
from autoshard.cli.train import Training, build_parser, main, quiet_dtensor_hints, train, training_steps
from autoshard.cli.training import make_optimizer

from .dist import run_ranks
from .plans import EXAMPLES

TOLERANCE = 1e-4
STEPS, LR = 20, "3e-3"
TORCHRUN = Path(sys.executable).with_name("torchrun")


@functools.lru_cache(maxsize=None)
def _training(name: str) -> Training:
    """An example model with its loss, traced once per session (the plan is filled in per test)."""
    loaded = load_model(str(EXAMPLES / f"{name}.py")).for_training()
    return Training(None, loaded, trace(loaded.model, loaded.example_inputs), torch.device("cpu"))


def _with_plan(name: str, plan: Plan) -> Training:
    base = _training(name)
    return Training(plan, base.loaded, base.graph, base.device)


def _args(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["model.py", "--plan", "plan.json", "--steps", str(STEPS), "--lr", LR, *extra])


def _megatron(name: str, mesh: str) -> Plan:
    mp = build_model_problem(_training(name).graph, mesh, mode="training")
    return make_plan(mp, megatron_choice(mp), model=name)


@functools.lru_cache(maxsize=None)
def _reference(name: str) -> list[float]:
    """The loss curve of the same loop on the unsharded model."""
    model = copy.deepcopy(_training(name).loaded.model)
    optimizer = make_optimizer(model, _args())
    return [loss for _, loss, _ in training_steps(model, optimizer, _training(name).loaded, 1, STEPS, 1.0)]


def _worst(got: list[float], want: list[float]) -> float:
    assert len(got) == len(want)
    return max(abs(g - w) / abs(w) for g, w in zip(got, want))


class _Crash(Exception):
    """Stands for the process dying after a step."""


def _crash_then_resume(rank: int, world: int, first: Training, other: Training, folder: str, spare: str) -> dict:
    quiet_dtensor_hints()
    if rank == 0:  # a group run again after a rank was killed (dist.py) starts from empty folders
        for stale in (folder, spare):
            shutil.rmtree(stale, ignore_errors=True)
    dist.barrier()
    seen: list[float] = []

    def die_after_13(step: int, loss: float) -> None:
        seen.append(loss)
        if step == 13:
            raise _Crash

    with pytest.raises(_Crash):
        train(_args("--checkpoint", folder, "--checkpoint-every", "10"), first, rank, io.StringIO(), die_after_13)
    if rank == 0:
        shutil.copytree(folder, spare)
    dist.barrier()
    out = io.StringIO()
    resumed = train(_args("--checkpoint", folder, "--resume"), first, rank, out)
    elsewhere = train(_args("--checkpoint", spare, "--resume", "--steps", "15"), other, rank, io.StringIO())
    return {"crashed": seen, "resumed": resumed, "elsewhere": elsewhere, "lines": out.getvalue().splitlines(),
            "checkpoints": sorted(p.name for p in Path(folder).iterdir())}


def test_llama_on_2x2_follows_single_device_training_through_a_crash_and_a_new_mesh(tmp_path: Path) -> None:
    first, other = _with_plan("llama", _megatron("llama", "2x2")), _with_plan("llama", _megatron("llama", "4"))
    want = _reference("llama")
    results = run_ranks(4, _crash_then_resume, first, other, str(tmp_path / "ckpt"), str(tmp_path / "spare"),
                        timeout=240)
    for result in results:
        assert _worst(result["crashed"], want[:13]) <= TOLERANCE
        assert result["resumed"][:3] == result["crashed"][10:13]  # the same plan repeats steps 11-13 exactly
        assert _worst(result["resumed"], want[10:]) <= TOLERANCE
        assert _worst(result["elsewhere"], want[10:15]) <= TOLERANCE
    lines = results[0]["lines"]
    assert lines[0].endswith(f"steps 11-20, AdamW lr 0.003, resumed from {tmp_path / 'ckpt' / 'step_000010'}")
    assert [int(line.split()[1]) for line in lines if line.startswith("step ")] == list(range(11, 21))
    assert results[0]["checkpoints"] == ["step_000010", "step_000020"]
    assert want[-1] < want[0] - 0.5  # the example learns: the curve is not flat noise


def _train_plain(rank: int, world: int, training: Training) -> list[float]:
    quiet_dtensor_hints()
    return train(_args(), training, rank, io.StringIO())


def test_llama_on_2_ranks_follows_single_device_training() -> None:
    plan = _megatron("llama", "2")
    assert sum(not spec.is_replicated for spec in plan.param_specs.values()) > 20
    for losses in run_ranks(2, _train_plain, _with_plan("llama", plan), timeout=120):
        assert _worst(losses, _reference("llama")) <= TOLERANCE


TINY = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
example_inputs = (torch.randn(8, 16),)
example_targets = (torch.randn(8, 16),)


def loss(outputs, target):
    return torch.nn.functional.mse_loss(outputs, target)


def batch(step):
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step))
    return x, x.flip(-1)
"""


def tiny_training(path: Path, source: str = TINY, mesh: str = "2") -> Training:
    """``source`` written to ``path`` as a model file, loaded with its loss, traced, with its Megatron plan."""
    path.write_text(source)
    loaded = load_model(str(path)).for_training()
    graph = trace(loaded.model, loaded.example_inputs)
    mp = build_model_problem(graph, mesh, mode="training")
    return Training(make_plan(mp, megatron_choice(mp), model=path.stem), loaded, graph, torch.device("cpu"))


def _resume_with_other_flags(rank: int, world: int, training: Training, folder: str) -> dict:
    quiet_dtensor_hints()
    before = train(_args("--steps", "4", "--checkpoint", folder), training, rank, io.StringIO())
    out = io.StringIO()
    after = train(_args("--steps", "8", "--lr", "3e-2", "--weight-decay", "0.2", "--checkpoint", folder, "--resume"),
                  training, rank, out)
    return {"losses": before + after, "banner": out.getvalue().splitlines()[:1]}


def test_a_resumed_run_trains_with_the_learning_rate_and_weight_decay_given(tmp_path: Path) -> None:
    """Steps 1-4 at lr 3e-3, then a resume with lr 3e-2 and weight decay 0.2: the losses are those of one
    unsharded loop whose optimizer changes both at step 5, and the banner names both values."""
    training = tiny_training(tmp_path / "tiny.py")
    model = copy.deepcopy(training.loaded.model)
    optimizer = make_optimizer(model, _args())
    want = [loss for _, loss, _ in training_steps(model, optimizer, training.loaded, 1, 4, 1.0)]
    for group in optimizer.param_groups:
        group.update(lr=3e-2, weight_decay=0.2)
    want += [loss for _, loss, _ in training_steps(model, optimizer, training.loaded, 5, 8, 1.0)]
    results = run_ranks(2, _resume_with_other_flags, training, str(tmp_path / "ckpt"))
    for result in results:
        assert _worst(result["losses"], want) <= TOLERANCE
    assert results[0]["banner"][0].endswith("steps 5-8, AdamW lr 0.03, weight decay 0.2 (the checkpoint was trained at "
                                     f"lr 0.003, weight decay 0.01), resumed from {tmp_path / 'ckpt' / 'step_000004'}")


UNSEEDED = """import torch
from torch import nn

model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
example_inputs = (torch.randn(8, 16),)
example_targets = (torch.randn(8, 16),)


def loss(outputs, target):
    return torch.nn.functional.mse_loss(outputs, target)
"""


def _train_unseeded(rank: int, world: int, path: str, plan: Plan) -> dict:
    """Each rank runs the model file with its own random state, as separate processes do; rank 0 also
    trains its own model on its own examples unsharded, for reference."""
    quiet_dtensor_hints()
    torch.manual_seed(100 + rank)
    loaded = load_model(path).for_training()
    reference = copy.deepcopy(loaded.model)
    want = [loss for _, loss, _ in training_steps(reference, make_optimizer(reference, _args()), loaded, 1, 3, 1.0)]
    training = Training(plan, loaded, trace(loaded.model, loaded.example_inputs), torch.device("cpu"))
    return {"losses": train(_args("--steps", "3"), training, rank, io.StringIO()), "want": want,
            "inputs": loaded.example_inputs[0].tolist()}


def test_a_model_file_without_batch_trains_on_rank_0s_unseeded_examples(tmp_path: Path) -> None:
    plan = tiny_training(tmp_path / "unseeded.py", UNSEEDED).plan
    first, second = run_ranks(2, _train_unseeded, str(tmp_path / "unseeded.py"), plan)
    assert first["inputs"] != second["inputs"]  # the ranks drew different examples
    for result in (first, second):
        assert _worst(result["losses"], first["want"]) <= TOLERANCE


def test_torchrun_command_prints_a_line_per_step_and_checkpoints(tmp_path: Path) -> None:
    """The command end to end on a tiny model file (tracing it is instant): lines, values, checkpoints."""
    tiny = tiny_training(tmp_path / "tiny.py")
    tiny.plan.save(tmp_path / "plan.json")
    loaded = tiny.loaded
    reference = copy.deepcopy(loaded.model)
    want = [loss for _, loss, _ in training_steps(reference, make_optimizer(reference, _args()), loaded, 1, 6, 1.0)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([str(TORCHRUN), "--standalone", "--nproc_per_node=2", "-m", "autoshard.train", str(tmp_path / "tiny.py"),
                           "--plan", str(tmp_path / "plan.json"), "--steps", "6", "--lr", LR,
                           "--checkpoint", str(tmp_path / "ckpt"), "--checkpoint-every", "3"],
                          cwd=EXAMPLES.parent, env=env | {"OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "autoshard.train: tiny on mesh 2 (2 ranks, gloo), steps 1-6, AdamW lr 0.003"
    steps = [line for line in lines if line.startswith("step ")]
    assert all(re.fullmatch(r"step \d+ loss \d+\.\d{4} \d+\.\d{2} s", line) for line in steps), steps
    printed = [float(line.split()[3]) for line in steps]
    assert len(printed) == 6 and all(abs(p - w) <= 1e-4 * w + 5e-5 for p, w in zip(printed, want)), (printed, want)
    assert f"checkpoint {tmp_path / 'ckpt' / 'step_000003'}" in lines
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_000003", "step_000006"]
    assert done.stderr.strip() == "", done.stderr


@pytest.fixture
def rank0(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's variables for rank 0 of 2."""
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)


@pytest.mark.usefixtures("rank0")
def test_refusals_before_training(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    no_loss = tmp_path / "mlp.py"
    no_loss.write_text("import torch\nfrom tests.runtime.plans import MLP\n\nmodel = MLP()\n"
                       "example_inputs = (torch.randn(8, 8, 16),)\n")
    loaded = load_model(str(no_loss))
    mp = build_model_problem(trace(loaded.model, loaded.example_inputs), "2", mode="training")
    make_plan(mp, megatron_choice(mp), model="mlp").save(tmp_path / "training.json")
    inference = build_model_problem(_training("llama").graph, "2", mode="inference")
    make_plan(inference, megatron_choice(inference), model="llama").save(tmp_path / "inference.json")
    cases = {
        "the mlp model's output is [8, 8, 16], not a scalar loss: define loss(outputs, *targets)":
            [str(no_loss), "--plan", str(tmp_path / "training.json"), "--steps", "2"],
        "inference.json is an inference plan: re-solve with autoshard.solve --mode training":
            ["examples/llama.py", "--plan", str(tmp_path / "inference.json"), "--steps", "2"],
        "--resume needs --checkpoint DIR": ["examples/llama.py", "--plan", "p.json", "--steps", "2", "--resume"],
    }
    for message, argv in cases.items():
        assert main(argv) == 2
        assert not dist.is_initialized()
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("autoshard.train: error: ") and message in err[0], err
