"""A non-editable install works on its own: the wheel holds every module and the sharding rules,
and ``python -m autoshard.solve`` run from another folder solves the example with it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built without build isolation (setuptools from this venv, no index)
    from a copy of the sources, so that no build/ or egg-info left in the checkout adds files."""
    source, out = tmp_path_factory.mktemp("source") / "autoshard", tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__",
                                                                "tests", "benchmarks", "docs"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                            "--wheel-dir", str(out), str(source)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    (found,) = out.glob("autoshard-*.whl")
    return found


def test_the_wheel_ships_the_rules_and_every_module(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"autoshard/specs/{f.name}" for f in (ROOT / "specs").iterdir() if f.is_file()} <= names
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "autoshard").rglob("*.py")}
    assert modules <= names, sorted(modules - names)[:5]


def test_the_installed_package_solves_the_example_from_another_folder(wheel: Path, tmp_path: Path):
    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
                              "--target", str(target), str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1"}  # ahead of the editable checkout
    where = subprocess.run([sys.executable, "-c", "import autoshard.sharding.rules as r; print(r.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert where.stdout.startswith(str(target)), where.stdout + where.stderr
    run = subprocess.run([sys.executable, "-m", "autoshard.solve", str(ROOT / "examples" / "mlp.py"), "--mesh", "8",
                          "--quiet"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "proved optimal" in run.stdout
