"""Plans without proofs: searches that return fitting plans never worse than the plan given.

Contract: a ``FrozenCore``, a starting plan and a deadline in; better fitting plans out, no bound.
Large-neighbourhood search (lns.py), whole-layer flips (layer_flips.py), a new best plan's change to
one repeated layer moved onto the others (layer_copies.py, on the problem's own plans), the first fitting plan
from memory-weighted costs (penalised_start.py), toulbar2 on a Lagrangian step's penalised
problem (penalised_probe.py), per-node usage weights (usage_weights.py), processor time shared by
gains (time_shares.py), and the plans-only engine that takes turns between them (turns.py).
Imports only the subpackages above: ``model``, ``procs``, ``core``, ``engines``, ``bounds``.
"""
