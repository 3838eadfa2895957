"""A non-editable install works on its own: the wheel holds every module and the specs/ folder as
``autoshard.specs``, and ``pip install .`` into a new venv, then ``python -m autoshard.solve
examples/mlp.py --mesh 8 --device h100`` from another folder, solves the example with it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted(f.name for f in (ROOT / "specs").iterdir() if f.is_file())


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the sources without build/, egg-info or caches, so that nothing left in the
    checkout adds files to what is built."""
    copy = tmp_path_factory.mktemp("source") / "autoshard"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__",
                                                              "tests", "benchmarks", "docs"))
    return copy


def test_the_wheel_ships_the_specs_and_every_module(source: Path, tmp_path: Path) -> None:
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                            "--wheel-dir", str(tmp_path), str(source)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("autoshard-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"ops.toml", "devices.toml", "plan.schema.json", "device.schema.json", "README.md"} <= set(SPECS)
    assert {f"autoshard/specs/{name}" for name in SPECS} <= names
    assert not [n for n in names if n.endswith(".toml") and not n.startswith("autoshard/specs/")]  # one copy
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "autoshard").rglob("*.py")}
    assert modules <= names, sorted(modules - names)[:5]


def test_pip_install_into_a_new_venv_solves_the_example_from_another_folder(source: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # `pip install .`, not editable, into the new venv (this venv's pip and setuptools build it: no index here)
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-build-isolation",
                              "--ignore-installed", "--quiet", "--prefix", str(venv), "."],
                             cwd=source, capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-2000:]
    # The dependencies (torch, z3, ...) come from this venv's site-packages, after the new venv's own: a plain
    # path in a .pth file, so this venv's editable autoshard (its own .pth) is not seen.
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | {"OMP_NUM_THREADS": "1"}
    where = subprocess.run([str(python), "-c", "import autoshard.specs as s, autoshard.sharding.rules as r; "
                            "print(s.OPS); print(r.__file__)"], cwd=away, env=env, capture_output=True, text=True)
    assert where.returncode == 0, where.stderr[-2000:]
    assert [line.startswith(str(site / "autoshard")) for line in where.stdout.split()] == [True, True], where.stdout
    run = subprocess.run([str(python), "-m", "autoshard.solve", str(ROOT / "examples" / "mlp.py"), "--mesh", "8",
                          "--device", "h100", "--quiet", "--out", "plan.json"], cwd=away, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "NVIDIA H100 SXM 80GB" in run.stdout and "proved optimal" in run.stdout
    assert (away / "plan.json").is_file()
