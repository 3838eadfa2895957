"""What the Lagrangian search (portfolio.py) hands over to when its plans stop improving:

1. flips of whole layers (layer_flips.flip_groups): a layer is wider than a wide core's neighbourhoods;
2. a slice of large-neighbourhood search from the best plan (lns.py). On a problem with repeated
   layers the first slice comes as soon as there is a plan, stalled or not: the layer moves
   (search/layer_copies.py) take each neighbourhood's gain to the other layers, so a slice pays
   many times what it pays on a flat core, and the Lagrangian steps it would wait on find few
   plans there (measured: see benchmarks/README.md, "Neighbourhood search first on layered models,
   and layer moves").

Whole-layer flips also polish the first plan (``polish_by_flips``: a start that recomputes every
layer keeps each layer's activations that fit) and make the relaxation's plans that overflow
memory fit (``fit_by_flips_and_polish``: the optimum without memory rows, a few layers over).

The hull bound (column_generation.py) is no move of this process's: where it applies it runs as
an engine in a child process (run/workers.py, portfolio.py ``_second_engines``).
"""

from __future__ import annotations


import numpy as np

from autoshard.solver.run.engine_pool import EnginePool
from autoshard.solver.model.events import Phase
from autoshard.solver.search.lns import LNS_AFTER_STEPS, LNS_SLICE, NeighbourhoodSearch
from autoshard.solver.run.state import RunState
from autoshard.solver.core.local_search import Search
from autoshard.solver.search.layer_flips import fit_by_flips, flip_groups

FLIPS_SHARE = 0.05
"""At most this share of the time left (and FLIPS_MOST seconds) goes to one run of whole-layer
flips outside a stalled search: a pass costs one evaluation per layer and, where no flip fits, up to
layer_flips.REPAIRED_TRIES repairs; they take LLaMA-3-8B's start (every layer recomputed) to
within 2% of the optimum in under 2 s."""
FLIPS_MOST = 5.0
LNS_STALL_SHARE = 0.1
"""... or this share of the time limit and LNS_MIN_STEPS steps without one, whichever comes first:
where Lagrangian steps are slow, thirty of them are a large part of the limit, and neighbourhood
search would start too late to make its gains (measured: see benchmarks/README.md, "Measurements
behind the design")."""
LNS_MIN_STEPS = 10
"""The fewest Lagrangian steps without a plan before the share of the limit counts."""
LNS_SHARE = 0.5
"""Share of the time left a slice of neighbourhood search takes (on some cores it finds what the
Lagrangian search, stalled within seconds, cannot)."""


class StalledSearch:
    """The moves beyond the Lagrangian steps (module docstring) of one run's search."""

    def __init__(self, state: RunState, pool: EnginePool) -> None:
        self.state, self.pool = state, pool
        self.lns = NeighbourhoodSearch(state.comp, state.rng, clock=state.clock)
        self.paid = False  # the last slice of neighbourhood search improved the best plan
        self.sliced = False  # a slice of neighbourhood search has run

    def due(self, since: tuple[float, int], last_step: float) -> bool:
        """True when the last slice of neighbourhood search improved the best plan (it goes on
        while it pays: it takes stalled Lagrangian plans much further), or when this process's
        Lagrangian plans have not improved the best for LNS_AFTER_STEPS steps and twenty steps'
        time, or under a time limit for LNS_MIN_STEPS steps and LNS_STALL_SHARE of the limit
        (``since``: when and how many steps ago they last did), and there is a plan to improve;
        on a problem with repeated layers, also before the first slice (module docstring).
        Plans of the other engines do not put the slice off: each is a new start for it, not a
        reason to wait (measured: see benchmarks/README.md, "Measurements behind the design")."""
        state = self.state
        when, steps = since
        waited = self.state.clock() - when
        if state.best_local is None:
            return False
        if state.problem.layers and not self.sliced:
            return True
        stalled = state.options.timeout is not None and steps >= LNS_MIN_STEPS \
            and waited >= LNS_STALL_SHARE * state.options.timeout
        return self.paid or stalled or (steps >= LNS_AFTER_STEPS and waited >= max(2.0, 20 * last_step))

    def run(self) -> None:
        """Flips, then a slice of neighbourhood search."""
        state = self.state
        budget = self._budget()
        if budget is None:
            return
        if (flipped := flip_groups(state.comp, state.best_local, state.soon(0.2 * budget), state.rng)) is not None:
            state.offer(flipped, "flips", None)
        self._slice()

    def _slice(self) -> None:
        """A slice of large-neighbourhood search from the best plan (lns.py). The engines are heard
        between neighbourhoods; when one's plan beats the slice's, the slice goes on from that plan
        rather than ending (the second engine's plans can come every few seconds; slices that
        ended at each did worse)."""
        state = self.state
        budget = self._budget()
        if budget is None:
            return
        sizes = ", ".join(f"{solver.name} on {solver.size} nodes" for solver in self.lns.solvers)
        state.emit(Phase("lns", f"neighbourhood search ({sizes})", state.elapsed()))
        own = [state.best_cost]  # the best cost this slice knows of (its own plans, or the start)
        self.paid, self.sliced = False, True

        def found(y: np.ndarray) -> None:
            if state.offer(y, "lns", None):
                own[0], self.paid = state.best_cost, True

        def heard() -> bool:
            self.pool.poll()
            if (unfit := self.pool.take_unfit()) is not None:
                fit_by_flips_and_polish(state, unfit)
            return state.finished() or state.best_cost != own[0]

        end = state.soon(budget)
        with state.timed("lns"):
            while True:
                self.lns.run(state.best_local, end, found, heard)
                if state.finished() or state.best_cost == own[0]:
                    break  # out of the slice's time (or finished), not stopped by another's plan
                own[0] = state.best_cost
        state.emit(Phase("lagrange", "back to the Lagrangian search", state.elapsed()))

    def _budget(self) -> float | None:
        """Seconds for a slice of neighbourhood search as the time left stands (LNS_SLICE, or
        LNS_SHARE of what is left if more); None with less than 2 s left."""
        left = self.state.left()
        if left is not None and left < 2.0:
            return None
        return LNS_SLICE if left is None else min(left, max(LNS_SLICE, LNS_SHARE * left))


def polish_by_flips(state: RunState, x: np.ndarray) -> None:
    """Offer ``x`` (it fits) after the whole-layer flips that pay, those repaired by local search
    included, and local search."""
    comp = state.comp
    flipped = flip_groups(comp, x, _flips_deadline(state), state.rng) if comp.toggles else None
    search = Search(comp, x if flipped is None else flipped, state.rng)
    search.descend(state.soon(FLIPS_MOST))
    if search.feasible:
        state.offer(search.x, "flips", None)


def fit_by_flips_and_polish(state: RunState, x: np.ndarray) -> None:
    """A plan that overflows memory (the relaxation's) made to fit by whole-layer flips, then
    polished (``polish_by_flips``); nothing when flips cannot make it fit."""
    if state.comp.toggles and (fitted := fit_by_flips(state.comp, x, _flips_deadline(state))) is not None:
        polish_by_flips(state, fitted)


def _flips_deadline(state: RunState) -> float:
    """When one run of flips outside a stalled search stops (FLIPS_SHARE)."""
    left = state.left()
    return state.soon(FLIPS_MOST if left is None else min(FLIPS_MOST, FLIPS_SHARE * left))
