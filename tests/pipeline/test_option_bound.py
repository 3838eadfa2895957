"""The option's bound searched against a best step (option_bound.py), on fake device searches:
with no best step every device is searched to its end; with one, the bound reaches it wherever
the full searches' bound does, and never exceeds that bound."""

from __future__ import annotations

import math

import pytest

from autoshard.pipeline.option_bound import option_bound
from autoshard.pipeline.options import options_for
from autoshard.pipeline.schedules import device_orders, peak_in_flight
from autoshard.pipeline.stages import critical_path
from tests.pipeline.models import tiny_llama_graph
from autoshard.pipeline.search import PipelineSearch
from autoshard.cost.devices import get_device
from autoshard.sharding.mesh import parse_mesh

LAYERS = 6


@pytest.fixture(scope="module")
def setup():
    device = get_device("h100")
    mesh = parse_mesh("2x2", None, None, 8, device.intra, device.inter)
    engine = PipelineSearch(lambda m: tiny_llama_graph(LAYERS, 8 // m), mesh, 0,
                            dict(mode="training", device=device), None)
    option = next(o for o in options_for(LAYERS, 2, [4], ("1f1b",)))
    stages = engine.stages(option)
    orders = device_orders(option.schedule, option.devices, option.microbatches, option.virtual)
    groups: dict[tuple, list[int]] = {}
    for d, stage in enumerate(stages):
        groups.setdefault(stage.signature, []).append(d)
    held = {sig: max(peak_in_flight(orders[d]) for d in ds) for sig, ds in groups.items()}
    return option, stages, orders, groups, held


class FakeSearch:
    """A device's multiplier search: its bound at no penalty (``free``) rising in unit steps to
    its full bound (``full``), stopping at the first step that reaches ``enough``."""

    def __init__(self, free: dict, full: dict) -> None:
        self.free, self.full, self.calls = free, full, []

    def __call__(self, stage, held, kept, enough):
        self.calls.append((stage.signature, kept, enough))
        value = self.free[stage.signature] + (0.0 if kept else 0.5)
        while value < min(enough, self.full[stage.signature] + (0.0 if kept else 0.5)):
            value = min(value + 1.0, self.full[stage.signature] + (0.0 if kept else 0.5))
        return value


@pytest.mark.parametrize("rises", [(5.0, 5.0), (9.0, 1.0), (0.0, 7.0)])
def test_the_bound_reaches_the_cutoff_where_the_full_searches_do(setup, rises) -> None:
    option, stages, orders, groups, held = setup
    sigs = list(groups)
    free = {sig: 1.0 + k for k, sig in enumerate(sigs)}
    full = {sig: free[sig] + rise for sig, rise in zip(sigs, rises)}
    complete = critical_path(len(option.counts), stages, orders, [full[st.signature] for st in stages])
    search = FakeSearch(free, full)
    assert option_bound(search, option.label, stages, len(option.counts), orders, groups, held) == \
        pytest.approx(complete)
    assert all(enough == math.inf for _, kept, enough in search.calls if kept)
    for cutoff in (0.5 * complete, 0.9 * complete, complete, 1.1 * complete):
        bound = option_bound(FakeSearch(free, full), option.label, stages, len(option.counts), orders, groups,
                             held, cutoff)
        assert bound <= complete * (1 + 1e-12)
        assert (bound >= cutoff) == (complete >= cutoff)
