"""autoshard: find the cheapest sharding of a PyTorch model on a device mesh, prove it optimal, run it.

The solver core (problem, reductions, z3) is torch-free; torch-facing names are loaded lazily so
``import autoshard`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str], namespace: dict[str, Any]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for names loaded on first use from the modules
    ``exports`` maps them to, so importing the package loads none of them (``namespace``: the
    package's globals, whose dunders ``dir`` shows beside the exports)."""
    def getattr_(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted(set(exports) | {name for name in namespace if name.startswith("__")})

    return getattr_, dir_


_EXPORTS = {
    "plan_model": "autoshard.api",
    "build_model_problem": "autoshard.api",
    "solve_model_problem": "autoshard.api",
    "ModelSolution": "autoshard.api",
    "Plan": "autoshard.problem.plan",
    "Mesh": "autoshard.sharding.mesh",
    "parse_mesh": "autoshard.sharding.mesh",
    "TensorSpec": "autoshard.sharding.spec",
    "ShardingProblem": "autoshard.solver.model.problem",
    "AutoshardError": "autoshard.errors",
    "parallelize": "autoshard.runtime.executor",
    "ParallelModule": "autoshard.runtime.executor",
    "gather_full": "autoshard.runtime.placements",
    "expected_collectives": "autoshard.runtime.checks",
    "export_dtensor": "autoshard.lower.dtensor",
    "create_schedule": "autoshard.runtime.schedule",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())  # dir(autoshard) and completion show the API
