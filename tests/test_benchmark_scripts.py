"""Every script in benchmarks/ imports: what it reads of autoshard still exists (a renamed or
removed function breaks a script that no unit test runs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")))
def test_the_script_imports(script: str, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    name = f"benchmark_{script[:-3]}"
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    assert module.__doc__, f"benchmarks/{script} says what it measures in its docstring"
