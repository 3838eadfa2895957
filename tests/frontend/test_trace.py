"""trace(): both frontends, one vocabulary, module paths, shapes, and the error when both fail."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autoshard.errors import AutoshardError
from autoshard.frontend.call import run_graph
from autoshard.frontend.trace import trace
from autoshard.frontend.graph import NodeKind, OpGraph, TensorMeta
from tests.frontend.helpers import EXAMPLE_NAMES, FX_EXAMPLES, loaded, traced

EXPECTED_FRONTEND = {name: "fx" if name in FX_EXAMPLES else "export" for name in EXAMPLE_NAMES}


def op_signature(graph: OpGraph) -> list[tuple[Any, ...]]:
    """Each op as (op, attrs, operand kinds and shapes, output) — everything but node names."""
    def operand(name: str) -> tuple[Any, ...]:
        node = graph[name]
        return (node.kind.value, node.qualname if node.kind is not NodeKind.OP else node.op, node.out)
    return [(node.op, node.attrs, tuple(operand(i) for i in node.inputs), node.out)
            for node in graph if node.kind is NodeKind.OP]


class Zoo(nn.Module):
    """Exercises the Python spellings fx records for ops that export records as ATen calls."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.proj = nn.Linear(16, 48)
        self.norm = nn.LayerNorm(16)
        self.drop = nn.Dropout(0.1)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.embed(ids)
        batch, seq, width = x.shape
        q, k, v = self.proj(x).split(width, dim=-1)
        q, k, v = (t.view(batch, seq, 2, width // 2).permute(0, 2, 1, 3) for t in (q, k, v))
        fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        scores = (q @ k.transpose(-2, -1)) / 4.0
        eager = torch.matmul(F.softmax(scores, dim=-1), v)
        y = torch.cat([fused, eager], dim=-1).transpose(1, 2).reshape((batch, seq, 2 * width))
        y = self.norm(self.drop(1 - 2 * y[..., :width].contiguous() + x))
        logits = torch.flatten(F.gelu(y, approximate="tanh"), 0, 1)
        loss = F.cross_entropy(logits, labels.view(-1), reduction="sum")
        return loss, y.mean(dim=1, keepdim=True).unsqueeze(0).expand(3, -1, -1, -1)


def zoo_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(0, 32, (2, 8)), torch.randint(0, 16, (2, 8))


def test_mlp_fx_and_export_agree() -> None:
    fx_graph, export_graph = traced("mlp", "fx"), traced("mlp", "export")
    assert (fx_graph.frontend, export_graph.frontend) == ("fx", "export")
    assert op_signature(fx_graph) == op_signature(export_graph)
    ops = [node for node in fx_graph if node.kind is NodeKind.OP]
    assert [(n.op, n.module) for n in ops] == [("linear", "fc1"), ("gelu", "act"), ("linear", "fc2")]
    assert ops[0].out == TensorMeta((8, 1024, 4096), "float32", 4)
    assert [fx_graph[i].kind for i in ops[0].inputs] == [NodeKind.INPUT, NodeKind.PARAM, NodeKind.PARAM]
    assert [fx_graph[i].qualname for i in ops[0].inputs] == ["x", "fc1.weight", "fc1.bias"]


def test_python_spellings_normalise_like_aten() -> None:
    torch.manual_seed(0)
    model = Zoo()
    fx_graph, export_graph = trace(model, zoo_inputs(), "fx"), trace(model, zoo_inputs(), "export")
    # y[..., :width] is Python indexing: fx records it as tensor_getitem, export as aten.slice
    assert not [node for node in fx_graph if node.kind is NodeKind.OP and node.op is None]
    fx_ops = op_signature(fx_graph)
    slice_attrs = {"dim": 2, "start": 0, "end": 16, "step": 1}
    index = "'tensor_getitem', {'index': ['...', [None, 16, None]]}"
    named = repr(fx_ops).replace(index, f"'slice', {slice_attrs!r}")
    named = named.replace("('op', 'tensor_getitem',", "('op', 'slice',")
    assert named == repr(op_signature(export_graph))
    by_op = {entry[0]: entry[1] for entry in fx_ops}
    assert by_op["softmax"] == {"dim": -1, "dtype": None}
    assert by_op["split"] == {"split_size": 16, "dim": -1}
    assert by_op["getitem"] == {"index": 2}
    assert by_op["view"] == {"size": [-1]}
    assert by_op["scaled_dot_product_attention"]["is_causal"] is True
    assert by_op["cross_entropy_loss"]["reduction"] == 2
    assert by_op["rsub"] == {"other": 1, "alpha": 1} and by_op["mul"] == {"other": 2}
    embedding = next(node for node in fx_graph if node.op == "embedding")
    assert [fx_graph[i].kind for i in embedding.inputs] == [NodeKind.PARAM, NodeKind.INPUT]


def test_examples_trace_with_the_expected_frontend(example_name: str) -> None:
    graph = traced(example_name)
    assert graph.frontend == EXPECTED_FRONTEND[example_name]
    seen: set[str] = set()
    for node in graph:
        assert set(node.inputs) <= seen, f"{node.name} used before definition"
        seen.add(node.name)
        if node.kind is NodeKind.OP:
            assert node.op is not None, f"{example_name}: {node.name} ({node.target}) has no ATen name"
            assert node.out is not None
    assert list(graph)[-1].kind is NodeKind.OUTPUT
    assert not any("assert" in node.target for node in graph)


def test_hf_nodes_keep_module_paths_and_grad_flags() -> None:
    gpt2 = traced("gpt2")
    modules = {node.module for node in gpt2 if node.op == "addmm"}
    assert "transformer.h.0.attn.c_attn" in modules and "transformer.h.1.mlp.c_proj" in modules
    wte = next(node for node in gpt2 if node.qualname == "transformer.wte.weight")
    assert wte.kind is NodeKind.PARAM and wte.module == "transformer.wte" and wte.requires_grad
    assert not any(node.requires_grad for node in gpt2 if node.op in ("arange", "cumsum", "where"))
    assert all(node.requires_grad for node in gpt2 if node.op == "addmm")


def test_llama_rotary_embedding_is_inlined() -> None:
    llama = traced("llama")
    assert not any("higher_order" in node.target or "wrap_with" in node.target for node in llama)
    rotary = [node for node in llama if node.module == "model.rotary_emb" and node.kind is NodeKind.OP]
    assert {"cos", "sin", "cat"} <= {node.op for node in rotary}
    assert not any(node.requires_grad for node in rotary)
    buffers = {node.qualname for node in llama if node.kind is NodeKind.BUFFER}
    assert "model.rotary_emb.inv_freq" in buffers


def test_grad_mode_bodies_inline_and_autocast_stays_one_node() -> None:
    class Contexts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            with torch.no_grad():
                with torch.enable_grad():
                    inner = self.lin(x * 2)
                frozen = inner + 1
            with torch.autocast("cpu", dtype=torch.bfloat16):
                mixed = self.lin(x) @ x.T
            return frozen, mixed

    model, x = Contexts(), torch.randn(4, 8)
    graph = trace(model, (x,), "export")
    grad = {node.op: node.requires_grad for node in graph if node.op in ("mul", "linear", "add")}
    # inner requires grad, but only feeds frozen, computed under no_grad: no gradient ever reaches it
    assert grad == {"mul": False, "linear": False, "add": False}
    autocast = next(node for node in graph if node.kind is NodeKind.OP and node.op is None)
    assert autocast.target == "wrap_with_autocast" and autocast.out[0].dtype == "bfloat16"
    assert autocast.requires_grad  # mixed = lin(x) @ x.T, returned: its gradient reaches lin.weight
    assert all(torch.equal(a, b) for a, b in zip(run_graph(graph, (x,)), model(x)))


def test_bert_has_two_outputs() -> None:
    output = list(traced("bert"))[-1]
    assert [meta.shape for meta in output.out] == [(2, 16, 64), (2, 64)]


def test_unknown_calls_keep_their_target() -> None:
    class Pick(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("rows", torch.tensor([0, 2]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, self.rows] * 2  # indexing with a tensor has no rule-friendly name

    graph = trace(Pick(), (torch.ones(3, 4),), "fx")
    pick = next(node for node in graph if node.kind is NodeKind.OP)
    assert (pick.op, pick.target, pick.inputs) == (None, "operator.getitem", ("x", "rows"))
    assert pick.out == TensorMeta((3, 2), "float32", 4)


def test_training_flags_survive_tracing() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    model[0].eval()
    graph = trace(model, (torch.ones(2, 4),))
    assert next(node for node in graph if node.op == "dropout").attrs["train"] is False
    assert model.training and not model[0].training and model[1].training


def test_both_frontends_failing_is_one_line() -> None:
    class DataDependent(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x

    with pytest.raises(AutoshardError) as info:
        trace(DataDependent(), (torch.ones(2),))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("cannot trace DataDependent: torch.fx failed (TraceError")
    assert "torch.export failed (" in message


def test_forced_frontend_failure_and_unknown_frontend() -> None:
    class DataDependent(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x

    with pytest.raises(AutoshardError, match="torch.fx cannot trace DataDependent: .*try --frontend export"):
        trace(DataDependent(), (torch.ones(2),), "fx")
    with pytest.raises(AutoshardError, match="unknown frontend 'jit'"):
        trace(loaded("mlp").model, loaded("mlp").example_inputs, "jit")
