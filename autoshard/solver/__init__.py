"""The torch-free solver core: find the cheapest plan of a ShardingProblem and prove it optimal.

The problem (problem.py; the IOPDDL model, read and written by iopddl.py): node i picks one
strategy s_i from its list, edge (u, v) charges a cost matrix entry, and the nodes live at
time t share a memory limit:

    minimise    sum_i c_i[s_i] + sum_(u,v) m_uv[s_u, s_v]                  (objective)
    subject to  sum_{i live at t} usage_i[s_i] <= limit   for every t     (memory rows)
                no chosen c_i[s_i] or m_uv[s_u, s_v] is FORBIDDEN          (forbidden choices)

Where each part is implemented:

- exact reductions of the problem (forbidden and dominated strategies, folding, degree-0/1/2
  elimination, merged edges, functional nodes): reduce.py, core.py; memory rows compressed onto
  the reduced core's nodes (segments of rows per node): memory.py;
- bounds: the LP relaxation (relax.py), the Lagrangian relaxation of the memory rows solved by
  TRW-S or elimination (lagrange.py, trws.py, eliminate.py) or, where toulbar2 proves the
  penalised core in a second, exactly (exact_lagrange.py), or by column generation with
  branching on counts (hull.py), cuts for z3 from their duals (cut.py);
- plans: minimum-memory start and local search (heuristics.py, penalised_start.py), Lagrangian
  plans (exact ones: exact_lagrange.py), toulbar2 on the penalised subproblem (subproblem.py,
  toulbar.py), what runs when the Lagrangian plans stall (stalled.py): whole-layer flips
  (tally.py), the hull bound's priced plans and large-neighbourhood search (lns.py); usage
  weights (usage_weights.py);
- proofs: z3 CEGIS, "is there a plan cheaper than the best?" until UNSAT (cegis.py, run by
  z3_phases.py), exact elimination (eliminate.py), HiGHS's MILP of the linearised core
  (milp.py, linearised.py) after branching on whole-number counts (tally.py, bounds certified
  by dual_bound.py), toulbar2's branch and bound with the memory rows as knapsack constraints
  (toulbar.py), alone or on the strategies TRW-S's bound leaves (pruning.py);
- engines in child processes, started, polled and stopped alike and reporting typed events
  (workers.py, engine_events.py, engine_pool.py; forks.py for every fork): toulbar2,
  toulbar2-vns, toulbar2-no-rows, highs and second-search (second_search.py);
- numba loops compiled once at install (precompile.py); the order of the phases (portfolio.py), one run's clock, best plan, bounds and answer
  (state.py), the entry point ``solve`` and its pipeline (api.py), the events it emits
  (events.py). Every plan is evaluated exactly on the original problem (evaluation.py).
"""

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
