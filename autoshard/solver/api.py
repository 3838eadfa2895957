"""``solve``: the solver's entry point — anytime, with a proven lower bound.

Its steps, in order, are run/solve.py; the subpackages by role, solver/__init__.py.
"""

from __future__ import annotations

from autoshard.solver.model.events import EventCallback
from autoshard.solver.model.problem import ShardingProblem
from autoshard.solver.model.solution import InfeasibleError, Solution, SolveOptions
from autoshard.solver.run.solve import solve as run

__all__ = ["InfeasibleError", "Solution", "SolveOptions", "solve"]


def solve(
    problem: ShardingProblem,
    options: SolveOptions | None = None,
    on_event: EventCallback | None = None,
) -> Solution:
    """Find the cheapest plan of ``problem`` (anytime); raise InfeasibleError when none exists.
    ``on_event`` hears the run's events (model/events.py) in order."""
    return run(problem, options or SolveOptions(), on_event or (lambda event: None))
