"""The README's example session is what ``make demo`` prints (docs/session.py writes it; run
``python docs/session.py --only demo`` after changing the output)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _session_module():
    spec = importlib.util.spec_from_file_location("readme_session", ROOT / "docs" / "session.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_example_session_is_what_make_demo_prints() -> None:
    session = _session_module()
    assert session.demo_command()[:2] == ["autoshard.solve", "examples/mlp.py"]
    _, changed = session.rewrite((ROOT / "README.md").read_text(), session.generate(["demo"]))
    assert changed == [], "README's example session drifted: run python docs/session.py --only demo"


def test_timings_are_all_that_may_differ() -> None:
    session = _session_module()
    block = "proved optimal: ... (z3; 5 z3 checks, 0.08s)\nstep 1 loss 4.8760 0.49 s\n"
    assert session.normalise(block) == session.normalise(block.replace("0.08s", "1.20s").replace("0.49 s", "3.1 s"))
    assert session.normalise(block) != session.normalise(block.replace("5 z3", "6 z3"))
