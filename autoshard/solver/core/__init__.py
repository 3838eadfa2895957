"""The reduced core and the rules every method shares.

Contract: ``Core``/``FrozenCore`` (reduced.py) and the frozen core as flat arrays (flat_core.py),
the exact reductions that shrink a core and expand its choice back (reduce.py), the memory rows
on a compressed time axis (rows.py), exact evaluation on the original problem (evaluation.py),
local search (local_search.py), the linearised ILP (ilp.py), the one path to HiGHS for every LP
and MILP (highs.py), one rule for turning float bounds into certified integer bounds
(certify.py), linear cuts for z3 (dual_cut.py) and one branching dive on whole-number counts
(branching.py). Imports only ``model`` and ``procs``.
"""
