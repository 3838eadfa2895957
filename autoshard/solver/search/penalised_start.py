"""A first fitting plan when the minimum-memory start fails: TRW-S on memory-weighted costs.

With one multiplier w for every memory row the penalised problem is

    min_x  cost(x) + w * sum_i area_i[x_i],    area_i[s] = sum over node i's rows of usage_i[s]

(the Lagrangian of lagrangian.py at lam = w on every row). w = 0 is the memory-free optimum; as w
grows the plans trade cost for memory until they fit. ``weighted_start`` searches w on a
geometric ladder from the scale at which memory and cost spreads weigh alike, keeps the
cheapest fitting plan TRW-S reads off (after local search), and stops at its deadline.

Why: the node-by-node minimum-memory start cannot move groups of nodes that must change
together — a repeated layer's keep/recompute choice is one flag over all its nodes, held by
forbidden pairs — so it can end over budget in a way repair cannot undo; TRW-S decides every
node against its neighbours' messages, so whole layers switch at once (measured: see
benchmarks/README.md, "LLM scale").
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from autoshard.solver.core.reduced import INF, FrozenCore
from autoshard.solver.core.local_search import Search, memory_areas
from autoshard.solver.bounds.trws import MessagePassing

SWEEPS = 3
"""TRW-S sweeps per multiplier (the messages carry over from one multiplier to the next)."""
LADDER = 4.0
"""Factor between successive multipliers."""
PROBES = 12
"""At most this many multipliers are tried."""
SETUP_PER_PASS = 15.0
"""TRW-S's set-up (its message arrays over every strategy and edge) takes about this many times
one pass over every node's memory segments: 4.2 s against 0.3 s on LLaMA-3 405B's 31k-node core
(8x8x8, 80 GiB), where the set-up alone ran 4 s past the greedy phase's deadline."""


def balanced_weight(comp: FrozenCore, areas: list[np.ndarray]) -> float:
    """The multiplier at which the summed spread of memory areas weighs as much as that of costs."""
    def spread(vectors: list[np.ndarray]) -> float:
        total = 0.0
        for v in vectors:
            finite = v[v < INF]
            if len(finite) > 1:
                total += float(finite.max() - finite.min())
        return total

    memory = spread(areas)
    return spread(comp.costs) / memory if memory > 0 else 1.0


def weighted_start(comp: FrozenCore, rng: np.random.Generator, deadline: float,
                   clock: Callable[[], float] = time.monotonic) -> Search | None:
    """The cheapest fitting plan over the multipliers tried before ``deadline`` (polished by
    local search), or None when none fits. TRW-S's set-up cannot be cut, so it starts only when
    SETUP_PER_PASS times the pass over every node's memory segments (``memory_areas``, work of the
    same size, measured on ``clock``) fits before the deadline."""
    if comp.capacity is None or not len(comp.capacity):
        return None
    began = clock()
    areas = memory_areas(comp)
    weight = balanced_weight(comp, areas)
    now = clock()
    if now + SETUP_PER_PASS * (now - began) >= deadline:
        return None
    mp = MessagePassing(comp)
    best: Search | None = None
    previous: bool | None = None
    flat_areas = np.concatenate(areas).astype(np.float64)  # the penalty's layout (FrozenCore.arrays)
    for _ in range(PROBES):
        if clock() >= deadline:
            break
        penalty = weight * flat_areas
        for _ in range(SWEEPS):
            if not mp.sweep(penalty, deadline):
                return best
        search = Search(comp, mp.primal(penalty), rng)
        fits = search.feasible
        if fits:
            search.descend(deadline)
            if best is None or search.total < best.total:
                best = search
        if previous is not None and fits != previous:
            break  # the smallest multiplier on the ladder that fits has been tried
        previous = fits
        weight = weight / LADDER if fits else weight * LADDER
    return best
