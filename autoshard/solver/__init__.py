"""The torch-free solver core: exact reductions, warm start, z3 CEGIS (see api.py; the search
phases are portfolio.py, the run's bookkeeping state.py)."""

from autoshard.solver.api import InfeasibleError, Solution, SolveOptions, solve
from autoshard.solver.events import Checked, EngineFailed, Finished, Improved, LowerBound, Phase, Reduced, Started

__all__ = [
    "Checked",
    "EngineFailed",
    "Finished",
    "Improved",
    "InfeasibleError",
    "LowerBound",
    "Phase",
    "Reduced",
    "Solution",
    "SolveOptions",
    "Started",
    "solve",
]
