"""A tally member's twins in local indices (``reduced.local_twins``) against the plain reading: per
strategy left, the position among those left of its twin, -1 where the twin is gone or none."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.solver.core.reduced import local_twins


def _reference(strategies: np.ndarray, twins: tuple[int, ...]) -> list[int]:
    local = {int(o): i for i, o in enumerate(strategies)}
    return [local.get(twins[int(o)], -1) if twins else -1 for o in strategies]


@settings(max_examples=200, deadline=None)
@given(k=st.integers(1, 12), seed=st.integers(0, 10**6), with_twins=st.booleans())
def test_local_twins_match_the_plain_reading(k: int, seed: int, with_twins: bool) -> None:
    rng = np.random.default_rng(seed)
    strategies = np.flatnonzero(rng.random(k) < 0.6)  # the ids the reductions left, ascending
    twins = tuple(int(t) for t in rng.integers(-1, k, size=k)) if with_twins else ()
    assert local_twins(strategies, twins).tolist() == _reference(strategies, twins)
