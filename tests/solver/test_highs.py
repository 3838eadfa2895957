"""core/highs.py, the one path to HiGHS: the only solver module that imports highspy or scipy's
linprog, and its LP answers (value, duals' sign, infeasibility) as the textbook has them."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
from scipy.sparse import csr_array

from autoshard.solver.core.certify import lagrangian_bound
from autoshard.solver.core.highs import LpModel, solve_lp

SOLVER = Path(__file__).resolve().parents[2] / "autoshard" / "solver"


def _imports(path: Path) -> set[str]:
    """Every module and name ``path`` imports (``from a import b`` gives a and a.b)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_only_core_highs_calls_highs() -> None:
    callers = sorted(str(path.relative_to(SOLVER)) for path in SOLVER.rglob("*.py")
                     if {"highspy", "scipy.optimize.linprog"} & _imports(path))
    assert callers == ["core/highs.py"]


def test_an_lp_gives_its_optimum_and_duals_that_certify_it() -> None:
    """min x + 2y  s.t.  x + y >= 3,  x <= 2,  x, y >= 0: optimum x = 2, y = 1 (value 4); the row's
    dual is 2 (the objective rises by 2 per unit of its right-hand side)."""
    a = csr_array(np.array([[1.0, 1.0]]))
    model = LpModel(np.array([1.0, 2.0]), a, np.array([3.0]), np.array([np.inf]), np.zeros(2), np.array([2.0, np.inf]))
    answer = solve_lp(model)
    assert answer.status == "optimal" and np.allclose(answer.x, [2, 1]) and abs(answer.value - 4) < 1e-9
    assert np.allclose(answer.duals, [2.0])
    bound, _ = lagrangian_bound(model.c, a, answer.duals, model.row_lower, model.row_upper, model.col_lower,
                                model.col_upper)
    assert bound == 4


def test_an_lp_without_solutions_is_infeasible() -> None:
    a = csr_array(np.array([[1.0, 1.0]]))
    model = LpModel(np.ones(2), a, np.array([5.0]), np.array([np.inf]), np.zeros(2), np.ones(2))  # x + y >= 5, x, y <= 1
    assert solve_lp(model).status == "infeasible"
