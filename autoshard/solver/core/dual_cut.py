"""A linear lower bound on the cost, handed to z3 as a redundant pseudo-Boolean constraint.

LP duals (lp.py) and TRW-S reparametrisations (trws.py) both say: for every plan that fits,

    cost >= const + sum_j w_j * literal_j,    w_j >= 0,

where a literal is a node taking a strategy, or an edge taking a pair of strategies (or their
negations). Added to z3 next to "cost <= B - 1" (cegis.Z3Search.add_cut) it lets z3 fix every
literal with w_j > B - 1 - const and prune with the LP's strength.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DualCut:
    """``const + sum w * literal <= cost`` for every fitting plan. Node terms (i, s, w, positive)
    stand for x[i,s] (positive) or not x[i,s]; pair terms (e, s, t, w, positive) for the indicator
    of edge e taking (s, t) in ``comp.edges`` order, or its negation."""

    const: int
    node_terms: list[tuple[int, int, int, bool]]
    pair_terms: list[tuple[int, int, int, int, bool]]
