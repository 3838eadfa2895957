"""load_model: the model-file convention and its one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autoshard.errors import AutoshardError
from autoshard.frontend.load import load_model


def write(tmp_path: Path, source: str, name: str = "net.py") -> str:
    path = tmp_path / name
    path.write_text(source)
    return str(path)


def load_error(path: str) -> str:
    with pytest.raises(AutoshardError) as info:
        load_model(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_module_level_model_and_single_tensor_input(tmp_path: Path) -> None:
    path = write(tmp_path, "import torch\nmodel = torch.nn.Linear(4, 2)\nexample_inputs = torch.ones(3, 4)\n")
    loaded = load_model(path)
    assert isinstance(loaded.model, torch.nn.Linear)
    assert len(loaded.example_inputs) == 1 and loaded.example_inputs[0].shape == (3, 4)
    assert loaded.name == "net"


def test_build_function_and_sibling_import(tmp_path: Path) -> None:
    write(tmp_path, "import torch\nclass Net(torch.nn.Linear):\n    pass\n", name="layers.py")
    path = write(tmp_path, "import torch\nfrom layers import Net\n"
                           "def build():\n    return Net(4, 2), [torch.ones(1, 4)]\n")
    loaded = load_model(path)
    assert type(loaded.model).__name__ == "Net"
    assert isinstance(loaded.example_inputs, tuple)


def test_missing_file(tmp_path: Path) -> None:
    message = load_error(str(tmp_path / "nope.py"))
    assert "does not exist" in message and "example_inputs" in message


def test_not_a_python_file(tmp_path: Path) -> None:
    assert "not a .py file" in load_error(write(tmp_path, "model = 1\n", name="net.txt"))


def test_import_error_names_exception_and_line(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, "import torch\n\nraise ValueError('bad width\\nmore')\n"))
    assert "net.py:3" in message and "ValueError: bad width" in message


def test_syntax_error_names_line(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, "x = 1\ndef broken(:\n"))
    assert "net.py:2" in message and "SyntaxError" in message


def test_neither_model_nor_build(tmp_path: Path) -> None:
    assert "neither `model` nor `build()`" in load_error(write(tmp_path, "x = 1\n"))


def test_model_without_example_inputs(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, "import torch\nmodel = torch.nn.Linear(4, 2)\n"))
    assert "not `example_inputs`" in message


def test_model_is_not_a_module(tmp_path: Path) -> None:
    source = "import torch\nmodel = torch.nn.Linear\nexample_inputs = torch.ones(1)\n"
    message = load_error(write(tmp_path, source))
    assert "is a type, not a torch.nn.Module" in message


@pytest.mark.parametrize(("inputs", "expected"), [
    ("[torch.ones(1), 3]", "example_inputs[1] is a int"),
    ("()", "an empty tuple"),
    ("{'x': torch.ones(1)}", "example_inputs is a dict"),
])
def test_bad_example_inputs(tmp_path: Path, inputs: str, expected: str) -> None:
    source = f"import torch\nmodel = torch.nn.Linear(1, 1)\nexample_inputs = {inputs}\n"
    assert expected in load_error(write(tmp_path, source))


def test_build_raising_names_line(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, "def build():\n    return 1 / 0\n"))
    assert "net.py:2" in message and "build() raised ZeroDivisionError" in message


def test_build_returning_wrong_shape(tmp_path: Path) -> None:
    assert "not (model, example_inputs)" in load_error(write(tmp_path, "def build():\n    return None\n"))
