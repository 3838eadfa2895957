"""Certified lower bounds on a frozen core, and the plans their relaxations give on the way.

Contract: every bound returned holds for every plan that fits (certified by ``core.certify``).
The LP relaxation (lp.py), TRW-S (trws.py), the one Lagrangian relaxation of the memory rows
(lagrangian.py) with its minimiser plugged in: TRW-S or elimination (relaxed_minimiser.py) or
toulbar2 (exact_lagrangian.py), and its dual by column generation (column_generation.py). Imports only ``model``, ``procs``, ``core`` and
``engines``.
"""
