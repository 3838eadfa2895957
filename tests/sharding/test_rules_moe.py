"""The mixture-of-experts rules, checked numerically forward and backward on simulated meshes.

The ops experts modules trace to (grouped matmuls, counts, gathers and scatters over the token
dim) go through ``check_op`` like every other rule. The fused ``moe_experts`` node's strategies
run on each simulated device as the executor runs them: its own experts (``first_expert`` from
its piece of ``gate_up``) on its own tokens; for a strategy with an ``exchange_axis`` the
devices along that axis pool their experts for each other's tokens, which is what dispatch and
combine compute. Every device's output (summed over partial axes) must be its piece of the
global output, and its operand gradients (summed over their partial axes) its piece of theirs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autoshard.frontend.experts import grouped_mm, moe_experts
from autoshard.frontend.graph import TensorMeta
from autoshard.sharding.rules import RuleError, instantiate, load_rules, strategies
from tests.layout_sim import all_coords
from tests.sharding.test_rules_numeric import MESHES, R, _meta, _partial_group, _piece, check_op


def _ends(*counts: int) -> torch.Tensor:
    return torch.tensor(counts).cumsum(0)


@pytest.mark.parametrize("mesh_shape", MESHES)
@pytest.mark.parametrize("case", [
    ("grouped_mm", lambda x, w, e, local: grouped_mm(x, w, e), [R(12, 8), R(3, 8, 4), _ends(5, 0, 7)], {}),
    ("_grouped_mm", lambda x, w, e, local: torch._grouped_mm(x, w, offs=e.int()),
     [R(8, 16).float(), R(2, 16, 16).float(), _ends(3, 5)], {}),
    ("_grouped_mm", lambda a, b, local: torch._grouped_mm(a, b), [R(4, 8, 16).float(), R(4, 16, 16).float()], {}),
    ("index", lambda x, i, local: x[i], [R(8, 4), torch.randint(0, 8, (12,))], {"indices": [1]}),
    ("index", lambda x, i, local: x[:, i], [R(4, 8, 2), torch.randint(0, 8, (4,))], {"indices": [None, 1]}),
    ("index", lambda x, i, j, local: x[i, j], [R(4, 8), torch.randint(0, 4, (4, 1)), torch.randint(0, 8, (1, 8))],
     {"indices": [1, 2]}),
    ("index_put", lambda x, i, v, local: torch.index_put(x, (i,), v, accumulate=True),
     [R(8, 4), torch.randint(0, 8, (12,)), R(12, 4)], {"indices": [1], "accumulate": True}),
    ("index_put", lambda x, i, v, local: torch.index_put(x, (i,), v),
     [R(8, 4), torch.randperm(8)[:4], R(4, 4)], {"indices": [1], "accumulate": False}),
    ("index_add", lambda x, i, v, local: x.index_add(0, i, v), [R(8, 4), torch.randint(0, 8, (12,)), R(12, 4)],
     {"dim": 0}),
    ("index_add", lambda x, i, v, local: x.index_add(1, i, v), [R(4, 8), torch.randint(0, 8, (4,)), R(4, 4)],
     {"dim": 1}),
    ("scatter_add", lambda x, i, v, local: x.scatter_add(0, i, v),
     [R(8, 4), torch.randint(0, 8, (12, 4)), R(12, 4)], {"dim": 0}),
    ("diff", lambda x, local: torch.diff(x, dim=1), [R(4, 8)], {"dim": 1}),
], ids=lambda c: c[0] if isinstance(c, tuple) else None)
def test_moe_ops(case, mesh_shape):
    op, fn, operands, attrs = case
    check_op(op, fn, operands, attrs, mesh_shape, min_strategies=1)


def _check_forward(op: str, fn, operands: list[torch.Tensor], attrs: dict, mesh_shape) -> list:
    """``check_op`` for ops without a gradient (counts, one-hot): every strategy's local outputs,
    summed over the partial axes, are the pieces of the global output."""
    full = fn(*operands)
    found = strategies(instantiate(load_rules()[op], [_meta(x) for x in operands], tuple(full.shape), attrs),
                       mesh_shape)
    for st in found:
        local = {c: fn(*[_piece(x, spec, c, mesh_shape) for x, spec in zip(operands, st.in_specs)])
                 for c in all_coords(mesh_shape)}
        for c in local:
            summed = sum(local[d] for d in _partial_group(c, st.out_spec.partial, mesh_shape))
            torch.testing.assert_close(summed, _piece(full, st.out_spec, c, mesh_shape), msg=f"{op} {st.assignment}")
    return found


@pytest.mark.parametrize("mesh_shape", MESHES)
def test_one_hot_keeps_the_classes_whole(mesh_shape):
    found = _check_forward("one_hot", lambda i: F.one_hot(i, 8), [torch.randint(0, 8, (4, 4))], {"num_classes": 8},
                           mesh_shape)
    assert len(found) > 1 and all(not s.out_spec.dims[-1] for s in found)


def test_grouped_rows_stay_whole_and_contraction_gives_partial_sums():
    rule = load_rules()["_grouped_mm"]
    metas = [TensorMeta((8, 16), "float32", 4), TensorMeta((2, 16, 32), "float32", 4), TensorMeta((2,), "int32", 4)]
    found = strategies(instantiate(rule, metas, (8, 32), {}), (2,))
    assert {s.assignment for s in found} == {(), (("k", (0,)),), (("n", (0,)),)}
    assert [s.out_spec.partial for s in found if s.assignment == (("k", (0,)),)] == [frozenset({0})]


@pytest.mark.parametrize("mesh_shape", MESHES)
@pytest.mark.parametrize("op, fn, attrs, shards", [
    ("histc", lambda x: torch.histc(x, bins=4, min=0, max=3), {"bins": 4, "min": 0, "max": 3}, True),
    ("histc", lambda x: torch.histc(x, bins=4), {"bins": 4, "min": 0, "max": 0}, False),
    ("bincount", lambda x: torch.bincount(x.long(), minlength=4), {"minlength": 4}, True),
])
def test_counts_of_split_inputs_are_partial_sums(op, fn, attrs, shards, mesh_shape):
    found = _check_forward(op, fn, [torch.randint(0, 4, (16,)).double()], attrs, mesh_shape)
    assert any(s.out_spec.partial for s in found) == shards


def test_writes_without_accumulation_keep_the_rows_whole():
    rule = load_rules()["index_put_"]
    metas = [TensorMeta((8, 4), "float32", 4), TensorMeta((4,), "int64", 8), TensorMeta((4, 4), "float32", 4)]
    kept = instantiate(rule, metas, (8, 4), {"indices": [1], "accumulate": False})
    added = instantiate(rule, metas, (8, 4), {"indices": [1], "accumulate": True})
    assert kept.operands[1] == (None,) and added.operands[1] == ("m",) and added.additive == (0,)
    with pytest.raises(RuleError):
        instantiate(load_rules()["index"], [metas[0], TensorMeta((8,), "bool", 1)], (5, 4), {"indices": [1]})


# The fused experts node: tokens [t, h], top-k ids and weights [t, k], gate_up [e, 2i, h], down [e, h, i].
TOKENS, HIDDEN, TOP_K, EXPERTS, INNER = 8, 4, 2, 4, 3


def _experts_operands() -> list[torch.Tensor]:
    torch.manual_seed(0)
    index = torch.stack([torch.randperm(EXPERTS)[:TOP_K] for _ in range(TOKENS)])
    return [R(TOKENS, HIDDEN), index, torch.rand(TOKENS, TOP_K, dtype=torch.float64),
            R(EXPERTS, 2 * INNER, HIDDEN), R(EXPERTS, HIDDEN, INNER)]


def _exchange_group(c: tuple[int, ...], axis: int | None, mesh_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The devices ``c`` exchanges tokens with (itself alone without an exchange axis)."""
    return [c] if axis is None else [c[:axis] + (i,) + c[axis + 1:] for i in range(mesh_shape[axis])]


@pytest.mark.parametrize("mesh_shape", [(2,), (4,), (2, 2)])
def test_experts_strategies_forward_and_backward(mesh_shape):
    operands = _experts_operands()
    leaves = [x.clone().requires_grad_(x.is_floating_point()) for x in operands]
    full = moe_experts(*leaves)
    grad_out = torch.randn_like(full)
    full.backward(grad_out)
    rule = load_rules()["moe_experts"]
    found = strategies(instantiate(rule, [_meta(x) for x in operands], tuple(full.shape), {}), mesh_shape)
    assert any(s.exchange_axis is not None for s in found)
    for st in found:
        pieces = {c: [_piece(x, spec, c, mesh_shape).clone().requires_grad_(x.is_floating_point())
                      for x, spec in zip(operands, st.in_specs)] for c in all_coords(mesh_shape)}
        held = EXPERTS // st.in_specs[3].shard_factor(0, mesh_shape)
        first = {c: st.in_specs[3].chunk_index(0, c, mesh_shape) * held for c in pieces}
        outs = {}
        for c, (x, idx, w, _, _) in pieces.items():  # c's tokens meet every expert of its exchange group
            outs[c] = sum(moe_experts(x, idx, w, pieces[d][3], pieces[d][4], "silu", first[d])
                          for d in _exchange_group(c, st.exchange_axis, mesh_shape))
            outs[c].backward(_piece(grad_out, st.out_spec.without_partial(), c, mesh_shape))
        for c in pieces:
            summed = sum(outs[d] for d in _partial_group(c, st.out_spec.partial, mesh_shape))
            torch.testing.assert_close(summed.detach(), _piece(full.detach(), st.out_spec, c, mesh_shape),
                                       msg=f"{st.assignment} forward at {c}")
            for k in (0, 2, 3, 4):
                spec = st.grad_specs[k]
                got = sum(pieces[d][k].grad for d in _partial_group(c, spec.partial, mesh_shape))
                torch.testing.assert_close(got, _piece(leaves[k].grad, spec, c, mesh_shape),
                                           msg=f"{st.assignment} grad {k} at {c}")


def test_expert_parallel_strategies_keep_the_output_and_expert_gradients_whole():
    operands = _experts_operands()
    rule = load_rules()["moe_experts"]
    found = strategies(instantiate(rule, [_meta(x) for x in operands], (TOKENS, HIDDEN), {}), (4,))
    ep = [s for s in found if s.exchange_axis is not None]
    assert [dict(s.assignment) for s in ep] == [{"t": (0,), "e": (0,)}]
    assert not ep[0].out_spec.partial and not ep[0].grad_specs[3].partial
    gather_style = next(s for s in found if dict(s.assignment) == {"e": (0,)})
    assert gather_style.out_spec.partial == {0} and ep[0].degree == gather_style.degree == 4
