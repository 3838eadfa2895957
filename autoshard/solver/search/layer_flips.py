"""Whole-layer flips: every member of a group to its twin at once (``problem.Tally``'s toggles).

One layer starts or stops recomputing in one move, which no search over single nodes or
neighbourhoods smaller than a layer can make (a group's members must agree: forbidden pairs
between them). Each pass takes the flip that lowers the cost most among those that fit:

    x <- argmin { cost(flip_g(x)) : g a group, flip_g(x) fits, cost(flip_g(x)) < cost(x) }
"""

from __future__ import annotations

import time

import numpy as np

from autoshard.solver.core.reduced import FrozenCore


def flip_groups(comp: FrozenCore, x: np.ndarray, deadline: float | None = None) -> np.ndarray | None:
    """The plan after the best-paying flips of whole groups (``problem.Tally``: every member to
    its twin, so one layer starts or stops recomputing), one flip per pass, until no flip leaves
    a cheaper plan that fits. Local search cannot make these moves: a group's members must agree
    (forbidden pairs between them), so no single node can change alone. None when no flip paid."""
    if not comp.toggles:
        return None
    best = np.asarray(x, dtype=np.int64).copy()
    cost = comp.cost(best)
    improved = False
    while deadline is None or time.monotonic() < deadline:
        champion: tuple[int, np.ndarray] | None = None
        for groups in comp.toggles:
            for members in groups:
                y = _flipped(best, members)
                if y is None:
                    continue
                new = comp.cost(y)
                if new < cost and (champion is None or new < champion[0]) and comp.is_feasible(y):
                    champion = (new, y)
        if champion is None:
            break
        (cost, best), improved = champion, True
    return best if improved else None


def _flipped(x: np.ndarray, members: list[tuple[int, np.ndarray]]) -> np.ndarray | None:
    """x with every member at its twin; None when a member has none (or the group none alive)."""
    if not members:
        return None
    y = x.copy()
    for node, twin in members:
        if twin[y[node]] < 0:
            return None
        y[node] = twin[y[node]]
    return y
