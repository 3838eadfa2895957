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


def weighted_start(comp: FrozenCore, rng: np.random.Generator, deadline: float) -> Search | None:
    """The cheapest fitting plan over the multipliers tried before ``deadline`` (polished by
    local search), or None when none fits."""
    if comp.capacity is None or not len(comp.capacity):
        return None
    areas = memory_areas(comp)
    weight = balanced_weight(comp, areas)
    mp = MessagePassing(comp)
    best: Search | None = None
    previous: bool | None = None
    flat_areas = np.concatenate(areas).astype(np.float64)  # the penalty's layout (FrozenCore.arrays)
    for _ in range(PROBES):
        if time.monotonic() >= deadline:
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
