"""--async-tp pricing (cost/async_tp.py): TP collectives hidden under the matmuls beside them."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

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
