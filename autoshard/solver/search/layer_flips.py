"""Whole-layer flips: every member of a group to its twin at once (``problem.Tally``'s toggles).

One layer starts or stops recomputing in one move, which no search over single nodes or
neighbourhoods smaller than a layer can make (a group's members must agree: forbidden pairs
between them). Nodes outside the group that are tied to its members (a model's reshard copies:
their strategy is a function of both ends of their edge) follow: each one whose edges the flip
made forbidden takes its cheapest strategy given its neighbours. Each pass of ``flip_groups``
takes the flip that lowers the cost most among those that fit:

    x <- argmin { cost(flip_g(x)) : g a group, flip_g(x) fits, cost(flip_g(x)) < cost(x) }

or, where none fits, the cheapest that overflows made to fit by local search, if it still pays
(keeping one more layer's activations can pay for re-gathering parameters to make room);

and each pass of ``fit_by_flips`` (a plan over the memory limit, e.g. the optimum without memory
rows) the one that pays least per byte of overflow it removes:

    x <- argmin { (cost(flip_g(x)) - cost(x)) / (over(x) - over(flip_g(x))) : over(flip_g(x)) < over(x) }
"""

from __future__ import annotations

import time

import numpy as np

from autoshard.solver.core.local_search import Search
from autoshard.solver.core.reduced import INF, FrozenCore

REPAIRED_TRIES = 3
"""Flips that overflow tried per pass, cheapest first, each repaired by local search: the cheapest
flip is the one most likely to pay after the repair, and each try costs a repair and a descent."""
REPAIR_SECONDS = 5.0
"""Without a deadline, the longest one try's repair and descent take."""
FOLLOW_VISITS = 2
"""How often one tied node may take a new strategy in one flip: a tie's strategy follows from its
neighbours, so a second visit only happens along a chain of ties; more means the ties conflict."""


def flip_groups(comp: FrozenCore, x: np.ndarray, deadline: float | None = None,
                rng: np.random.Generator | None = None) -> np.ndarray | None:
    """The plan after the best-paying flips of whole groups (``problem.Tally``: every member to
    its twin, so one layer starts or stops recomputing), one flip per pass, until no flip leaves
    a cheaper plan that fits. Local search cannot make these moves: a group's members must agree
    (forbidden pairs between them), so no single node can change alone. With ``rng``, a pass in
    which no cheaper flip fits tries the REPAIRED_TRIES cheapest that overflow, each made to fit
    by local search (memory freed elsewhere at the least cost per byte, e.g. parameters gathered
    again) and polished, and takes the first that still pays. None when no flip paid."""
    if not comp.toggles:
        return None
    best = np.asarray(x, dtype=np.int64).copy()
    cost = comp.cost(best)
    improved = False
    while deadline is None or time.monotonic() < deadline:
        champion: tuple[int, np.ndarray] | None = None
        over: list[tuple[int, np.ndarray]] = []
        for groups in comp.toggles:
            for members in groups:
                y = flipped(comp, best, members)
                if y is None or (new := comp.cost(y)) >= cost:
                    continue
                if comp.is_feasible(y):
                    if champion is None or new < champion[0]:
                        champion = (new, y)
                elif new < INF:
                    over.append((new, y))
        if champion is None and rng is not None:
            champion = _repaired(comp, sorted(over, key=lambda o: o[0])[:REPAIRED_TRIES], cost, rng, deadline)
        if champion is None:
            break
        (cost, best), improved = champion, True
    return best if improved else None


def _repaired(comp: FrozenCore, tries: list[tuple[int, np.ndarray]], cost: int, rng: np.random.Generator,
              deadline: float | None) -> tuple[int, np.ndarray] | None:
    """The first of ``tries`` (plans that overflow) that local search makes fit at a cost below
    ``cost``, with that cost; None when none does."""
    for _, y in tries:
        until = time.monotonic() + REPAIR_SECONDS if deadline is None else deadline
        search = Search(comp, y, rng)
        if search.repair(until):
            search.descend(until)
            if search.feasible and search.total < cost:
                return search.total, search.x.copy()
    return None


def fit_by_flips(comp: FrozenCore, x: np.ndarray, deadline: float | None = None) -> np.ndarray | None:
    """``x`` made to fit by flips of whole groups, each pass the one that adds least cost per
    byte of overflow removed (module docstring); None when no flip lowers the overflow before
    the plan fits, or at the deadline. Where the cheapest plan without memory rows overflows by
    a few layers' activations, recomputing those layers is often the cheapest way to fit."""
    if not comp.toggles:
        return None
    y = np.asarray(x, dtype=np.int64).copy()
    cost, over = comp.cost(y), comp.overflow(y)
    while over > 0:
        if deadline is not None and time.monotonic() >= deadline:
            return None
        champion: tuple[float, int, int, np.ndarray] | None = None
        for groups in comp.toggles:
            for members in groups:
                z = flipped(comp, y, members)
                if z is None or (new := comp.cost(z)) >= INF or (left := comp.overflow(z)) >= over:
                    continue
                rate = (new - cost) / (over - left)
                if champion is None or rate < champion[0]:
                    champion = (rate, new, left, z)
        if champion is None:
            return None
        _, cost, over, y = champion
    return y if cost < INF else None


def flipped(comp: FrozenCore, x: np.ndarray, members: list[tuple[int, np.ndarray]]) -> np.ndarray | None:
    """x with every member at its twin and the nodes tied to them following (module docstring);
    None when a member has no twin, the group none alive, or a tied node no allowed strategy."""
    if not members:
        return None
    y = x.copy()
    for node, twin in members:
        if twin[y[node]] < 0:
            return None
        y[node] = twin[y[node]]
    return _follow(comp, y, {node for node, _ in members})


def _follow(comp: FrozenCore, y: np.ndarray, moved: set[int]) -> np.ndarray | None:
    """y with every node outside ``moved`` that has a forbidden edge, reached from ``moved``
    through such nodes, at its cheapest strategy given its neighbours (in place); None when one
    has none below FORBIDDEN or is revisited more than FOLLOW_VISITS times."""
    queue = [w for v in moved for w, _ in comp.nbrs[v] if w not in moved]
    visits: dict[int, int] = {}
    while queue:
        v = queue.pop()
        if v in moved or not any(m[y[v], y[w]] >= INF for w, m in comp.nbrs[v]):
            continue
        visits[v] = visits.get(v, 0) + 1
        if visits[v] > FOLLOW_VISITS:
            return None
        total = comp.costs_given(v, y)
        s = int(np.argmin(total))
        if total[s] >= INF:
            return None
        y[v] = s
        queue += [w for w, _ in comp.nbrs[v] if w not in moved]
    return y
