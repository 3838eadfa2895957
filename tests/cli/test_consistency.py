"""Output that agrees with itself and with the user's words: the device line shows the figures the
flags gave, a replicated plan says why without suggesting flags already given, repeated layers are
summarised (every parameter on request), tables name parameters as the model does, scalars read ``()``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autoshard.errors import AutoshardError
from autoshard.problem.plan import Plan
from autoshard.cli.solve import main

ROOT = Path(__file__).resolve().parents[2]
MLP = str(ROOT / "examples" / "mlp.py")

BLOCKS = """
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.fc = nn.Linear(64, 64)
    def forward(self, x):
        return x + self.fc(self.norm(x))

class Net(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.head = nn.Linear(64, 8)
    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x).sum() * x.mean()

torch.manual_seed(0)
model = Net(LAYERS)
example_inputs = torch.randn(32, 64)
"""
SLOW_DEVICE = ("--peak-flops", "1e8", "--memory-bandwidth", "2e6")


def solve(capsys: pytest.CaptureFixture, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def blocks_file(tmp_path: Path, layers: int) -> str:
    path = tmp_path / "blocks.py"
    path.write_text(BLOCKS.replace("LAYERS", str(layers)))
    return str(path)


def test_the_device_line_shows_the_figures_the_flags_gave(capsys: pytest.CaptureFixture) -> None:
    out = solve(capsys, MLP, "--mesh", "2", "--quiet", "--tables", "none", "--peak-flops", "1e12",
                "--memory-bandwidth", "2e6", "--bandwidth", "25e9")
    device = next(line for line in out.splitlines() if line.startswith("device: "))
    assert "1 Tflop/s in every dtype (--peak-flops)" in device and "2 MB/s memory (--memory-bandwidth)" in device
    assert "axis 0 25 GB/s and 1 us (--bandwidth, --latency)" in device


TINY = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(2, 2), nn.GELU(), nn.Linear(2, 2))
example_inputs = torch.randn(2, 2)
"""


def test_a_mesh_that_cuts_nothing_is_named_as_the_reason_and_no_given_flag_is_suggested(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Every dim is 2: three devices cannot each hold a nonempty piece of any (sharding/spec.py's cuts)."""
    path = tmp_path / "tiny.py"
    path.write_text(TINY)
    out = solve(capsys, str(path), "--mesh", "3", "--quiet", "--tables", "none", "--peak-flops", "1e12",
                "--baseline", "megatron")
    reason = "mesh 3 cuts no shardable dim of this model (each is too small for it)"
    replicated = next(line for line in out.splitlines() if line.startswith("all replicated"))
    assert replicated.startswith(f"all replicated: {reason}")
    assert "--peak-flops" not in replicated and "worth sharding" not in out
    assert next(line for line in out.splitlines() if line.startswith("Megatron baseline")).endswith(reason)


def test_repeated_layers_are_summarised_and_listed_in_full_on_request(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # a narrow console: the summary line must not wrap
    path = blocks_file(tmp_path, 12)
    grouped = solve(capsys, path, "--mesh", "2", "--mode", "training", "--quiet", *SLOW_DEVICE)
    every = solve(capsys, path, "--mesh", "2", "--mode", "training", "--quiet", "--params", "all", *SLOW_DEVICE)
    assert "blocks.{0..11}.fc.weight" in grouped and "blocks.5.fc.weight" not in grouped
    assert "(50 parameters in 6 rows; --params all lists each)" in grouped
    assert re.search(r"layer_norm in blocks\.\{0\.\.11\}\.norm .* 12 x ", grouped)  # the reshard table's blocks
    # one comment per kind of note, naming every parameter it concerns
    assert "# gradient of blocks.{0..11}.norm.weight, blocks.{0..11}.norm.bias needs all_reduce" in grouped
    assert "blocks.5.fc.weight" in every and "# gradient of blocks.5.norm.weight needs all_reduce" in every
    assert len(every.splitlines()) - len(grouped.splitlines()) > 60  # 50 parameters, 24 gradient comments


def test_tables_name_parameters_as_the_model_does_and_scalars_read_empty_parens(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = solve(capsys, blocks_file(tmp_path, 2), "--mesh", "2", "--mode", "training", "--quiet", "--tables", "last",
                *SLOW_DEVICE)
    assert "|-blocks.0.norm.weight" in out and "blocks_0_norm_weight" not in out
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│ ")]
    assert ["mul", "()x()", "()"] in [row[:3] for row in rows]  # sum() * mean(): two scalars
    assert not [row for row in rows if "x" in row[1:3] and re.fullmatch(r"x*", row[1])]


def test_a_file_that_is_not_json_is_named_without_a_doubled_word(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text('{"model": "unterminated')
    with pytest.raises(AutoshardError) as info:
        Plan.load(path)
    assert "Unterminated string starting at: line 1 column 11" in str(info.value) and "at at" not in str(info.value)
