"""In-place calls: fx graphs made out of place, refusals naming the op, export functionalised."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autoshard.errors import AutoshardError
from autoshard.frontend.call import run_graph
from autoshard.frontend.trace import trace
from autoshard.frontend.graph import NodeKind, OpGraph


class MaskedMLP(nn.Module):
    """The issue's model: ``h.masked_fill_`` between two linears, then the other in-place spellings."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc1(x)
        alias = h
        h.masked_fill_(mask, 0.0)
        h += 1.0
        torch.relu_(h)
        y = self.fc2(h)
        F.relu(y, inplace=True)
        return y, alias * 2  # alias is h itself: it must see every mutation


class WritesThroughView(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 2
        h[:, 0].zero_()
        return h + 1


class ReadsStaleView(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 2
        row = h[0]
        h.add_(1)
        return row * 3  # row sees the add


class MutatesBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return x + self.count


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=generator), torch.rand(4, 16, generator=generator) > 0.5


def _ops(graph: OpGraph) -> list[str | None]:
    return [node.op for node in graph if node.kind is NodeKind.OP]


def _assert_replays(graph: OpGraph, model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    want = model(*[t.clone() for t in inputs])
    got = run_graph(graph, [t.clone() for t in inputs])
    for g, w in zip(got, want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_fx_rewrites_in_place_calls_out_of_place_and_rewires_their_readers() -> None:
    model, inputs = MaskedMLP(), _inputs()
    graph = trace(model, inputs, "fx")
    assert graph.frontend == "fx" and graph.frontend_note == ""
    assert _ops(graph) == ["linear", "masked_fill", "add", "relu", "linear", "relu", "mul"]
    masked = next(node for node in graph if node.op == "masked_fill")
    add = next(node for node in graph if node.op == "add")
    assert add.inputs == (masked.name,)  # h += 1 reads the masked h, not fc1's output
    relu_y = [node for node in graph if node.op == "relu"][-1]
    assert list(graph)[-1].inputs[0] == relu_y.name  # y was changed by F.relu(y, inplace=True)
    relu_h = [node for node in graph if node.op == "relu"][0]
    assert graph[list(graph)[-1].inputs[1]].inputs == (relu_h.name,)  # alias * 2 reads h after all mutations
    _assert_replays(graph, model, inputs)


def test_replays_leave_their_operands_untouched() -> None:
    model, inputs = MaskedMLP(), _inputs()
    graph = trace(model, inputs, "fx")
    x = inputs[0].clone()
    run_graph(graph, [x, inputs[1]])
    assert torch.equal(x, inputs[0])


@pytest.mark.parametrize("model", [WritesThroughView(), ReadsStaleView()], ids=["write-through-view", "stale-view"])
def test_fx_refuses_mutations_seen_through_views_and_auto_falls_back_to_export(model: nn.Module) -> None:
    x = torch.randn(4, 8)
    with pytest.raises(AutoshardError) as info:
        trace(model, (x,), "fx")
    message = str(info.value)
    assert "\n" not in message and "torch.fx cannot express a mutation seen through a view" in message
    assert "use --frontend export" in message and ("zero_" in message or "add_" in message)
    graph = trace(model, (x,))
    assert graph.frontend == "export" and graph.frontend_note.startswith("torch.fx failed: MutationError: in-place")
    assert not any(node.target.endswith("_.default") or "_." in node.target for node in graph)
    _assert_replays(graph, model, (x,))


def test_export_functionalises_in_place_ops() -> None:
    model, inputs = MaskedMLP(), _inputs()
    graph = trace(model, inputs, "export")
    targets = [node.target for node in graph if node.kind is NodeKind.OP]
    assert targets and not any("_." in target for target in targets), targets
    _assert_replays(graph, model, inputs)
    assert _ops(trace(WritesThroughView(), (torch.randn(4, 8),), "export")) == ["mul", "select", "zero",
                                                                             "select_scatter", "add"]


def test_state_mutation_and_out_arguments_are_refused_in_one_line() -> None:
    model = MutatesBuffer()
    with pytest.raises(AutoshardError, match=r"forward modifies parameter or buffer count in place: "
                                             r"autoshard plans a pure function"):
        trace(model, (torch.randn(4),), "fx")
    assert torch.equal(model.count, torch.zeros(4))  # fx ran the add_ on the real buffer: undone
    graph = trace(model, (torch.randn(4),))  # export functionalises the buffer update
    assert graph.frontend == "export" and "modifies parameter or buffer count" in graph.frontend_note
    torch.testing.assert_close(run_graph(graph, (torch.zeros(4),))[0], torch.ones(4))

    class Out(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.empty_like(x)
            torch.mul(x, 2, out=y)
            return y

    with pytest.raises(AutoshardError, match=r"writes its result into out=: .* assign the result instead"):
        trace(Out(), (torch.randn(4),), "fx")


def test_in_place_operators_on_python_numbers_stay_numbers() -> None:
    class Count(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            n = x.shape[0]
            n += 1
            return x * n

    graph = trace(Count(), (torch.ones(3),), "fx")
    assert _ops(graph) == ["mul"] and next(n for n in graph if n.op == "mul").attrs["other"] == 4


class AssignsItems(nn.Module):
    """``h[:, 0] = y`` and ``h[:, 1:] += y``: item assignment, which torch.fx cannot record."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 2
        h[:, 0] = self.fc(x)[:, 0]
        h[:, 1:] += self.fc(x)[:, 1:]
        return h


def test_item_assignment_is_refused_by_fx_in_one_line_and_exported_differentiably() -> None:
    model, x = AssignsItems(), torch.randn(4, 8)
    with pytest.raises(AutoshardError) as info:
        trace(model, (x,), "fx")
    message = str(info.value)
    assert "\n" not in message and "item assignment x[...] = ... (x the result of node mul)" in message
    assert "use --frontend export" in message
    graph = trace(model, (x,))
    assert graph.frontend == "export" and "item assignment" in graph.frontend_note
    _assert_replays(graph, model, (x,))
    run_graph(graph, [x])[0].sum().backward()  # aten.copy replays differentiably
    replayed = model.fc.weight.grad.clone()
    model.zero_grad()
    model(x).sum().backward()
    torch.testing.assert_close(replayed, model.fc.weight.grad)
