"""The torchtitan baseline (FSDP + TP + sequence parallel + full activation checkpointing) is what
torchtitan runs, and a proved optimum never costs more; the plan summary names what is recomputed
and re-gathered."""

from __future__ import annotations

import pytest

from autoshard.api import default_solve_options, solve_model_problem
from autoshard.problem.baselines.torchtitan import torchtitan_choice
from autoshard.problem.readback import make_plan
from autoshard.sharding.layers import find_repeated_layers
from autoshard.cli.report import fit_line

from .test_recompute import _problem


def _use_spec(plan, param: str):
    """The layout the parameter's reader reads it in (its use layout)."""
    return next(e.dst_spec for e in plan.edges if e.src == param)


def test_torchtitan_on_2x2_is_fsdp_on_the_first_axis_tp_on_the_last_and_recomputes_every_layer() -> None:
    mp = _problem("llama", "2x2")
    plan = make_plan(mp, torchtitan_choice(mp))
    assert len(plan.recompute) == len(mp.blocks.last) == 2
    q = "p_model_layers_0_self_attn_q_proj_weight"
    o = "p_model_layers_0_self_attn_o_proj_weight"
    assert _use_spec(plan, q).dims == ((1,), ())  # column-parallel: output features on the TP axis
    assert _use_spec(plan, o).dims == ((), (1,))  # row-parallel: input features on the TP axis
    for name in (q, o):  # FSDP: stored split over the data axis as well
        assert 0 in plan.nodes[name].out_spec.used_axes and 1 in plan.nodes[name].out_spec.used_axes
    summary = fit_line(plan)
    assert "recomputed in backward: 2 layers (model.layers.0, model.layers.1)" in summary


@pytest.mark.parametrize("model,mesh", [("gpt2", "2"), ("llama", "2x2")])
def test_proved_optimum_never_costs_more_than_torchtitan(model: str, mesh: str) -> None:
    mp = _problem(model, mesh)
    baseline = torchtitan_choice(mp)
    assert mp.problem.is_feasible(baseline)
    solution = solve_model_problem(mp, default_solve_options(mp, 60)).solution
    assert solution.status == "optimal"
    assert solution.cost <= mp.problem.cost(baseline)


def test_one_axis_torchtitan_is_data_parallel_with_every_parameter_sharded() -> None:
    mp = _problem("gpt2", "2")
    plan = make_plan(mp, torchtitan_choice(mp))
    params = [n for n in plan.nodes.values() if n.op is None and n.name.startswith("p_")]
    sharded = [n for n in params if 0 in n.out_spec.used_axes]
    assert params and len(sharded) >= 0.9 * len(params)  # all but tensors no dim of which divides
    regathered = {e.src for e in plan.edges if e.regather}
    recomputed_readers = {n for names in plan.recompute for n in names}
    in_layers = find_repeated_layers(mp.graph).nodes
    kept = [n.name for n in sharded if n.name not in regathered
            and not any(e.src == n.name and e.dst in recomputed_readers for e in plan.edges)
            and any(s.regather for s in mp.candidates[n.name].storage)]  # else its gathered copy dies in forward
    assert kept and all(mp.life.first_reader[name] not in in_layers for name in kept), \
        f"kept gathered from forward to backward inside the layers: {kept}"  # only the final norm's and head's
