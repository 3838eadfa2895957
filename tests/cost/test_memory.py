"""The memory model against PyTorch's MemTracker on the plan's real step, and its parts by hand."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree

from autoshard.api import build_model_problem, default_solve_options, solve_model_problem
from autoshard.problem.baselines.megatron import megatron_choice
from autoshard.cost.lifetimes import lifetimes
from autoshard.cost.memory import param_precision
from autoshard.frontend.load import load_model
from autoshard.frontend.trace import trace
from autoshard.problem.readback import make_plan
from autoshard.runtime.measure import measure_peak
from tests.frontend.helpers import EXAMPLES
from tests.graphs import mlp_graph
from tests.runtime.dist import run_ranks

TOLERANCE = 0.10


class WithLoss(torch.nn.Module):
    """The model's first floating output, squared and averaged: a step that ends in a scalar."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.model(*inputs)
        first = next(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point())
        return first.float().pow(2).mean() if first.numel() > 1 else first


def _measured(model, inputs, plan, graph, mode) -> int:
    """measure_peak in a forked process: its fake process group must not outlive it here (forked
    gloo workers of later tests would inherit a stale group registry)."""
    return run_ranks(1, lambda rank, world: measure_peak(model, inputs, plan, graph, mode).total, connect=False)[0]


def _plans(mp) -> dict[str, list[int]]:
    return {"optimum": solve_model_problem(mp, default_solve_options(mp, 30)).solution.choice,
            "megatron": megatron_choice(mp),
            "replicated": mp.complete([0] * len(mp.names))}


@pytest.mark.parametrize("name", ["mlp", "attention", "cnn_loss", "gpt2", "llama"])
def test_predicted_peak_is_within_ten_percent_of_memtracker(name):
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        loaded = load_model(str(EXAMPLES / f"{name}.py"))
        model, inputs = WithLoss(loaded.model), loaded.example_inputs
    graph = trace(model, inputs)
    mp = build_model_problem(graph, "2x2", mode="training")
    for label, choice in _plans(mp).items():
        predicted = mp.problem.peak_usage(list(choice))
        measured = _measured(model, inputs, make_plan(mp, list(choice)), graph, mode)
        assert abs(predicted / measured - 1) <= TOLERANCE, f"{name} {label}: predicted {predicted}, measured {measured}"


def test_a_plan_that_keeps_too_much_is_caught():
    """The check can fail: a model that forgets autograd's saved tensors is off by far more than 10%."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        loaded = load_model(str(EXAMPLES / "mlp.py"))
        model, inputs = WithLoss(loaded.model), loaded.example_inputs
    graph = trace(model, inputs)
    mp = build_model_problem(graph, "2x2", mode="training")
    choice = mp.complete([0] * len(mp.names))
    measured = _measured(model, inputs, make_plan(mp, choice), graph, mode)
    index = {n: i for i, n in enumerate(mp.names)}
    without_saved = max(sum(item.usage[choice[index[item.owner]]] for item in mp.items
                            if item.interval[0] <= t < item.interval[1] and item.what != "activation")
                        for t in range(mp.life.end))
    assert abs(without_saved / measured - 1) > TOLERANCE


def test_saved_tensors_live_until_the_savers_backward():
    graph = mlp_graph(2, 4, 8, 16)
    life = lifetimes(graph, training=True)
    horizon = life.horizon
    order = life.order
    # linear saves its input x and gelu saves linear's output: both live into the backward
    assert life.value["linear"] == (order["linear"], 2 * horizon - order["gelu"])
    # gelu's output is read by linear_1, which saves it: it lives until linear_1's backward
    assert life.value["gelu"][1] == 2 * horizon - order["linear_1"]
    # linear_1's output is read only by the output node: it dies in the forward
    assert life.value["linear_1"] == (order["linear_1"], order["output"] + 1)
    inference = lifetimes(graph, training=False)
    assert inference.value["linear"] == (order["linear"], order["gelu"] + 1)
    # a gradient lives from its last reader's backward to its producer's backward
    assert life.gradient["gelu"] == (2 * horizon - 1 - order["linear_1"], 2 * horizon - order["gelu"])


def test_precision_bytes():
    assert param_precision("as-is", 2) == param_precision("as-is", 2).__class__(2, None, 2, 2)
    mixed = param_precision("bf16-mixed", 4)
    assert (mixed.value, mixed.compute, mixed.gradient, mixed.optimizer) == (4, 2, 4, 4)
    assert param_precision("fp32", 2).value == 4


def test_bf16_mixed_keeps_fp32_masters_and_moments_and_bf16_copies():
    from autoshard.problem.build import BuildOptions, build_problem
    from autoshard.cost.communication import make_cost_model
    from autoshard.sharding.mesh import parse_mesh

    mesh = parse_mesh("2")
    graph = mlp_graph(2, 4, 8, 16)
    built = {p: build_problem(graph, mesh, make_cost_model("alpha-beta", mesh), BuildOptions(mode="training", precision=p))
             for p in ("as-is", "bf16-mixed")}
    weight = {p: mp.candidates["fc1_weight"] for p, mp in built.items()}
    stored = {p: next(i for i in c.items if i.what == "parameter").usage[0] for p, c in weight.items()}
    assert stored["bf16-mixed"] == stored["as-is"]  # fp32 model: masters and moments are fp32 either way
    copies = {p: sum(i.usage[0] for i in c.items if i.what.startswith("use copy")) for p, c in weight.items()}
    assert copies["as-is"] == 0 and copies["bf16-mixed"] == 16 * 8 * 2  # the bf16 compute copy
