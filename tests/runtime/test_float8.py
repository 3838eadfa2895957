"""``--float8`` at run time (runtime/float8.py): the plan's program runs torchao's Float8 linears.

Checked against torchao itself: on one rank the program with its linears swapped computes the
loss and every gradient of ``convert_to_float8_training`` applied to the same model (torchtitan's
filter: the ``output`` projection stays bf16), bit for bit, for both recipes; and it differs from
the bf16 program, so the swap is not a no-op. On CPU both run torchao's emulation (the same
casts, fp32 products); what only a GPU checks is ``torch._scaled_mm`` itself (the ``cuda`` cases,
skipped elsewhere). The program under ``torch.compile`` stays one graph and follows the eager
loss. Training the LLaMA example under its Megatron plan on 2 gloo ranks, every layer
recomputed, with Float8 (each shard scaled by its own abs-max) follows the unsharded, unconverted
run within Float8's tolerance: every one of 20 steps' loss within 3% relative (measured: 1.6%;
e4m3 keeps 3 mantissa bits, a rounding of up to 2^-4 per element that the GEMMs' sums average
down), and not equal to it. ``autoshard.train --compile --float8 tensorwise`` on CPU is refused in
one line (``train()`` itself runs the emulation, as here); on a float8 GPU it trains the example
within the same tolerance of the unconverted run.
"""

from __future__ import annotations

import copy
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from autoshard.api import build_model_problem
from autoshard.errors import AutoshardError
from autoshard.frontend.trace import trace
from autoshard.problem.baselines.megatron import megatron_choice
from autoshard.problem.readback import make_plan
from autoshard.runtime.executor import ParallelModule, parallelize
from autoshard.runtime.groups import MeshGroups

from .dist import run_ranks
from .plans import EXAMPLES
from .test_recompute import recompute_everything
from .test_train import TORCHRUN, _args, _megatron, _reference, _training, _with_plan, _worst

torchao_float8 = pytest.importorskip("torchao.float8")


class Block(nn.Module):
    """A residual MLP and a vocabulary projection, bf16: two linears torchao converts, one it skips."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.output = nn.Linear(32, 64), nn.Linear(64, 32, bias=False), nn.Linear(32, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.down(nn.functional.gelu(self.up(x)))
        return self.output(h).float().logsumexp(-1).mean()


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="torch._scaled_mm needs a CUDA GPU with float8 tensor cores"))]
"""CPU runs torchao's emulation; a float8 GPU runs ``torch._scaled_mm`` itself."""


def _model_and_input(device: str = "cpu") -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Block().to(device, torch.bfloat16), torch.randn(4, 16, 32, dtype=torch.bfloat16, device=device)


def _program(model: nn.Module, x: torch.Tensor, recipe: str | None) -> ParallelModule:
    graph = trace(model, (x,))
    mp = build_model_problem(graph, 1, mode="training")
    plan = make_plan(mp, [0] * len(mp.names))
    return parallelize(model, plan, MeshGroups.single(), graph=graph, float8=recipe)


def _torchao(model: nn.Module, recipe: str, device: str = "cpu") -> nn.Module:
    config = replace(torchao_float8.Float8LinearConfig.from_recipe_name(recipe), emulate=device != "cuda")
    return torchao_float8.convert_to_float8_training(copy.deepcopy(model), config=config,
                                                     module_filter_fn=lambda _, fqn: fqn != "output")


def _local_grad(module: ParallelModule, name: str) -> torch.Tensor:
    grad = module.get_parameter(name).grad
    return grad.to_local() if hasattr(grad, "to_local") else grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_one_rank_program_computes_what_torchao_converted_model_computes(recipe: str, device: str) -> None:
    model, x = _model_and_input(device)
    ours, theirs = _program(model, x, recipe), _torchao(model, recipe, device)
    bf16 = _program(model, x, None)
    assert "float8_linear_linear(" in ours.program.code and "float8_linear_linear_1(" in ours.program.code
    assert "torch._C._nn.linear(add" in ours.program.code  # the output projection stays bf16
    loss, want, plain = ours(x), theirs(x), bf16(x)
    loss.backward()
    want.backward()
    assert loss.item() == want.item()
    assert loss.item() != plain.item()
    for name, parameter in theirs.named_parameters():
        assert torch.equal(_local_grad(ours, name), parameter.grad), name


def _compiled_and_eager(rank: int, world: int) -> tuple[int, int, float, float]:
    """Dynamo's graph and break counts and the compiled and eager losses, in a forked rank: inductor's
    compile workers and threads must not live in the test process, whose later forks they abort."""
    import torch._dynamo.utils

    model, x = _model_and_input()
    eager = _program(model, x, "tensorwise")(x).item()
    compiled = _program(model, x, "tensorwise")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled.compile()
    loss = compiled(x)
    loss.backward()
    counters = torch._dynamo.utils.counters
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values()), loss.item(), eager


def test_compiled_float8_program_is_one_graph_following_eager() -> None:
    ((graphs, breaks, loss, eager),) = run_ranks(1, _compiled_and_eager, timeout=600)
    assert (graphs, breaks) == (1, 0)
    assert abs(loss - eager) <= 1e-3 * abs(eager)


FLOAT8_TOLERANCE = 0.03
"""Float8's tolerance on a loss curve: every step within 3% relative of the unconverted run (module doc)."""


def _train_float8(rank: int, world: int, training) -> list[float]:
    import io

    from autoshard.cli.train import quiet_dtensor_hints, train

    quiet_dtensor_hints()
    return train(_args("--float8", "tensorwise"), training, rank, io.StringIO())


def test_sharded_recomputed_float8_training_follows_unconverted_training_within_float8_tolerance() -> None:
    mp = build_model_problem(_training("llama").graph, "2", mode="training", memory_budget=10**15)
    plan = make_plan(mp, recompute_everything(mp, megatron_choice(mp)), model="llama")
    assert plan.recompute  # the linears inside recomputed blocks run in float8 too
    want = _reference("llama")
    for got in run_ranks(2, _train_float8, _with_plan("llama", plan), timeout=600):
        assert 1e-4 < _worst(got, want) <= FLOAT8_TOLERANCE, (got, want)


def test_model_without_convertible_linears_is_refused() -> None:
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(30, 20)).to(torch.bfloat16), torch.randn(4, 30, dtype=torch.bfloat16)
    with pytest.raises(AutoshardError, match="^--float8: the model has no linear torchao converts"):
        _program(model, x, "tensorwise")


def test_unknown_recipe_is_refused() -> None:
    model, x = _model_and_input()
    with pytest.raises(AutoshardError, match="^--float8 'blockwise' is not a recipe: use one of tensorwise, rowwise$"):
        _program(model, x, "blockwise")


def test_training_with_compile_and_float8_on_cpu_is_one_line() -> None:
    from autoshard.cli.train import build_parser, check_args

    args = build_parser().parse_args(["model.py", "--plan", "plan.json", "--steps", "1", "--compile",
                                      "--float8", "tensorwise"])
    with pytest.raises(AutoshardError, match=r"^--float8 runs torchao's Float8 GEMMs on CUDA GPUs [^\n]*$"):
        check_args(args)


def _cli_losses(plan: Path, *flags: str) -> list[float]:
    """``autoshard.train examples/llama.py`` on one CUDA rank (nccl), 20 steps: the printed losses."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([str(TORCHRUN), "--standalone", "--nproc_per_node=1", "-m", "autoshard.train",
                           str(EXAMPLES / "llama.py"), "--plan", str(plan), "--steps", "20", "--lr", "3e-3",
                           "--backend", "nccl", *flags], cwd=EXAMPLES.parent, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return [float(line.split()[3]) for line in done.stdout.splitlines() if line.startswith("step ")]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="autoshard.train --float8 needs a CUDA GPU with float8 tensor cores")
def test_cli_trains_llama_compiled_in_float8_on_one_gpu_within_float8_tolerance(tmp_path: Path) -> None:
    _megatron("llama", "1").save(tmp_path / "plan.json")
    unconverted = _cli_losses(tmp_path / "plan.json", "--compile")
    converted = _cli_losses(tmp_path / "plan.json", "--compile", "--float8", "tensorwise")
    assert len(converted) == len(unconverted) == 20
    assert 0 < _worst(converted, unconverted) <= FLOAT8_TOLERANCE, (converted, unconverted)
