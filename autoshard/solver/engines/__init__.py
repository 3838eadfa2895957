"""Exact and plan-finding engines on a frozen core.

Contract: a ``FrozenCore`` and limits in; a plan, a certified lower bound and a verdict out, as
values. z3 CEGIS (cegis.py), toulbar2 (toulbar.py), HiGHS's MILP (milp.py) and exact variable
elimination (elimination.py). Imports only ``model``, ``procs`` and ``core``.
"""
