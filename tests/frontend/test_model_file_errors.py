"""Bad model files a new user writes: each ends in one line of ours on stderr and exit status 2,
naming the real fault (the user's forward, loss or inputs), never the tracer when tracing is not it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoshard.cli.solve import main

ROOT = Path(__file__).resolve().parents[2]

SHAPE_MISMATCH = """
import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(64, 32)
    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))
model = Net()
example_inputs = (torch.randn(4, 64),)
"""

LINEAR = "import torch\nmodel = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())\n"

BAD_FILES = {
    "syntax_error": ("import torch\nmodel = torch.nn.Linear(4, 4\nexample_inputs = torch.ones(2, 4)\n",
                     ["net.py:2", "SyntaxError"]),
    "no_model": ("import torch\nnet = torch.nn.Linear(4, 4)\nexample_inputs = torch.ones(2, 4)\n",
                 ["neither `model` nor `build()`"]),
    "list_input": ("import torch\nmodel = torch.nn.Linear(4, 4)\nexample_inputs = ([1.0, 2.0],)\n",
                   ["example_inputs[0] is a list, not a tensor"]),
    "forward_raises": (
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        raise ValueError(f'expected 16 features, got {x.shape[-1]}')\n"
        "model = Net()\nexample_inputs = torch.ones(2, 8)\n",
        ["forward of Net fails on its example inputs", "ValueError: expected 16 features, got 8",
         "net.py:4 in forward"]),
    "shape_mismatch": (SHAPE_MISMATCH, ["forward of Net fails on its example inputs", "aten.addmm on",
                                        "[4, 128]", "net.py:9 in forward"]),
    "double_input": (LINEAR + "example_inputs = torch.ones(2, 8, dtype=torch.float64)\n",
                     ["fails on its example inputs", "same dtype", "float64 [2, 8]"]),
    "integer_input": (LINEAR + "example_inputs = torch.ones(2, 8, dtype=torch.long)\n",
                      ["fails on its example inputs", "int64 [2, 8]"]),
    "loss_without_targets": (
        LINEAR + "example_inputs = torch.ones(4, 8)\n"
        "def loss(out, target, weight):\n    return ((out - target) ** 2 * weight).mean()\n",
        ["loss(out, target, weight) but no `example_targets`", "define example_targets"]),
    "loss_with_too_many_targets": (
        LINEAR + "example_inputs = torch.ones(4, 8)\nexample_targets = (torch.ones(4, 8), torch.ones(4, 8))\n"
        "def loss(out, target):\n    return ((out - target) ** 2).mean()\n",
        ["takes 1 target after the outputs, but example_targets holds 2"]),
    "non_scalar_loss": (
        LINEAR + "example_inputs = torch.ones(4, 8)\nexample_targets = torch.zeros(4, 8)\n"
        "def loss(out, target):\n    return (out - target) ** 2\n",
        ["returns float32 [4, 8], not a floating-point scalar", ".mean()"]),
    "loss_returning_a_number": (
        LINEAR + "example_inputs = torch.ones(4, 8)\nexample_targets = torch.zeros(4, 8)\n"
        "def loss(out, target):\n    return 1.0\n",
        ["returns no tensor, not a floating-point scalar"]),
    "forward_missing_an_input": (
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def forward(self, x, y):\n"
        "        return x + y\n"
        "model = Net()\nexample_inputs = torch.ones(2, 8)\n",
        ["forward of Net fails on its example inputs", "missing 1 required positional argument: 'y'"]),
    "loss_shape_mismatch": (
        LINEAR + "example_inputs = torch.ones(4, 8)\nexample_targets = torch.zeros(4, 3)\n"
        "def loss(out, target):\n    return ((out - target) ** 2).mean()\n",
        ["forward of Sequential with its loss fails", "aten.sub on float32 [4, 8], float32 [4, 3]",
         "net.py:6 in loss", "example_targets"]),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_model_file_is_one_line_naming_the_fault(case: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    source, expected = BAD_FILES[case]
    path = tmp_path / "net.py"
    path.write_text(source)
    code = main([str(path), "--mesh", "2", "--mode", "training", "--quiet", "--tables", "none"])
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: "), err
    for part in expected:
        assert part in lines[0]
    assert "WithLoss" not in lines[0] and "cannot trace" not in lines[0]


def test_a_forward_that_fails_prints_no_torch_logs(tmp_path: Path) -> None:
    """torch's fake-tensor logger prints a traceback per failed op while tracing; the user sees our line only."""
    path = tmp_path / "net.py"
    path.write_text(SHAPE_MISMATCH)
    done = subprocess.run([sys.executable, "-m", "autoshard.solve", str(path), "--mesh", "2", "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [done.stderr.strip()] and "mat1 and mat2 shapes" in done.stderr
