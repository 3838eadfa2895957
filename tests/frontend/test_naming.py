"""Python-level calls fx records without an ATen name of their own get one: einsum's varargs,
F.interpolate, basic tensor indexing, fields of torch.return_types, tensor attributes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autoshard.frontend.call import run_graph

from autoshard.frontend.trace import trace
from autoshard.frontend.graph import NodeKind, OpGraph


class Spellings(nn.Module):
    """One of each spelling; every result is returned so the graph keeps it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 6))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mixed = torch.einsum("bij,jk->bik", x, self.w)
        listed = torch.einsum("bij,bkj->bik", [x, x])
        image = F.interpolate(x.unsqueeze(1), scale_factor=2.0, mode="nearest")
        cut, picked, grown = x[:, :2, :], x[:, 0], x[..., None]
        best = x.max(dim=-1)
        return mixed, listed, image, cut, picked, grown, best.values, best.indices, x.mT, x[0].T


def _ops(graph: OpGraph) -> dict[str, tuple[str | None, dict]]:
    return {node.name: (node.op, node.attrs) for node in graph if node.kind is NodeKind.OP}


def test_fx_names_python_spellings_and_replays_them() -> None:
    torch.manual_seed(0)
    model, x = Spellings(), torch.randn(2, 4, 8)
    graph = trace(model, (x,), "fx")
    ops = _ops(graph)
    assert ops["einsum"] == ("einsum", {"equation": "bij,jk->bik", "path": None})
    assert graph["einsum"].inputs == ("x", "w")
    assert ops["einsum_1"][0] == "einsum" and graph["einsum_1"].inputs == ("x", "x")
    assert ops["interpolate"][0] == "interpolate"
    assert ops["interpolate"][1]["scale_factor"] == 2.0 and ops["interpolate"][1]["mode"] == "nearest"
    assert ops["getitem"] == ("tensor_getitem", {"index": [[None, None, None], [None, 2, None], [None, None, None]]})
    assert ops["getitem_1"] == ("tensor_getitem", {"index": [[None, None, None], 0]})
    assert ops["getitem_2"] == ("tensor_getitem", {"index": ["...", None]})
    fields = [name for name, (op, _) in ops.items() if name.startswith("getattr")]
    assert [ops[name] for name in fields] == [("getitem", {"index": 0}), ("getitem", {"index": 1}),
                                              ("mT", {}), ("numpy_T", {})]
    assert not [name for name, (op, _) in ops.items() if op is None]
    for got, want in zip(run_graph(graph, (x,)), model(x)):
        torch.testing.assert_close(got, want)


def test_export_records_the_aten_ops_the_same_spellings_run() -> None:
    torch.manual_seed(0)
    graph = trace(Spellings(), (torch.randn(2, 4, 8),), "export")
    ops = {op for op, _ in _ops(graph).values()}
    assert {"einsum", "upsample_nearest2d", "slice", "select", "unsqueeze", "max", "getitem", "mT",
            "numpy_T"} <= ops
    assert None not in ops


def test_losses_with_deprecated_reduction_arguments_are_not_named() -> None:
    """``size_average=False`` makes F.cross_entropy sum: named by its schema it would read as a mean."""
    class Losses(nn.Module):
        def forward(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return F.cross_entropy(x, t, size_average=False), F.cross_entropy(x, t, reduction="sum")

    inputs = (torch.randn(4, 3), torch.tensor([0, 1, 2, 1]))
    graph = trace(Losses(), inputs, "fx")
    assert [node.op for node in graph if node.kind is NodeKind.OP] == [None, "cross_entropy_loss"]
    legacy, summed = run_graph(graph, inputs)
    torch.testing.assert_close(legacy, summed)
