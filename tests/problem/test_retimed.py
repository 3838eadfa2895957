"""Items re-timed from a twin equal items computed in full, item for item, on every node of a build
(ops and parameters)."""

from __future__ import annotations

import pytest

from autoshard.api import build_model_problem
from autoshard.cost.devices import get_device
from autoshard.cost.memory import op_items
from autoshard.problem.retimed import RetimedItems, RetimedParams
from tests.pipeline.models import tiny_llama_graph


def _full(self, node, options, recomputed, gathered, kept_until):
    return op_items(node, [s.out_spec for s in options], [s.degree for s in options], self.life, self.mesh,
                    self.training, recomputed, gathered, kept_until)


def _llama_training(budget: int | None) -> tuple:
    """A 4-layer LLaMA's graph and its training build options (h100, full recomputation offered;
    ``budget`` bytes beside the runtime's, or none)."""
    device = get_device("h100")
    return tiny_llama_graph(4, 4), dict(mode="training", device=device, precision="bf16-mixed", recompute="full",
                                          memory_budget=None if budget is None else device.runtime_bytes + budget)


@pytest.mark.parametrize("budget", [None, 1 << 30])
def test_retimed_items_are_the_items(monkeypatch, budget) -> None:
    """LLaMA training on 2x2 (with a budget: recomputable blocks, so the recomputed windows too)."""
    graph, options = _llama_training(budget)
    calls = []
    first = RetimedItems.items
    monkeypatch.setattr(RetimedItems, "items", lambda self, *a: calls.append(1) or first(self, *a))
    retimed = build_model_problem(graph, "2x2", **options)
    monkeypatch.setattr(RetimedItems, "items", _full)
    full = build_model_problem(graph, "2x2", **options)
    assert len(calls) > 100
    assert {n: c.items for n, c in retimed.candidates.items()} == {n: c.items for n, c in full.candidates.items()}
    assert retimed.problem.intervals == full.problem.intervals
    assert all((a == b).all() for a, b in zip(retimed.problem.node_usages, full.problem.node_usages))


@pytest.mark.parametrize("budget", [None, 1 << 30])
def test_retimed_parameter_items_are_the_items(monkeypatch, budget) -> None:
    """The same for every parameter (with a budget: owners in recomputable blocks, so their
    kept-gathered subsets and recomputed use copies too)."""
    graph, options = _llama_training(budget)
    shared = []
    first = RetimedParams._items
    monkeypatch.setattr(RetimedParams, "_items", lambda self, node, layouts, *a: shared.append(not layouts)
                        or first(self, node, layouts, *a))
    retimed = build_model_problem(graph, "2x2", **options)
    monkeypatch.setattr(RetimedParams, "items", lambda self, _, *a: first(self, *a))
    full = build_model_problem(graph, "2x2", **options)
    assert sum(shared) > 20  # twins were re-timed, not computed
    params = [n for n, c in full.candidates.items() if c.storage is not None]
    assert {n: retimed.candidates[n].items for n in params} == {n: full.candidates[n].items for n in params}
    assert retimed.problem.intervals == full.problem.intervals
    assert all((a == b).all() for a, b in zip(retimed.problem.node_usages, full.problem.node_usages))
