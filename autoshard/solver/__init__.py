"""The torch-free solver core: find the cheapest plan of a ShardingProblem and prove it optimal.

The problem (model/problem.py; the IOPDDL model, read and written by model/iopddl.py): node i
picks one strategy s_i from its list, edge (u, v) charges a cost matrix entry, and the nodes
live at time t share a memory limit:

    minimise    sum_i c_i[s_i] + sum_(u,v) m_uv[s_u, s_v]                  (objective)
    subject to  sum_{i live at t} usage_i[s_i] <= limit   for every t     (memory rows)
                no chosen c_i[s_i] or m_uv[s_u, s_v] is FORBIDDEN          (forbidden choices)

Subpackages by role, each importing only those listed before it (tests/test_layout.py):

- ``model/``: the problem, IOPDDL files, the options and answer of ``solve``, its events;
- ``procs/``: forked children and their pipes (the only place that forks), silenced C prints;
- ``core/``: the reduced core, exact reductions, memory rows, exact evaluation, local search,
  the ILP, the certify rule for integer bounds, the branching dive on counts;
- ``engines/``: z3 CEGIS, toulbar2, HiGHS's MILP, exact elimination (plan, bound, verdict);
- ``bounds/``: the LP, TRW-S, the Lagrangian relaxation of memory, column generation;
- ``search/``: plans without proofs (neighbourhoods, layer flips, usage weights, ...);
- ``run/``: one ``solve`` call, its phases in order, its engines and bookkeeping.

``api.solve`` is the entry point; ``precompile`` compiles the numba loops once at install.
"""

from autoshard.solver.api import InfeasibleError, Solution, SolveOptions, solve
from autoshard.solver.model.events import Checked, EngineFailed, Finished, Improved, LowerBound, Phase, Reduced, Started

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
