"""The run check's parts: the tolerance of ``relative_errors``, the plan's frontend and signature, the
valid-target count of token-sharded losses (charged, listed, executed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.api import build_model_problem
from autoshard.errors import AutoshardError
from autoshard.frontend.trace import trace
from autoshard.problem.plan import Plan
from autoshard.problem.readback import make_plan
from autoshard.runtime.checks import (NOISE_FLOOR, check_layouts, check_model, count_label, expected_collectives,
                                      relative_errors)
from autoshard.runtime.executor import parallelize
from autoshard.sharding.reshard import ALL_REDUCE
from autoshard.sharding.strategy import count_steps

from .plans import plans, traced

RTOL = 1e-5


def test_float32_noise_on_a_zero_gradient_passes_and_real_errors_fail() -> None:
    big = torch.randn(64, 64, dtype=torch.float64) * 10
    zero = torch.randn(64, dtype=torch.float64) * 2e-9  # an attention key bias's gradient: zero up to rounding
    noise = torch.randn(64, dtype=torch.float64) * 3e-9
    errors = relative_errors({"big": big * (1 + 1e-7), "zero": zero + noise}, {"big": big, "zero": zero})
    assert max(rel for _, rel in errors.values()) <= RTOL
    wrong = relative_errors({"big": big, "zero": zero + 1e-3}, {"big": big, "zero": zero})
    assert wrong["zero"][1] > RTOL and wrong["big"] == (0.0, 0.0)
    off_by_a_bit = relative_errors({"big": big * (1 + 1e-4)}, {"big": big})
    assert off_by_a_bit["big"][1] > RTOL


def test_small_tensors_are_judged_against_their_own_scale_above_the_floor() -> None:
    big, small = torch.full((4,), 100.0), torch.full((4,), 0.5)  # small is 5e-3 of big: above the 1e-3 floor
    assert relative_errors({"small": small * 1.001, "big": big}, {"small": small, "big": big})["small"][1] > RTOL


def test_missing_misshapen_and_nan_entries() -> None:
    want = {"a": torch.tensor([1.0, float("nan")]), "b": torch.ones(2), "c": torch.ones(2)}
    got = {"a": torch.tensor([1.0, float("nan")]), "b": torch.tensor([1.0, float("nan")])}
    errors = relative_errors(got, want)
    assert errors["a"] == (0.0, 0.0)  # a mean over no valid targets is NaN in both
    assert errors["b"][1] == float("inf") and errors["c"] == (float("inf"), float("inf"))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=8), st.lists(st.floats(-1e-2, 1e-2), min_size=8, max_size=8),
       st.floats(1e-3, 1e3))
def test_the_relative_error_is_assert_close_with_a_scaled_atol(values: list[float], noise: list[float],
                                                               other: float) -> None:
    want = torch.tensor(values, dtype=torch.float64)
    got = want + torch.tensor(noise[: len(values)], dtype=torch.float64) * want.abs().max().clamp(min=1e-3) * 1e-3
    errors = relative_errors({"t": got, "other": torch.full((2,), other)}, {"t": want, "other": torch.full((2,), other)})
    scale = max(float(want.abs().max()), NOISE_FLOOR * max(float(want.abs().max()), other))
    try:
        torch.testing.assert_close(got, want, rtol=RTOL, atol=RTOL * scale)
        close = True
    except AssertionError:
        close = False
    assert close == (errors["t"][1] <= RTOL * (1 + 1e-9)) or abs(errors["t"][1] - RTOL) < 1e-12


def test_plans_record_their_frontend_and_parallelize_traces_with_it(tmp_path: Path) -> None:
    t = traced("tiny_mlp")
    graph = trace(t.model, t.inputs, "export")  # fx would trace this model too, with other node names
    mp = build_model_problem(graph, "2", mode="training")
    plan = make_plan(mp, [0] * mp.problem.num_nodes, model="mlp")
    assert plan.frontend == "export" and plan.signature[0] == "p_fc1_weight:None:(32, 16)"
    plan.save(tmp_path / "plan.json")
    loaded = Plan.load(tmp_path / "plan.json")
    assert (loaded.frontend, loaded.signature) == (plan.frontend, plan.signature)
    with pytest.raises(AutoshardError, match=r"plan is for mesh 2 \(2 devices\) but the world has 1 ranks"):
        parallelize(t.model, loaded, example_inputs=t.inputs)  # traced with export: the fingerprint matched
    fx_graph = trace(t.model, t.inputs, "fx")
    with pytest.raises(AutoshardError, match=r"^plan was made for another model \(mlp\): it was traced with export, "
                                             r"this model with fx; node 0 differs: the plan has p_fc1_weight \(shape "
                                             r"\(32, 16\)\), this model x \(shape \(8, 8, 16\)\); "
                                             r"re-plan this model with autoshard.solve$"):
        check_model(loaded, fx_graph)


def test_a_plan_of_another_shape_names_the_first_differing_node() -> None:
    t = traced("tiny_mlp")
    plan = plans(t, "2", "inference", 0)["megatron"]
    other = trace(t.model, (torch.randn(8, 4, 16),))
    with pytest.raises(AutoshardError, match=r"node 0 differs: the plan has x \(shape \(8, 8, 16\)\), "
                                             r"this model x \(shape \(8, 4, 16\)\)"):
        check_model(plan, other)


def test_plan_files_without_the_new_fields_still_load(tmp_path: Path) -> None:
    plan = plans(traced("tiny_mlp"), "2", "training", 0)["megatron"]
    data = plan.to_json()
    for key in ("frontend", "signature"):
        del data[key]
    for node in data["nodes"]:
        del node["count_steps"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = Plan.load(tmp_path / "old.json")
    assert old.frontend == "" and old.signature == [] and all(not n.count_steps for n in old.nodes.values())
    check_model(old, traced("tiny_mlp").graph)  # the fingerprint alone still identifies the model


def test_a_token_sharded_mean_loss_lists_and_charges_its_count_all_reduce(monkeypatch: pytest.MonkeyPatch) -> None:
    t = traced("cnn_loss")
    mp = build_model_problem(t.graph, "4", mode="training")
    loss = next(name for name in mp.names if mp.candidates[name].node.op == "cross_entropy_loss")
    candidate = mp.candidates[loss]
    counted = [k for k, s in enumerate(candidate.strategies) if s.count_axes]
    assert counted and len(counted) < len(candidate.strategies)
    assert all(candidate.strategies[k].count_axes == (0,) for k in counted)
    steps = count_steps(candidate.strategies[counted[0]], 4, (4,))
    assert [(s.kind, s.axis, s.sent_bytes(4)) for s in steps] == [(ALL_REDUCE, 0, 6)]
    # charged: each counted strategy costs one all-reduce of a float32 scalar more than its computation alone
    monkeypatch.setattr("autoshard.problem.candidates.count_steps", lambda *args: ())
    monkeypatch.setattr("autoshard.problem.candidates._OPS", {})  # the process's shared op candidates
    uncharged = build_model_problem(t.graph, "4", mode="training").candidates[loss].costs
    mesh = mp.mesh
    extra = mp.cost_model.ticks(mesh.latency[0] + 6 / mesh.bandwidth[0])
    assert [c - u for c, u in zip(candidate.costs, uncharged)] == \
        [extra if s.count_axes else 0 for s in candidate.strategies]
    choice = [0] * mp.problem.num_nodes
    choice[mp.names.index(loss)] = counted[0]
    plan = make_plan(mp, choice, model="cnn_loss")
    listed = [c for c in expected_collectives(plan) if c.edge == count_label(loss)]
    assert [(c.kind, c.axis, c.sent_bytes, c.phase) for c in listed] == [(ALL_REDUCE, 0, 6, "forward")]
    assert plan.nodes[loss].count_steps == steps


def test_plans_as_written_pass_the_layout_check() -> None:
    """Megatron, data-parallel and random training plans on a 2-D mesh, also after a round trip through JSON."""
    for name in ("sp_block", "attention"):
        t = traced(name)
        for plan in plans(t, "2x2", "training", 2, data_parallel=True).values():
            check_layouts(plan, t.graph)
            check_layouts(Plan.from_json(json.loads(json.dumps(plan.to_json()))), t.graph)


def _edited(plan: Plan, edit: Callable[[dict], object]) -> Plan:
    """``plan`` after ``edit`` changed its JSON form in place (as a hand edit of the file would)."""
    data = json.loads(json.dumps(plan.to_json()))
    edit(data)
    return Plan.from_json(data)


def _first(edges: list[dict], key: str) -> dict:
    return next(e for e in edges if e[key])


def test_hand_edited_plans_are_refused_in_one_line() -> None:
    t = traced("sp_block")
    plan = plans(t, "2x2", "training", 0)["megatron"]
    edits: dict[str, Callable[[dict], object]] = {
        r"the edge \S+'s steps \(none\) do not lead from \S+ to \S+, which needs \S+":
            lambda d: _first(d["edges"], "steps").update(steps=[]),
        r"the edge \S+'s gradient's steps \(none\) do not lead from":
            lambda d: _first(d["edges"], "grad_steps").update(grad_steps=[]),
        r"param_specs\[fc1.weight\] is S0R but the parameter's node is laid out S1R":
            lambda d: d["param_specs"]["fc1.weight"].update(dims=[[0], []]),
        r"the edge \S+ is recorded as linear_1 RRR -> S0RR, the nodes' layouts are S0RRP1 -> S0RR":
            lambda d: _first(d["edges"], "steps")["src_spec"].update(dims=[[], [], []], partial=[]),
        r"the edge \S+ is missing": lambda d: d["edges"].remove(_first(d["edges"], "steps")),
        r"it has two edges into operand 0 of": lambda d: d["edges"].append(d["edges"][0]),
        r"node \S+ of the model has no placement": lambda d: d["nodes"].pop(3),
        r"it recomputes nowhere, which is not a node of the model": lambda d: d.update(recompute=[["nowhere"]]),
    }
    for message, edit in edits.items():
        with pytest.raises(AutoshardError, match=f"^plan of sp_block is inconsistent: {message}.*; the file was edited "
                                                 "or damaged: write it again with autoshard.solve --out$"):
            check_layouts(_edited(plan, edit), t.graph)


def test_a_layout_that_does_not_divide_its_tensor_is_refused() -> None:
    model = torch.nn.Linear(16, 6)
    graph = trace(model, (torch.randn(8, 16),))
    mp = build_model_problem(graph, "4", mode="inference")
    plan = make_plan(mp, [0] * mp.problem.num_nodes, model="linear")
    weight = next(n["name"] for n in plan.to_json()["nodes"] if n["name"].endswith("weight"))
    edited = _edited(plan, lambda d: next(n for n in d["nodes"] if n["name"] == weight)["out_spec"].update(
        dims=[[0], []]))
    with pytest.raises(AutoshardError,
                       match=rf"{weight}'s output is laid out SR, which does not cut its shape \[6, 16\] on mesh 4"):
        check_layouts(edited, graph)


def test_malformed_plan_files_name_what_is_wrong(tmp_path: Path) -> None:
    plan = plans(traced("tiny_mlp"), "2x2", "training", 0)["megatron"]
    cases: dict[str, Callable[[dict], object]] = {
        r"nodes\[1\]\.in_specs is missing": lambda d: d["nodes"][1].pop("in_specs"),
        "edge \\S+ names mesh axis 2, but mesh 2x2 has only axes 0-1":
            lambda d: _first(d["edges"], "steps")["steps"][0].update(axis=2),
        r"edges\[\d+\]\.steps\[0\]\.kind must be one of \[[^]]+\]":
            lambda d: _first(d["edges"], "steps")["steps"][0].update(kind="all_scatter"),
        r"mode must be one of \['inference', 'training'\]": lambda d: d.update(mode="train"),
        r"nodes\[1\]\.scale\[1\] must be bigger than or equal to 1": lambda d: d["nodes"][1].update(scale=[1, 0]),
    }
    path = tmp_path / "plan.json"
    for message, edit in cases.items():
        data = json.loads(json.dumps(plan.to_json()))
        edit(data)
        path.write_text(json.dumps(data))
        with pytest.raises(AutoshardError, match=rf"^plan file '{path}' is malformed \({message}\): write it again"):
            Plan.load(path)
    path.write_text("[]")
    with pytest.raises(AutoshardError, match=r"malformed \(it holds a JSON list, not an object\)"):
        Plan.load(path)
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(AutoshardError, match="cannot be read"):
        Plan.load(path)
    with pytest.raises(AutoshardError, match="is a folder: give the file autoshard.solve --out wrote"):
        Plan.load(tmp_path)


def test_parallelize_refuses_an_edited_plan_unless_told_not_to_check() -> None:
    """The API checks what run and train check: an edge whose steps were removed is one line, not a
    failure inside a collective; ``validate=False`` (for tests of the executor) lets it through."""
    t = traced("sp_block")
    plan = plans(t, "4", "training", 0)["megatron"]
    edited = _edited(plan, lambda d: _first(d["edges"], "steps").update(steps=[]))
    with pytest.raises(AutoshardError, match="is inconsistent: the edge"):
        parallelize(t.model, edited, graph=t.graph)
    with pytest.raises(AutoshardError, match=r"plan is for mesh 4 \(4 devices\) but the world has 1 ranks"):  # the next check
        parallelize(t.model, edited, graph=t.graph, validate=False)
