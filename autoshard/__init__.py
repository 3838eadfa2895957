"""autoshard: find the cheapest sharding of a PyTorch model on a device mesh, prove it optimal, run it.

The solver core (problem, reductions, z3) is torch-free; torch-facing names are loaded lazily so
``import autoshard`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "plan_model": "autoshard.api",
    "build_model_problem": "autoshard.api",
    "solve_model_problem": "autoshard.api",
    "ModelSolution": "autoshard.api",
    "Plan": "autoshard.problem.plan",
    "Mesh": "autoshard.sharding.mesh",
    "parse_mesh": "autoshard.sharding.mesh",
    "TensorSpec": "autoshard.sharding.spec",
    "ShardingProblem": "autoshard.solver.problem",
    "AutoshardError": "autoshard.errors",
    "parallelize": "autoshard.runtime.executor",
    "ParallelModule": "autoshard.runtime.executor",
    "gather_full": "autoshard.runtime.executor",
    "expected_collectives": "autoshard.runtime.executor",
    "export_dtensor": "autoshard.lower.dtensor",
    "create_schedule": "autoshard.runtime.schedule",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'autoshard' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API (loaded lazily) and the module's dunders, so ``dir(autoshard)`` and completion show it."""
    return sorted(set(__all__) | {name for name in globals() if name.startswith("__")})
