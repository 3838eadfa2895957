"""Certified lower bounds on a frozen core, and the plans their relaxations give on the way.

Contract: every bound returned holds for every plan that fits (certified by ``core.certify``).
The LP relaxation (lp.py), TRW-S (trws.py), the Lagrangian relaxation of the memory rows with
TRW-S or elimination as its minimiser (lagrangian.py) or toulbar2 (exact_lagrangian.py), and its
dual by column generation (column_generation.py). Imports only ``model``, ``procs``, ``core`` and
``engines``.
"""
