"""The differential test, sampled: optimal (compute-bound) and random plans against the unsharded model.

Each case runs a model's plans on 4 forked gloo ranks, forward and backward, and asks that no
plan differ from the eager model (outputs and every parameter gradient within the checker's
tolerance) or from its own collective list. The sample covers one model per bug class the
long run (``make fuzz``, ``python -m tests.differential.fuzz``) found: in-place ops under fx,
in-place ops under export (a ResNet's ``relu(inplace=True)`` and ``out += identity``, T5's and
BART's label shifting, which writes into a slice), token-sharded losses with -100 labels (a
causal LM, a classifier whose shard holds only an ignored label), plus an example with its loss
in the graph. A plan with one wrong reshard must be caught.
"""

from __future__ import annotations

import dataclasses

import pytest

from autoshard.sharding.reshard import ALL_REDUCE
from tests.differential.harness import findings, plans_for, run_plans, traced_model

# (model, mesh, random plans): each also runs its optimal plan under the compute-bound cost model
SAMPLE = [
    ("inplace_mlp", "2x2", 2), ("inplace_mlp", "4", 2), ("cnn_loss", "4", 2), ("resnet", "4", 1),
    ("qwen2", "2x2", 1), ("t5", "4", 1), ("bart", "2x2", 1), ("hf_vit", "2x2", 2),
]


@pytest.mark.parametrize("model,mesh,n_random", SAMPLE, ids=[f"{m}-{s}" for m, s, _ in SAMPLE])
def test_plans_match_the_unsharded_model(model: str, mesh: str, n_random: int) -> None:
    t = traced_model(model)
    plans = plans_for(t, mesh, "training", n_random, seed=0)
    assert len(plans) == n_random + 1
    lines = findings(plans, run_plans(t, plans))
    assert not lines, f"{model} on {mesh}:\n" + "\n".join(lines)


def test_a_plan_with_one_wrong_reshard_is_caught() -> None:
    """Drop one forward all-reduce from a correct plan: its consumer reads a partial sum as if whole."""
    t = traced_model("cnn_loss")
    plans = plans_for(t, "4", "training", 4, seed=1, optimal=False)
    label, plan = next((label, plan) for label, plan in plans.items()
                       if any(step.kind == ALL_REDUCE for edge in plan.edges for step in edge.steps))
    k, edge = next((k, edge) for k, edge in enumerate(plan.edges) if any(s.kind == ALL_REDUCE for s in edge.steps))
    steps = tuple(step for step in edge.steps if step.kind != ALL_REDUCE)
    broken = dataclasses.replace(plan, edges=[*plan.edges[:k], dataclasses.replace(edge, steps=steps),
                                              *plan.edges[k + 1:]])
    cases = {label: plan, "broken": broken}
    lines = findings(cases, run_plans(t, cases))
    assert len(lines) == 1 and lines[0].startswith("broken: ") and "tensors off" in lines[0], lines
