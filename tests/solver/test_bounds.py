"""Lower bounds and cuts are valid: never above the brute-force optimum, on random problems."""

from __future__ import annotations

import time

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.solver.core.reduced import FrozenCore
from autoshard.solver.core.dual_cut import DualCut
from autoshard.solver.bounds.lagrangian import deflected
from autoshard.solver.bounds.relaxed_minimiser import relaxed_lagrangian
from autoshard.solver.bounds.lp import lp_bound
from autoshard.solver.core.certify import safe_bound

from tests.solver.helpers import core_of


def reduced(seed: int, memory: bool) -> FrozenCore | None:
    """A reduced random core of 2-7 nodes (None: no plan)."""
    return core_of(seed, None, memory)


def optimum(comp: FrozenCore) -> tuple[int, list[int]] | None:
    import itertools

    best = None
    for x in itertools.product(*[range(len(c)) for c in comp.costs]):
        if comp.is_feasible(list(x)):
            cost = comp.cost(list(x))
            if best is None or cost < best[0]:
                best = (cost, list(x))
    return best


def cut_value(comp: FrozenCore, cut: DualCut, x: list[int]) -> int:
    """const + the weights of the literals plan x makes true (pair literals as exact indicators)."""
    total = cut.const
    for i, s, w, positive in cut.node_terms:
        total += w * ((x[i] == s) == positive)
    for e, s, t, w, positive in cut.pair_terms:
        u, v, _ = comp.edges[e]
        total += w * ((x[u] == s and x[v] == t) == positive)
    return total


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), memory=st.booleans())
def test_lagrangian_bounds_plans_and_cut_are_valid(seed, memory):
    comp = reduced(seed, memory)
    if comp is None or comp.n == 0:
        return
    best = optimum(comp)
    search = relaxed_lagrangian(comp, np.random.default_rng(seed))
    for _ in range(15):
        step = search.step(None if best is None else best[0], time.monotonic() + 5)
        if step.plan is not None:
            assert comp.is_feasible(step.plan) and comp.cost(step.plan) == step.cost
            assert best is not None and step.cost >= best[0]
        if best is not None:
            assert step.bound <= best[0]
            assert cut_value(comp, search.minimiser.cut(search.lam), best[1]) <= best[0]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), memory=st.booleans())
def test_lp_bound_and_cut_are_valid(seed, memory):
    comp = reduced(seed, memory)
    if comp is None or comp.n == 0:
        return
    best = optimum(comp)
    relax = lp_bound(comp, 10.0)
    if best is None:
        assert relax.plan is None
        return
    assert not relax.infeasible and relax.bound is not None and relax.bound <= best[0]
    if relax.plan is not None:
        assert comp.cost(relax.plan) == best[0]
    assert cut_value(comp, relax.cut, best[1]) <= best[0]


def test_safe_bound_rounds_up_only_past_the_margin():
    assert safe_bound(10.0, 1.0) == 10
    assert safe_bound(10.5, 1.0) == 11
    assert safe_bound(10.0 + 1e-13, 1e6) == 10
    assert safe_bound(float("-inf"), 0.0) < -(10**18)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-10**6, 10**6), st.integers(-10**6, 10**6)), min_size=1, max_size=6))
def test_deflected_direction_never_turns_against_the_last(pairs):
    """Camerini-Fratta-Maffioli: when g turns against d' the deflected d has d.d' = -g.d'/2 > 0
    (no zig-zag back), and it is g itself otherwise."""
    g = np.array([a for a, _ in pairs], dtype=np.float64)  # usage minus capacity: whole bytes
    previous = np.array([b for _, b in pairs], dtype=np.float64)
    d = deflected(g, previous)
    dot = float(g @ previous)
    if dot >= 0 or not previous.any():
        assert np.array_equal(d, g)
    else:
        assert np.isclose(float(d @ previous), -dot / 2, rtol=1e-9)
        assert float(d @ previous) > 0
