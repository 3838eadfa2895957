"""node_caller: replaying every node reproduces the model; attribute overrides reach the call."""

from __future__ import annotations

import pytest
import torch

from autoshard.frontend.call import node_caller, run_graph
from autoshard.frontend.graph import NodeKind
from tests.frontend.helpers import EXAMPLE_NAMES, FX_EXAMPLES, eager_outputs, loaded, traced


GRAPHS = [(name, "auto") for name in EXAMPLE_NAMES] + [(name, "export") for name in FX_EXAMPLES]


@pytest.mark.parametrize(("example_name", "frontend"), GRAPHS)
def test_interpreting_the_graph_reproduces_the_model(example_name: str, frontend: str) -> None:
    graph = traced(example_name, frontend)
    expected = eager_outputs(example_name)
    with torch.no_grad():
        actual = run_graph(graph, loaded(example_name).example_inputs)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert torch.equal(got, want)


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_view_size_override_runs_on_a_head_shard(frontend: str) -> None:
    graph = traced("attention", frontend)
    view = next(node for node in graph if node.op == "view")
    assert view.attrs["size"] == [2, 16, 4, 16]
    local = torch.randn(2, 16, 32)  # half of the 64 features: two of the four heads
    result = node_caller(graph, view.name)([local], {"size": [2, 16, 2, 16]})
    assert torch.equal(result, local.view(2, 16, 2, 16))


def test_enum_override_goes_back_to_the_python_spelling() -> None:
    graph = traced("cnn_loss", "fx")
    loss = next(node for node in graph if node.op == "cross_entropy_loss")
    logits, labels = torch.randn(8, 10), torch.randint(0, 10, (8,))
    summed = node_caller(graph, loss.name)([logits, labels], {"reduction": 2})
    assert torch.allclose(summed, torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))


def test_parameters_come_back_live_and_inputs_are_not_callable() -> None:
    example, graph = loaded("mlp"), traced("mlp", "export")
    weight = next(node for node in graph if node.qualname == "fc1.weight")
    assert node_caller(graph, weight.name)([], {}) is example.model.fc1.weight
    user_input = next(node for node in graph if node.kind is NodeKind.INPUT)
    with pytest.raises(KeyError, match="not callable"):
        node_caller(graph, user_input.name)
    linear = next(node for node in graph if node.op == "linear")
    with pytest.raises(KeyError, match="'size' cannot be passed"):
        node_caller(graph, linear.name)([torch.ones(1, 1024)] + [example.model.fc1.weight] * 2, {"size": [1]})


def test_a_traced_view_of_a_piece_laid_out_otherwise_runs_as_reshape() -> None:
    """A view traced on contiguous strides may meet a local piece a kernel laid out otherwise (a
    sharded attention's output): it runs as reshape, the same values, a view wherever one exists."""
    from autoshard.frontend.call import NodeCall, Operand

    for call in (NodeCall(torch.ops.aten.view.default, (Operand(0), [4, 256, 64])),
                 NodeCall("view", (Operand(0), 4, 256, 64), method=True)):
        piece = torch.randn(4, 8, 256, 8).transpose(1, 2)  # [4, 256, 8, 8], not viewable as [4, 256, 64]
        with pytest.raises(RuntimeError):
            piece.view(4, 256, 64)
        torch.testing.assert_close(call([piece], {}), piece.reshape(4, 256, 64))
        whole = torch.randn(4, 256, 8, 8)
        assert call([whole], {}).data_ptr() == whole.data_ptr()  # still a view where one exists
