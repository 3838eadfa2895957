"""--async-tp pricing (cost/async_tp.py): TP collectives hidden under the matmuls beside them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch._inductor.fx_passes.micro_pipeline_tp import _find_consumer_matmuls, _find_producer_matmul
from torch.fx.experimental.proxy_tensor import make_fx

from autoshard.api import build_model_problem
from autoshard.cost.async_tp import exposed
from autoshard.frontend.trace import trace
from autoshard.problem.baselines.megatron import megatron_choice


def test_exposed_is_what_the_fused_matmul_cannot_hide() -> None:
    """max(0, F - M) + max(0, B - G / 2): one matmul hides (the larger of the two ends), in the
    backward only its input-gradient half."""
    forward = np.array([[10, 0], [30, 5]])
    backward = np.array([[8, 8], [0, 20]])
    producer = (np.array([4, 1]), np.array([2, 2]))
    consumer = (np.array([3, 3]), np.array([6, 30]))
    want = [[max(0, 10 - 4) + max(0, 8 - 6 // 2), 0 + max(0, 8 - 30 // 2)],
            [max(0, 30 - 3) + 0, max(0, 5 - 3) + max(0, 20 - 30 // 2)]]
    assert exposed(forward, backward, producer, consumer).tolist() == want == [[11, 0], [27, 7]]
    assert exposed(forward, backward, producer, None).tolist() == [[6 + 7, 0 + 7], [29 + 0, 4 + 19]]
    assert exposed(forward, backward, None, None).tolist() == (forward + backward).tolist()


def test_summed_gradient_charged_in_full() -> None:
    """With several gradient writers the backward collective hides under nothing; the forward
    still hides under the matmuls."""
    forward = np.array([[10, 0], [30, 5]])
    backward = np.array([[8, 8], [0, 20]])
    producer = (np.array([4, 1]), np.array([2, 2]))
    consumer = (np.array([3, 3]), np.array([6, 30]))
    assert exposed(forward, backward, producer, consumer, writers=3).tolist() == [[6 + 8, 0 + 8], [27 + 0, 2 + 20]]


def _joint(readers: int) -> torch.fx.Graph:
    """The aten graph (make_fx) of a step whose 2-D input ``x`` is read by ``readers`` linears,
    returning the forward products and x's gradient, as inductor's passes see a 2-D TP step."""
    def step(x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = [nn.functional.linear(x, w) for w in weights]
        return (*outs, *torch.autograd.grad(sum(o.sum() for o in outs), x))

    x = torch.randn(8, 16, requires_grad=True)
    return make_fx(step)(x, *(torch.randn(4, 16, requires_grad=True) for _ in range(readers))).graph


@pytest.mark.parametrize("readers", [1, 2, 3])
def test_writers_as_torch_fuses(readers: int) -> None:
    """Independent reference: on a real traced step, torch's micro-pipeline pass finds a matmul
    producing x's gradient (the reduce-scatter it would fuse) only when one linear reads x, and
    finds every reader among the matmuls consuming x (the all-gather it fuses with all of them).
    ``exposed`` hides the backward exactly when torch's pass would fuse it."""
    graph = _joint(readers)
    output = next(n for n in graph.nodes if n.op == "output")
    gradient = output.args[0][-1]
    fused_backward = _find_producer_matmul(gradient) is not None
    x = next(n for n in graph.nodes if n.op == "placeholder")
    assert len(_find_consumer_matmuls(x)) == readers
    one = np.array([[10]])
    hidden = exposed(one * 0, one, None, (np.array([0]), np.array([20])), writers=readers)[0, 0] == 0
    assert fused_backward == hidden == (readers == 1)


class Mlp(nn.Module):
    """Two Megatron MLPs with a norm between: column- then row-parallel pairs."""

    def __init__(self, dim: int = 1024) -> None:
        super().__init__()
        self.a1, self.a2 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)
        self.norm = nn.RMSNorm(dim)
        self.b1, self.b2 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.a2(torch.relu(self.a1(x)))
        return h + self.b2(torch.relu(self.b1(self.norm(h))))


def test_megatron_plan_cheaper_by_hidden_collectives() -> None:
    """Megatron's plan on 4 devices costs less with async TP, by at most its collectives' time."""
    with torch.device("meta"):
        model = Mlp().to(torch.bfloat16)
    graph = trace(model, (torch.zeros(8, 2048, 1024, dtype=torch.bfloat16, device="meta"),))
    costs = {}
    for async_tp in (False, True):
        mp = build_model_problem(graph, 4, mode="training", device="h100", async_tp=async_tp)
        choice = megatron_choice(mp)
        edges = sum(int(m[choice[a], choice[b]]) for (a, b), m in zip(mp.problem.edges, mp.problem.edge_costs))
        costs[async_tp] = (mp.problem.cost(choice), edges)
    (blocking, comm), (overlapped, left) = costs[False], costs[True]
    assert comm > 0 and left < comm
    assert blocking - overlapped == comm - left
