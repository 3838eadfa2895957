"""Selective and full recomputation's predicted peaks against MemTracker on torch's own checkpointing."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks import sac_memory
from tests.runtime.dist import run_ranks

SMALL = dict(layers=6, dim=256, heads=4, kv_heads=2, hidden=512, vocab=512, seq=1024)
"""Activations dominate the peak (as in the benchmark's size), in seconds on one core."""


def _measure(policy: str) -> int:
    """MemTracker's peak in a forked process (fake tensors and trackers stay out of this one)."""
    return run_ranks(1, lambda rank, world: sac_memory.measure(policy, Counter()).peak, connect=False)[0]


@pytest.fixture(scope="module")
def predicted():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sac_memory, "SHAPE", SMALL)
        yield sac_memory.predict()


@pytest.mark.parametrize("policy", ["selective", "full"])
def test_recomputing_every_layer_is_predicted_within_three_percent(predicted, monkeypatch, policy: str) -> None:
    monkeypatch.setattr(sac_memory, "SHAPE", SMALL)
    measured = _measure(policy)
    assert abs(predicted[policy].peak / measured - 1) <= 0.03, (predicted[policy].peak, measured)
    assert predicted["full"].peak < predicted["selective"].peak < predicted["none"].peak
