"""Charged flops equal torch's own flop counter: whole models (forward + backward on the meta
device) and every strategy of the matmul-like, convolution and attention ops (local shapes)."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from autoshard.api import build_model_problem
from autoshard.frontend.call import node_caller
from autoshard.frontend.trace import trace
from autoshard.frontend.graph import NodeKind
from tests.frontend.helpers import EXAMPLE_NAMES, loaded


class ConvNet(nn.Module):
    """Strided, grouped and depthwise convolutions: the cases a signature's flops overcounted."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 5, stride=2, padding=2)
        self.grouped = nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=4)
        self.depthwise = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.pointwise = nn.Conv1d(32, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.depthwise(F.relu(self.grouped(F.relu(self.stem(x))))))
        return self.pointwise(x.flatten(2)).pow(2).mean()


class GQABlock(nn.Module):
    """Grouped-query causal attention through torch's fused kernel, then a SwiGLU MLP."""

    def __init__(self, hidden: int = 64, heads: int = 8, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.kv = nn.Linear(hidden, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.up = nn.Linear(hidden, 3 * hidden, bias=False)
        self.gate = nn.Linear(hidden, 3 * hidden, bias=False)
        self.down = nn.Linear(3 * hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        a = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, h))
        return (x + self.down(F.silu(self.gate(x)) * self.up(x))).pow(2).mean()


def held_out() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    return {"convnet": (ConvNet(), (torch.randn(2, 3, 32, 32),)),
            "gqa": (GQABlock(), (torch.randn(2, 16, 64),))}


def _torch_flops(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> int:
    """FlopCounterMode over the model's forward and backward on the meta device."""
    meta = model.to("meta")
    args = tuple(t.to("meta") for t in inputs)
    with FlopCounterMode(display=False) as counter:
        out = meta(*args)
        first = out if isinstance(out, torch.Tensor) else next(t for t in torch.utils._pytree.tree_leaves(out)
                                                              if isinstance(t, torch.Tensor) and t.is_floating_point())
        first.float().sum().backward()
    return counter.get_total_flops()


def _charged(graph) -> int:
    return sum(n.work.flops + n.work.backward_flops for n in graph if n.kind == NodeKind.OP and n.work)


@pytest.mark.parametrize("name", ["convnet", "gqa"])
def test_held_out_models_charge_torchs_flops(name):
    model, inputs = held_out()[name]
    graph = trace(model, inputs)
    assert _charged(graph) == _torch_flops(model, inputs)


@pytest.mark.parametrize("name", [n for n in EXAMPLE_NAMES if n not in ("gpt2", "bert", "llama")])
def test_examples_charge_torchs_flops(name):
    example = loaded(name)
    graph = trace(example.model, example.example_inputs)
    assert _charged(graph) == _torch_flops(copy.deepcopy(example.model), example.example_inputs)


def test_strided_conv_and_attention_are_not_overcounted():
    """The signature formula counted stride^2 too many conv flops and both attention head dims."""
    model, inputs = held_out()["convnet"]
    graph = trace(model, inputs)
    stem = next(n for n in graph if n.op == "conv2d")
    assert stem.work.flops == 2 * 2 * 16 * 16 * 16 * 3 * 5 * 5  # 2 * batch * out pixels * out ch * in ch * kernel
    model, inputs = held_out()["gqa"]
    attention = next(n for n in trace(model, inputs) if n.op == "scaled_dot_product_attention")
    assert attention.work.flops == 4 * 2 * 8 * 16 * 16 * 8  # 4 * b * heads * s * t * head_dim


def _local_operands(node, strategy, graph, mesh_shape):
    tensors = []
    for src, spec in zip(node.inputs, strategy.in_specs):
        meta = graph[src].tensor
        shape = spec.local_shape(meta.shape, mesh_shape) if spec is not None else meta.shape
        dtype = getattr(torch, meta.dtype)
        tensors.append(torch.zeros(shape, dtype=dtype, device="meta") if not dtype.is_floating_point
                       else torch.empty(shape, dtype=dtype, device="meta"))
    return tensors


@pytest.mark.parametrize("name", ["mlp", "attention", "cnn", "gqa", "convnet"])
def test_every_strategy_charges_the_flops_of_its_local_shapes(name):
    """The flops charged per device equal torch's count for the op run on one device's pieces
    (not always the global count over the degree: cutting attention's value head dim halves only
    its second matmul)."""
    if name in ("gqa", "convnet"):
        model, inputs = held_out()[name]
    else:
        model, inputs = loaded(name).model, loaded(name).example_inputs
    graph = trace(model, inputs)
    mp = build_model_problem(graph, "2x2")
    checked = 0
    for node in graph:
        if node.kind != NodeKind.OP or not node.work or not node.work.flops:
            continue
        cand = mp.candidates[node.name]
        for strategy, (charged, _) in zip(cand.strategies, cand.flops):
            operands = _local_operands(node, strategy, graph, mp.mesh.shape)
            with FlopCounterMode(display=False) as counter:
                node_caller(graph, node.name)(operands, {})
            assert counter.get_total_flops() == charged, (node.name, strategy.assignment)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("shape", list(itertools.product([1, 3], [8, 12], [2, 4])))
def test_random_conv_shapes(shape):
    batch, size, stride = shape
    conv = nn.Conv2d(4, 8, 3, stride=stride, padding=1, groups=2)
    graph = trace(conv, (torch.randn(batch, 4, size, size),))
    node = next(n for n in graph if n.op in ("conv2d", "convolution"))
    with FlopCounterMode(display=False) as counter:
        conv.to("meta")(torch.empty(batch, 4, size, size, device="meta"))
    assert node.work.flops == counter.get_total_flops()
