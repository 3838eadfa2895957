"""A frozen parameter is charged its value only: no gradient, no AdamW moments, no optimizer-step buffer."""

from __future__ import annotations

from autoshard.api import build_model_problem
from autoshard.frontend.trace import trace
from tests.frozen import frozen_linears, inputs


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

