"""RunState is written only by run/state.py: every other solver module reports through its methods."""

from __future__ import annotations

import ast
from pathlib import Path

SOLVER = Path(__file__).resolve().parents[2] / "autoshard" / "solver"


def _state_writes(path: Path) -> list[str]:
    """``state.x = ...``, ``self.state.x += ...`` and the like in ``path``, as 'file:line attribute'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, (ast.Name, ast.Attribute)):
                    owner = leaf.value.id if isinstance(leaf.value, ast.Name) else leaf.value.attr
                    if owner == "state":
                        found.append(f"{path.relative_to(SOLVER)}:{node.lineno} {leaf.attr}")
    return found


def test_only_run_state_writes_a_run_state() -> None:
    writes = [w for path in sorted(SOLVER.rglob("*.py")) if path.name != "state.py" for w in _state_writes(path)]
    assert not writes, f"RunState attributes written outside run/state.py: {writes}"
