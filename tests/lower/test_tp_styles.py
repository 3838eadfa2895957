"""Why part of a plan has no torchtitan-style form, said in terms of the two roles one mesh axis mixes."""

from __future__ import annotations

import torch
from torch import nn

from autoshard.api import build_model_problem
from autoshard.frontend.trace import trace
from autoshard.lower.dtensor import native_layout
from autoshard.problem.readback import make_plan
from tests.runtime.plans import data_parallel_choice


class EmbedThenLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.fc = nn.Embedding(64, 32), nn.Linear(32, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(ids))


def _strategy(mp, name: str, stored: str, use: str | None = None) -> int:
    cand = mp.candidates[name]
    return next(i for i, s in enumerate(cand.strategies) if s.out_spec.format(1) == stored
                and (use is None or cand.storage[i].use.format(1) == use))


def test_fsdp_storage_for_whole_batch_compute_on_the_axis_that_splits_a_weight_is_named_as_such() -> None:
    model = EmbedThenLinear()
    graph = trace(model, (torch.randint(0, 64, (4, 8)),))
    mp = build_model_problem(graph, "2", mode="training")
    choice = data_parallel_choice(mp)
    index = {n: i for i, n in enumerate(mp.names)}
    choice[index["emb_weight"]] = _strategy(mp, "emb_weight", "RS", "RS")  # column-parallel embedding
    choice[index["embedding"]] = _strategy(mp, "embedding", "RRS")
    choice[index["linear"]] = _strategy(mp, "linear", "RRR")  # the whole batch on every rank
    choice[index["fc_weight"]] = _strategy(mp, "fc_weight", "SR", "RR")  # stored split, gathered for use
    choice[index["fc_bias"]] = _strategy(mp, "fc_bias", "R", "R")
    choice[index["ids"]] = _strategy(mp, "ids", "RR")
    layout = native_layout(make_plan(mp, mp.complete(choice)), graph, model)
    assert layout.roles == ["replica"] and layout.notes == [
        "mesh axis 0 (2 devices): fc.weight is stored SR and gathered whole for linear (linear), which runs as RRR, "
        "not on the rank's batch slice (where fully_shard would reduce its gradient as data parallelism's); PyTorch "
        "has no API for that, so its ranks compute as replicas here (run the JSON plan with autoshard.run for the "
        "rest)"]
