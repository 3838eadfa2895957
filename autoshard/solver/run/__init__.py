"""One ``solve`` call: the phases in order, the engines it starts, and its bookkeeping.

Contract: a ``ShardingProblem`` and ``SolveOptions`` in; a ``Solution`` (or InfeasibleError) out,
with events emitted on the way. Its steps in order (solve.py), the run's clock, best plan,
bounds and answer (state.py), the search on the reduced core (portfolio.py), the registry of
engines in child processes (workers.py) and the pool that runs them (engine_pool.py), z3's
phases (z3_phases.py), proofs by pruning (pruning.py) and what the Lagrangian search hands over
to when it stalls (handover.py).
May import every other subpackage; none imports it.
"""
