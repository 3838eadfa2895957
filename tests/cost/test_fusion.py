"""The --compile fusion rule (cost/fusion.py) against the kernels inductor itself generates on CPU.

A pre-norm SwiGLU block (RMSNorm, silu(w1 x) * w3 x, w2, residual) is compiled forward and
backward by torch.compile; the bytes every fused kernel reads and writes are read off inductor's
generated wrapper (each ``cpp_fused_*`` call, its arguments' sizes, in/out roles from the kernel's
signature) and compared with what the model charges the fused ops. Matmuls are extern kernels
in both and are left out.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._inductor.utils import run_and_get_code

from autoshard.api import build_model_problem
from autoshard.cost.devices import GENERIC
from autoshard.cost.fusion import compiled_bytes, compiled_graph, fuse
from autoshard.frontend.graph import NodeKind
from autoshard.frontend.trace import trace

DTYPE_BYTES = {"torch.float32": 4, "torch.bfloat16": 2, "torch.int64": 8}


class Block(nn.Module):
    """x + w2(silu(w1 norm(x)) * w3 norm(x))."""

    def __init__(self, dim: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(dim)
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


def kernel_bytes(code: str) -> tuple[int, int]:
    """(number of fused kernels, bytes they read and write) in one inductor CPU wrapper."""
    sizes: dict[str, int] = {}
    for name, shape in re.findall(r"assert_size_stride\((\w+), \(([\d, ]*)\)", code):
        sizes[name] = math.prod(int(d) for d in shape.split(",") if d.strip()) * 4
    for name, shape, dtype in re.findall(r"(\w+) = empty_strided_cpu\(\(([\d, ]*)\), \([\d, ]*\), (torch\.\w+)\)", code):
        sizes[name] = math.prod(int(d) for d in shape.split(",") if d.strip()) * DTYPE_BYTES[dtype]
    for name, other in re.findall(r"(\w+) = reinterpret_tensor\((\w+),", code):
        sizes[name] = sizes[other]
    roles = {name: re.findall(r"\b(in_out_ptr|in_ptr|out_ptr)\d+", signature)
             for name, signature in re.findall(r"(cpp_fused_\w+) = async_compile\.cpp_pybinding\(.*?kernel\((.*?)\)",
                                                 code, re.S)}
    calls = re.findall(r"^\s+(cpp_fused_\w+)\(([\w, ]*)\)$", code, re.M)
    total = 0
    for name, args in calls:
        for role, arg in zip(roles[name], (a.strip() for a in args.split(","))):
            total += sizes[arg] * (2 if role == "in_out_ptr" else 1)
    return len(calls), total


@pytest.fixture(scope="module")
def inductor() -> tuple[tuple[int, int], tuple[int, int]]:
    """(kernels, bytes) of inductor's forward and backward fused kernels for Block."""
    torch.manual_seed(0)
    compiled = torch.compile(Block())
    x = torch.randn(4, 32, 64, requires_grad=True)

    def step() -> None:
        compiled(x).sum().backward()

    torch._dynamo.reset()
    _, codes = run_and_get_code(step)
    assert len(codes) == 2  # the forward and the backward graph
    return kernel_bytes(codes[0]), kernel_bytes(codes[1])


def model_bytes(graph) -> tuple[int, int, int]:
    """(groups, forward bytes, backward bytes) the model charges the fused ops, replicated."""
    forward = backward = 0
    for node in graph:
        if node.kind != NodeKind.OP or node.work is None or node.work.fused is None:
            continue
        metas = [graph[s].tensor for s in node.inputs]
        needs = [graph.gradient_flows(node, k, m) for k, m in enumerate(metas)]
        moved = compiled_bytes(node.work, [m.nbytes for m in metas], needs, node.tensor.nbytes)
        forward, backward = forward + moved[0], backward + moved[1]
    return len(set(fuse(graph).group.values())), forward, backward


def test_fused_bytes_match_inductors_kernels(inductor) -> None:
    """One group per kernel inductor generates in forward; bytes within 2% forward and 10% backward
    (inductor also writes norm statistics and accumulates the norm's two incoming gradients in its
    kernel; the model counts the gradient once)."""
    (fwd_kernels, fwd_bytes), (_, bwd_bytes) = inductor
    graph = compiled_graph(trace(Block(), (torch.randn(4, 32, 64),)))
    groups, forward, backward = model_bytes(graph)
    assert groups == fwd_kernels
    assert forward == pytest.approx(fwd_bytes, rel=0.02)
    assert backward == pytest.approx(bwd_bytes, rel=0.10)


def test_eager_bytes_are_what_fusion_saves(inductor) -> None:
    """Unfused, the same ops move at least a quarter more than inductor's kernels: the check can fail."""
    (_, fwd_bytes), _ = inductor
    graph = trace(Block(), (torch.randn(4, 32, 64),))
    fused = compiled_graph(graph)
    eager = sum(sum(graph[s].tensor.nbytes for s in n.inputs) + n.tensor.nbytes
                for n in graph if n.name in {m.name for m in fused if m.work is not None and m.work.fused})
    assert eager > 1.25 * fwd_bytes


def test_problem_charges_fused_bytes() -> None:
    """The problem's cost of a fused op is its compiled bytes at the streaming bandwidth, and a value
    only its group reads holds no memory."""
    graph = trace(Block(), (torch.randn(4, 32, 64),))
    mp = build_model_problem(graph, 1, mode="training", compile="model")
    compiled = mp.graph
    silu = next(n for n in compiled if n.op == "silu")
    assert silu.work.fused == ((True,), False)  # reads w1's output, its value stays in the kernel
    i = mp.names.index(silu.name)
    metas = [compiled[s].tensor for s in silu.inputs]
    moved = compiled_bytes(silu.work, [m.nbytes for m in metas], [True], silu.tensor.nbytes)
    seconds = mp.problem.node_costs[i][0] / mp.cost_model.ticks_per_unit
    assert seconds == pytest.approx(sum(moved) / GENERIC.streaming_bandwidth, rel=1e-3)
    assert all(sum(m.usage) == 0 for m in mp.items if m.owner == silu.name and m.what in ("activation", "gradient"))


class Layers(nn.Module):
    """Two Blocks, so that each is a recomputable layer."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_compiled_selective_checkpointing_keeps_what_backward_reads() -> None:
    """Under the selective policy a layer keeps w1's and w2's outputs eagerly; compiled, w2's (read
    only by the residual add, whose backward needs nothing) is neither kept nor run again."""
    graph = trace(Layers(), (torch.randn(4, 32, 64),))
    kept = {}
    for scope in (None, "model"):
        mp = build_model_problem(graph, 1, mode="training", compile=scope, recompute="selective",
                                 memory_budget=1 << 40)
        modules = {n: mp.graph[n].module for n in mp.blocks.block_of}
        kept[scope] = ({modules[n] for n in mp.blocks.saved}, {modules[n] for n in mp.blocks.idle})
    w1, w2 = {f"layers.{i}.w1" for i in (0, 1)}, {f"layers.{i}.w2" for i in (0, 1)}
    assert w1 | w2 <= kept[None][0] and not kept[None][1]
    assert w1 <= kept["model"][0] and not w2 & kept["model"][0] and w2 <= kept["model"][1]
