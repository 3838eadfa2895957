"""A frozen parameter is charged its value only: no gradient, no AdamW moments, no optimizer-step buffer."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autoshard.api import build_model_problem
from autoshard.frontend.trace import trace
from autoshard.problem.readback import make_plan
from autoshard.runtime.measure import measure_peak
from tests.frozen import frozen_linears, inputs
from tests.runtime.dist import run_ranks


def _charges(mp, name: str) -> dict[str, int]:
    """Bytes of each kind of item of parameter ``name`` in its replicated layout (strategy 0)."""
    kinds: dict[str, int] = {}
    for item in mp.candidates[name].items:
        kinds[item.what] = kinds.get(item.what, 0) + item.usage[0]
    return kinds


def test_frozen_parameters_get_no_gradient_or_optimizer_memory() -> None:
    problems = {frozen: build_model_problem(trace(m, inputs(m), "fx"), "2", mode="training")
                for frozen, m in ((True, frozen_linears()), (False, frozen_linears(frozen=False)))}
    weight = 32 * 16 * 4
    assert problems[True].candidates["fc1_weight"].strategies[0].out_spec.is_replicated
    frozen, trained = _charges(problems[True], "fc1_weight"), _charges(problems[False], "fc1_weight")
    assert frozen == {"parameter": weight, "use copy": 0}
    assert trained == {"parameter": 3 * weight, "optimizer step": weight, "gradient": weight, "use copy": 0}
    for is_frozen in (True, False):  # the trained fc2 is charged in full either way
        fc2 = _charges(problems[is_frozen], "fc2_weight")
        assert (fc2["parameter"], fc2["gradient"], fc2["optimizer step"]) == (3 * weight, weight, weight)
    replicated = {k: mp.problem.peak_usage(mp.complete([0] * len(mp.names))) for k, mp in problems.items()}
    assert replicated[True] < replicated[False]


def test_memtracker_measures_a_step_with_a_frozen_weight_and_the_model_matches_it() -> None:
    """The real step of a plan with fc1 frozen runs under MemTracker (which hooks every parameter's
    gradient unless told not to), holds no AdamW moments for fc1, and the predicted peak stays
    within the memory model's tolerance of the measured one."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    measured = {}
    for frozen in (True, False):
        with mode:
            model = LinearsWithLoss(frozen_linears(frozen=frozen))
            example = (torch.randn(64, 16),)
        graph = trace(model, example, "fx")
        mp = build_model_problem(graph, "2", mode="training")
        choice = mp.complete([0] * len(mp.names))
        plan = make_plan(mp, choice)
        peak = run_ranks(1, lambda rank, world: measure_peak(model, example, plan, graph, mode), connect=False)[0]
        predicted = mp.problem.peak_usage(choice)
        assert abs(predicted / peak.total - 1) <= 0.10, f"frozen={frozen}: predicted {predicted}, measured {peak.total}"
        measured[frozen] = peak
    weight = 32 * 16 * 4  # fc1's weight, fp32
    assert measured[False].by_category["Optstate"] - measured[True].by_category["Optstate"] >= 2 * weight  # two moments
    assert measured[True].total < measured[False].total


class LinearsWithLoss(torch.nn.Module):
    """The two Linears' output squared and averaged: a step that ends in a scalar."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).pow(2).mean()
