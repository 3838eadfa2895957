"""Frozen parameters are traced as frozen, and in-place slice fills replay differentiably."""

from __future__ import annotations

import pytest
import torch

from autoshard.frontend.call import run_graph

from autoshard.frontend.trace import trace
from autoshard.frontend.graph import NodeKind
from tests.frozen import SliceFills, frozen_linears, inputs


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_a_frozen_parameter_and_the_ops_it_alone_feeds_require_no_grad(frontend: str) -> None:
    model = frozen_linears()
    graph = trace(model, inputs(model), frontend)
    params = {n.qualname: n.requires_grad for n in graph if n.kind is NodeKind.PARAM}
    assert params == {"fc1.weight": False, "fc1.bias": False, "fc2.weight": True, "fc2.bias": True}
    assert [n.requires_grad for n in graph if n.op in ("linear", "relu")] == [False, False, True]
    fc2 = next(n for n in graph if n.op == "linear" and graph[n.inputs[1]].qualname == "fc2.weight")
    assert graph[fc2.inputs[0]].requires_grad is False  # no gradient flows back into relu


def test_slice_copies_under_export_replay_with_the_models_values_and_gradients() -> None:
    torch.manual_seed(0)
    model, x = SliceFills(), inputs(SliceFills())
    graph = trace(model, x, "export")
    assert {"copy", "slice_scatter"} <= {n.op for n in graph}
    got = run_graph(graph, list(x))[0]
    got.square().sum().backward()
    replayed = {name: p.grad for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    want = model(*x)
    want.square().sum().backward()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for name, p in model.named_parameters():
        torch.testing.assert_close(replayed[name], p.grad, msg=name)
    copies = [n for n in graph if n.op == "copy"]
    # the gradient goes to the copied values only: the slices written into get none (no backward reshard)
    assert len(copies) == 2 and all(n.requires_grad and not graph[n.inputs[0]].requires_grad for n in copies)
