"""The recompute tally's marks and twins, worked out once per shared candidate lists, equal each
node's own (``twins`` of its candidate)."""

from __future__ import annotations

import torch

from autoshard.api import build_model_problem
from autoshard.frontend.trace import trace
from autoshard.problem.tallies import twins
from benchmarks.titan_llama import Transformer


def test_shared_twins_equal_each_nodes_own():
    model = Transformer(3, 64, 4, 2, 128, 256, 128).to(torch.bfloat16)
    tokens = torch.zeros(8, 128, dtype=torch.long)
    mp = build_model_problem(trace(model, (tokens, tokens.clone())), "4", mode="training", device="h100",
                             precision="bf16-mixed")
    (tally,) = mp.problem.tallies
    seen = 0
    for group in tally.groups:
        for node, marked, flipped in group:
            owner = node if node < len(mp.names) else mp.aux_owner[node - len(mp.names)]
            cand = mp.candidates[mp.names[owner]]
            assert flipped == twins(cand)
            assert marked == tuple(s for s, again in enumerate(cand.recompute) if again)
            seen += 1
    assert len(tally.groups) == 3 and seen > 3 * 10
