"""--float8 pricing (cost/float8.py): which linears torchao converts, what their GEMMs and casts cost."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from autoshard.api import build_model_problem
from autoshard.cost.devices import PRESETS
from autoshard.errors import AutoshardError
from autoshard.frontend.trace import trace

H100 = PRESETS["h100"]


class Head(nn.Module):
    """A projection torchao converts, one whose dims do not divide by 16, and the vocabulary head."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden, bias=False)
        self.odd = nn.Linear(hidden, 24 + 4, bias=False)
        self.output = nn.Linear(24 + 4, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.odd(self.up(x)))


def linear_seconds(tokens: int, dim: int, hidden: int, float8: str | None) -> dict[str, float]:
    """Forward + backward seconds of each linear of Head in bf16 training on one H100."""
    with torch.device("meta"):
        model = Head(dim, hidden).to(torch.bfloat16)
    graph = trace(model, (torch.zeros(tokens, dim, dtype=torch.bfloat16, device="meta"),))
    mp = build_model_problem(graph, 1, mode="training", device="h100", float8=float8)
    return {mp.graph[n].module: mp.problem.node_costs[i][0] / mp.cost_model.ticks_per_unit
            for i, n in enumerate(mp.names) if mp.graph[n].op == "linear"}


def test_converted_linears() -> None:
    """Only the linear whose dims divide by 16 and that is not the vocabulary head runs in Float8."""
    with torch.device("meta"):
        model = Head(64, 128).to(torch.bfloat16)
    graph = trace(model, (torch.zeros(32, 64, dtype=torch.bfloat16, device="meta"),))
    mp = build_model_problem(graph, 1, mode="training", device="h100", float8="rowwise")
    marked = {n.module: n.work.float8 for n in mp.graph if n.op == "linear"}
    assert marked == {"up": ("rowwise", False, False), "odd": None, "output": None}


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_large_products_near_twice_as_fast(recipe: str) -> None:
    """A LLaMA-3-8B FFN projection (16k tokens, 4096 -> 14336) runs its GEMMs at the fp8 rate, twice
    bf16's, plus casts of a few percent (torchao reports ~1.2-1.4x for these shapes end to end)."""
    bf16 = linear_seconds(16384, 4096, 14336, None)["up"]
    fp8 = linear_seconds(16384, 4096, 14336, recipe)["up"]
    assert 0.5 < fp8 / bf16 < 0.7


def test_small_products_slower_in_float8() -> None:
    """At 64 tokens the casts outweigh the faster GEMM (torchao: float8 slows small linears)."""
    assert linear_seconds(64, 4096, 14336, "tensorwise")["up"] > linear_seconds(64, 4096, 14336, None)["up"]


def test_refused_without_float8_tensor_cores() -> None:
    """An A100 has no faster float8 tensor cores: one line naming devices that have them."""
    with torch.device("meta"):
        model = Head(64, 128).to(torch.bfloat16)
    graph = trace(model, (torch.zeros(32, 64, dtype=torch.bfloat16, device="meta"),))
    with pytest.raises(AutoshardError, match="--float8: a100 .*--device h100"):
        build_model_problem(graph, 1, mode="training", device="a100", float8="tensorwise")
    with pytest.raises(AutoshardError, match="--float8 'blockwise' is unknown"):
        build_model_problem(graph, 1, mode="training", device="h100", float8="blockwise")


def test_training_refuses_float8_on_cpu() -> None:
    """``autoshard.train --float8`` on gloo (CPU) is one line naming what it needs."""
    from autoshard.cli.train import build_parser, check_args

    args = build_parser().parse_args(["model.py", "--plan", "plan.json", "--steps", "1", "--float8", "tensorwise"])
    with pytest.raises(AutoshardError, match=r"^--float8 runs torchao's Float8 GEMMs on CUDA GPUs .*--backend nccl"):
        check_args(args)


class Block(nn.Module):
    """A norm read by a column-parallel linear, whose row-parallel partner feeds a residual add."""

    def __init__(self, dim: int = 1024) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(dim)
        self.w1, self.w2 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(torch.relu(self.w1(self.norm(x))))


def tp_reshards(float8: str | None) -> dict[str, tuple]:
    """(strategies of both ends, forward, backward reshard matrices) of the edges norm -> w1 (the
    input torchao's colwise style gathers) and w2 -> add (the output whose gradient its rowwise
    style gathers back), LLaMA-sized activations on 4 H100s."""
    from autoshard.problem.edges import EdgePrices

    with torch.device("meta"):
        model = Block().to(torch.bfloat16)
    graph = trace(model, (torch.zeros(2, 8192, 1024, dtype=torch.bfloat16, device="meta"),))
    mp = build_model_problem(graph, 4, mode="training", device="h100", float8=float8)
    prices = EdgePrices(mp.mesh, mp.cost_model, mp.options.precision)
    found = {}
    for edge in mp.edges:
        src, dst = mp.graph[edge.src], mp.graph[edge.dst]
        key = "input" if dst.module == "w1" and edge.operand == 0 else "output" if src.module == "w2" else None
        if key is not None and edge.index is not None:
            a, b = mp.candidates[edge.src], mp.candidates[edge.dst]
            found[key] = (a.strategies, b.strategies, *prices.reshard_matrices(a, b, edge.operand, edge.meta, True))
    return found


def test_tensor_parallel_gathers_in_float8() -> None:
    """Tensorwise: the converted linear's input and its output's gradient move one byte an
    element where no partial sum is moved (torchao casts them before redistributing), so those
    gathers cost half of bf16's bandwidth time plus the same latency; partial sums, and rowwise
    scaling (torchtitan applies no Float8 TP styles there), stay bf16."""
    bf16, tensorwise, rowwise = tp_reshards(None), tp_reshards("tensorwise"), tp_reshards("rowwise")
    for key, index in (("input", 2), ("output", 3)):
        srcs, dsts, *mats = bf16[key]
        assert tensorwise[key][:2] == (srcs, dsts) == rowwise[key][:2]
        assert (rowwise[key][index] == mats[index - 2]).all()
        moved = mats[index - 2] > 0
        partial = [[(srcs[i].out_spec if index == 2 else dsts[j].grad_specs[0]).partial != frozenset()
                    for j in range(len(dsts))] for i in range(len(srcs))]
        cheaper = tensorwise[key][index] < mats[index - 2]
        assert (cheaper == (moved & ~np.array(partial, dtype=bool))).all() and cheaper.any()
        assert (tensorwise[key][index][cheaper] > mats[index - 2][cheaper] // 2).all()  # half the bytes
    assert (tensorwise["input"][3] == bf16["input"][3]).all()  # the input gradient: a partial sum, in bf16
