"""``--device my_gpu.toml``: a preset of one's own (specs/README.md's worked example), in the format of
specs/devices.toml, read and checked against specs/device.schema.json; whatever is wrong with it is one
line naming the field."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from autoshard import specs
from autoshard.cli.solve import main
from autoshard.cost.devices import GiB, PRESETS, get_device, load_presets
from autoshard.errors import AutoshardError

ROOT = Path(__file__).resolve().parents[2]
MY_GPU = (ROOT / "specs" / "README.md").read_text().split("```toml\n")[2].split("```")[0]
"""The worked example of specs/README.md: an H100 at 500 W, with the shipped H100's curves."""


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "my_gpu.toml"
    path.write_text(text)
    return str(path)


def test_a_preset_file_is_a_device_with_its_own_figures(tmp_path: Path) -> None:
    device = get_device(_write(tmp_path, MY_GPU))
    assert device.name == "my_gpu" and device.memory == 80 * GiB
    assert device.peak_flops == {"fp32": 50e12, "tf32": 400e12, "bf16": 800e12, "fp8": 1600e12}
    assert device.achieved["matmul"] == 0.7 and device.runtime_bytes == int(1.3 * GiB) and device.overlap
    assert device.by_flops == PRESETS["h100"].by_flops  # by_flops names a shipped preset: its curves
    assert device.flops_per_second("bfloat16", "matmul", 8.8e12) == pytest.approx(800e12 * 0.681)
    assert not device.sources  # sources are the shipped presets' duty, optional in a file


def test_the_shipped_presets_are_one_file_of_the_same_format() -> None:
    tables = tomllib.loads(specs.DEVICES.read_text())
    assert specs.problem(tables, specs.DEVICE_SCHEMA) is None
    assert load_presets() == PRESETS and set(PRESETS) == set(tables)


@pytest.mark.parametrize("edit, field", [
    (lambda t: t.replace("bf16 = 800e12, ", ""), r"my_gpu\.peak_flops\.bf16 is missing"),
    (lambda t: t.replace("memory = 80\n", 'memory = "80GB"\n'), r"my_gpu\.memory must be number"),
    (lambda t: t.replace("matmul = 0.7", "matmul = 70"),
     r"my_gpu\.achieved\.matmul must be smaller than or equal to 1"),
    (lambda t: t.replace("overlap = true", "overlap = true\nheadrom = 0.2"), r"my_gpu\.headrom is not a field"),
    (lambda t: t.replace("intra = { bandwidth = 370e9, ", "intra = { "), r"my_gpu\.intra\.bandwidth is missing"),
    (lambda t: t.replace('by_flops = "h100"', 'by_flops = "a100"'),
     r"my_gpu\.by_flops names 'a100', a preset without curves\): name one of h100"),
    (lambda t: t.replace('by_flops = "h100"', "by_flops = { matmul = [[1e9, 0.1], [1e8, 0.2]] }"),
     r"my_gpu\.by_flops\.matmul: the flops must ascend"),
    (lambda t: t.replace('by_flops = "h100"', "by_flops = { matmul = [[1e9, 0.1, 3]] }"),
     r"my_gpu\.by_flops\.matmul\[0\] must contain only specified items"),
])
def test_a_malformed_preset_file_is_one_line_naming_the_field(tmp_path: Path, edit, field: str) -> None:
    path = _write(tmp_path, edit(MY_GPU))
    with pytest.raises(AutoshardError, match=rf"^--device file '{path}' is malformed \({field}") as caught:
        get_device(path)
    assert "\n" not in str(caught.value)


def test_a_file_that_is_not_one_preset_says_so(tmp_path: Path) -> None:
    with pytest.raises(AutoshardError, match=r"is not TOML \(.*line 1"):
        get_device(_write(tmp_path, "[my_gpu\n"))
    with pytest.raises(AutoshardError, match=r"holds 2 presets \(my_gpu, other\): give a file of one"):
        get_device(_write(tmp_path, MY_GPU + MY_GPU.replace("[my_gpu]", "[other]")))
    with pytest.raises(AutoshardError, match=r"'nope\.toml' does not exist: give a TOML file of one preset"):
        get_device("nope.toml")
    with pytest.raises(AutoshardError, match="not a preset: use one of a100, .*a preset file"):
        get_device("my_gpu")


def test_the_cli_solves_with_a_preset_file_and_refuses_a_broken_one(capsys, tmp_path: Path) -> None:
    mlp = str(ROOT / "examples" / "mlp.py")
    path = _write(tmp_path, MY_GPU)
    assert main([mlp, "--mesh", "8", "--device", path, "--quiet", "--tables", "none"]) == 0
    out = capsys.readouterr().out
    assert "an H100 capped at 500 W" in out and "proved optimal" in out
    _write(tmp_path, MY_GPU.replace("latency = 47e-6", "latency = -1"))
    assert main([mlp, "--mesh", "8", "--device", path, "--quiet"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "my_gpu.inter.latency must be bigger than or equal to 0" in lines[0], lines
