"""From the traced OpGraph to the solver's ShardingProblem and back: every node's candidate
strategies with their costs and memory (candidates.py), the problem's edges, liveness and limit
(build.py), a solver choice read back into a Plan (readback.py, plan.py), and hand-written
baseline plans costed in the same model (baselines/)."""
