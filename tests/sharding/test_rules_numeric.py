"""Every strategy of every rule, checked numerically on a simulated mesh.

For each strategy, each simulated device runs the op on its local operand pieces (with the
strategy's local size overrides, scale and bias masking); summing over the output's partial
axes must give that device's piece of the true output. Then each device back-propagates its
piece of a random output gradient; summing its local operand gradients over the gradient
layout's partial axes must give its piece of the true operand gradient. This checks the rule
table, the strategy derivation and the gradient layouts the training cost model relies on.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

from typing import Callable

import pytest
import torch
import torch.nn.functional as F

from autoshard.frontend.graph import TensorMeta
from autoshard.runtime.context import causal_rows_attention
from autoshard.sharding.rules import RuleError, instantiate, load_rules, strategies
from autoshard.sharding.spec import TensorSpec
from tests.layout_sim import all_coords


def _piece(t: torch.Tensor, spec: TensorSpec, coords, mesh_shape) -> torch.Tensor:
    for d in range(spec.ndim):
        k = spec.shard_factor(d, mesh_shape)
        t = t.chunk(k, dim=d)[spec.chunk_index(d, coords, mesh_shape)]
    return t


def _partial_group(c, axes, mesh_shape):
    groups = [c]
    for a in sorted(axes):
        groups = [g[:a] + (i,) + g[a + 1:] for g in groups for i in range(mesh_shape[a])]
    return groups


def _meta(t: torch.Tensor | None) -> TensorMeta | None:
    if t is None:
        return None
    return TensorMeta(tuple(t.shape), str(t.dtype).replace("torch.", ""), t.element_size())


def check_op(op: str, fn: Callable, operands: list, attrs: dict, mesh_shape, size_attr_fn=None, min_strategies=2,
             summed_fn: Callable | None = None, count_fn: Callable | None = None):
    """Run every strategy of ``op``'s rule and compare forward and backward with the global op.

    A strategy with ``count_axes`` (a mean loss whose targets are sharded) runs ``summed_fn`` (the
    op with reduction="sum") divided by ``count_fn`` of the local operands summed over the devices
    of those axes, as the executor does with its all-reduced count of valid targets.
    """
    torch.manual_seed(0)
    rule = load_rules()[op]
    leaves = [x.clone().requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x for x in operands]
    full = fn(*leaves, local=None)
    outs = full if isinstance(full, (tuple, list)) else (full,)
    grads_out = [torch.randn_like(o) for o in outs]
    torch.autograd.backward(list(outs), grads_out)
    full_grads = [x.grad if isinstance(x, torch.Tensor) and x.requires_grad else None for x in leaves]
    inst = instantiate(rule, [_meta(x) if isinstance(x, torch.Tensor) else None for x in operands],
                      tuple(outs[0].shape), attrs)
    found = strategies(inst, mesh_shape)
    assert len(found) >= min_strategies, f"{op}: only {len(found)} strategies on {mesh_shape}"
    for st in found:
        local_outs, local_grads = {}, {}
        for c in all_coords(mesh_shape):
            local, inputs = [], []
            for k, x in enumerate(operands):
                spec = st.in_specs[k] if k < len(st.in_specs) else None
                if not isinstance(x, torch.Tensor):
                    local.append(x)
                    inputs.append(x)
                    continue
                v = x if spec is None else _piece(x, spec, c, mesh_shape)
                leaf = v.detach().clone().requires_grad_(x.is_floating_point())
                local.append(leaf)
                # A bias added into a partial sum counts once: devices off coordinate 0 add zeros,
                # while its gradient passes through unmasked (the executor's mask_to_first).
                masked = k in st.masked and any(c[a] for a in st.out_spec.partial)
                inputs.append(leaf - leaf.detach() if masked else leaf)
            local_shape = st.out_spec.piece_shape(tuple(outs[0].shape), c, mesh_shape)  # as the runtime's local sizes
            if st.count_axes:
                count = sum(count_fn(*[_piece(x, st.in_specs[k], g, mesh_shape) if isinstance(x, torch.Tensor) else x
                                       for k, x in enumerate(operands)]) for g in _partial_group(c, st.count_axes, mesh_shape))
                y = summed_fn(*inputs, local=local_shape) / count
            elif "at" in inspect.signature(fn).parameters:  # ops whose local result depends on the position
                y = fn(*inputs, local=local_shape, at=(c, st))
            else:
                y = fn(*inputs, local=local_shape)
            ys = y if isinstance(y, (tuple, list)) else (y,)
            ys = [v * float(st.scale) for v in ys]
            local_outs[c] = [v.detach() for v in ys]
            dys = [_piece(g, st.out_spec.without_partial(), c, mesh_shape) for g in grads_out]
            torch.autograd.backward(ys, dys)
            local_grads[c] = [v.grad if isinstance(v, torch.Tensor) and v.requires_grad else None for v in local]
        for c in all_coords(mesh_shape):
            group = _partial_group(c, st.out_spec.partial, mesh_shape)
            for i, o in enumerate(outs):
                summed = sum(local_outs[g][i] for g in group)
                expect = _piece(o.detach(), st.out_spec, c, mesh_shape)
                torch.testing.assert_close(summed, expect, rtol=1e-4, atol=1e-5,
                                           msg=f"{op} {st.assignment} forward at {c}")
            for k, g_full in enumerate(full_grads):
                if g_full is None or st.grad_specs[k] is None:
                    continue
                spec = st.grad_specs[k]
                summed = sum(local_grads[g][k] for g in _partial_group(c, spec.partial, mesh_shape))
                expect = _piece(g_full, spec, c, mesh_shape)
                torch.testing.assert_close(summed, expect, rtol=1e-4, atol=1e-5,
                                           msg=f"{op} {st.assignment} grad of operand {k} at {c}")
    return found


def R(*shape):
    return torch.randn(*shape, dtype=torch.float64)


MESHES = [(2,), (2, 2)]


@pytest.mark.parametrize("mesh_shape", MESHES)
def test_linear_with_bias_covers_data_column_and_row_parallel(mesh_shape):
    found = check_op("linear", lambda x, w, b, local: F.linear(x, w, b), [R(4, 4, 8), R(8, 8), R(8)], {}, mesh_shape)
    assignments = {tuple(i for i, _ in s.assignment) for s in found}
    assert {("b0",), ("b1",), ("k",), ("n",)} <= assignments


@pytest.mark.parametrize("mesh_shape", MESHES)
@pytest.mark.parametrize("case", [
    ("matmul", lambda a, b, local: a @ b, [R(2, 4, 4, 8), R(2, 4, 8, 4)], {}),
    ("matmul", lambda a, b, local: a @ b, [R(4, 4, 8), R(8, 4)], {}),
    ("bmm", lambda a, b, local: torch.bmm(a, b), [R(4, 4, 8), R(4, 8, 4)], {}),
    ("addmm", lambda c, a, b, local: torch.addmm(c, a, b), [R(4), R(4, 8), R(8, 4)], {}),
    ("baddbmm", lambda c, a, b, local: torch.baddbmm(c, a, b), [R(4, 4, 4), R(4, 4, 8), R(4, 8, 4)], {}),
    ("conv2d", lambda x, w, b, local: F.conv2d(x, w, b, padding=1), [R(2, 4, 6, 6), R(4, 4, 3, 3), R(4)], {}),
    ("max_pool2d", lambda x, local: F.max_pool2d(x, 2), [R(2, 4, 4, 4)], {}),
], ids=lambda c: c[0] if isinstance(c, tuple) else None)
def test_contractions_and_windows(case, mesh_shape):
    op, fn, operands, attrs = case
    check_op(op, fn, operands, attrs, mesh_shape)


def causal_attention(mesh_shape: tuple[int, ...], shape: tuple[int, ...]) -> Callable:
    """Causal attention on ``shape`` (batch, heads, rows, dim) as the executor runs it, for
    ``check_op``: rows split over the mesh are masked by their global positions."""

    def causal(q, k, v, local, at=None):
        if at is None or not at[1].in_specs[0].dims[-2]:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        coords, strategy = at
        groups = SimpleNamespace(coords=coords, mesh=SimpleNamespace(shape=mesh_shape))
        node = SimpleNamespace(attrs={"is_causal": True}, out=SimpleNamespace(shape=shape))
        return causal_rows_attention([q, k, v], node, SimpleNamespace(in_specs=strategy.in_specs), groups)

    return causal


@pytest.mark.parametrize("mesh_shape", MESHES)
def test_attention_shards_batch_heads_queries_and_value_dim(mesh_shape):
    mask = torch.zeros(4, 4, dtype=torch.float64)
    fn = lambda q, k, v, m, local: F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    found = check_op("scaled_dot_product_attention", fn, [R(2, 4, 4, 8), R(2, 4, 4, 8), R(2, 4, 4, 8), mask], {},
                     mesh_shape)

    found_causal = check_op("scaled_dot_product_attention", causal_attention(mesh_shape, (2, 4, 4, 8)),
                            [R(2, 4, 4, 8)] * 3, {"is_causal": True}, mesh_shape)
    assert any(s.in_specs[0].dims[-2] for s in found_causal) and len(found_causal) <= len(found)


def test_embedding_shards_hidden_and_tokens_not_vocabulary():
    ids = torch.randint(0, 8, (4, 4))
    found = check_op("embedding", lambda w, i, local: F.embedding(i, w), [R(8, 4), ids], {}, (2,))
    assert all(s.in_specs[0].dims[0] == () for s in found)


@pytest.mark.parametrize("mesh_shape", MESHES)
@pytest.mark.parametrize("case", [
    ("gelu", lambda x, local: F.gelu(x), [R(4, 4, 8)], {}),
    ("add", lambda x, y, local: x + y, [R(4, 4, 8), R(8)], {}),
    ("mul", lambda x, y, local: x * y, [R(4, 1, 8), R(4, 4, 1)], {}),
    ("where", lambda c, x, y, local: torch.where(c, x, y), [torch.rand(4, 8) > 0.5, R(4, 8), R(1, 8)], {}),
    ("softmax", lambda x, local: torch.softmax(x, -1), [R(4, 4, 8)], {"dim": -1}),
    ("log_softmax", lambda x, local: torch.log_softmax(x, 1), [R(4, 4, 8)], {"dim": 1}),
    ("cumsum", lambda x, local: torch.cumsum(x, 0), [R(4, 8)], {"dim": 0}),
    ("tril", lambda x, local: torch.tril(x), [R(2, 4, 4)], {}),
    ("sum", lambda x, local: x.sum(dim=(1,)), [R(4, 4, 8)], {"dim": [1]}),
    ("sum", lambda x, local: x.sum(), [R(4, 8)], {}),
    ("mean", lambda x, local: x.mean(-1, keepdim=True), [R(4, 4, 8)], {"dim": [-1], "keepdim": True}),
    ("amax", lambda x, local: x.amax(-1), [R(4, 8)], {"dim": [-1]}),
    ("layer_norm", lambda x, w, b, local: F.layer_norm(x, (8,), w, b), [R(4, 4, 8), R(8), R(8)],
     {"normalized_shape": [8]}),
], ids=lambda c: c[0] if isinstance(c, tuple) else None)
def test_pointwise_normalisations_and_reductions(case, mesh_shape):
    op, fn, operands, attrs = case
    check_op(op, fn, operands, attrs, mesh_shape, min_strategies=1)


@pytest.mark.parametrize("mesh_shape", MESHES)
@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("op", ["cross_entropy_loss", "nll_loss_nd"])
def test_token_losses_with_ignored_targets_shard_tokens_exactly(op, reduction, mesh_shape):
    """Ignored targets (-100) sit unevenly across shards, as a causal LM's shifted labels do; label smoothing on."""
    names = {0: "none", 1: "mean", 2: "sum"}
    target = torch.randint(0, 8, (4, 4))
    target[0, 1:], target[3, 3] = -100, -100
    if op == "cross_entropy_loss":
        loss = lambda x, t, reduction: F.cross_entropy(x, t, reduction=reduction, label_smoothing=0.1)
    else:
        loss = lambda x, t, reduction: F.nll_loss(x.log_softmax(1), t, reduction=reduction)
    fn = lambda x, t, local: loss(x, t, names[reduction])
    found = check_op(op, fn, [R(4, 8, 4), target], {"reduction": reduction}, mesh_shape,
                     summed_fn=lambda x, t, local: loss(x, t, "sum"), count_fn=lambda x, t: (t != -100).sum())
    assert any(s.in_specs[0].dims[0] for s in found)
    assert all(s.in_specs[0].dims[1] == () for s in found)  # the class dim stays whole
    assert any(s.count_axes for s in found) == (reduction == 1)
    assert all(s.scale == 1 for s in found)


def test_weighted_mean_cross_entropy_keeps_its_targets_whole():
    """A class-weighted mean divides by the targets' summed weights: only the replicated strategy is exact."""
    found = strategies(instantiate(load_rules()["cross_entropy_loss"], [_meta(R(8, 8)), _meta(torch.zeros(8, dtype=torch.long)),
                                                                        _meta(R(8))], (), {"reduction": 1}), (2,))
    assert [s.in_specs[0] for s in found] == [TensorSpec.replicated(2)]


@pytest.mark.parametrize("mesh_shape", MESHES)
@pytest.mark.parametrize("case", [
    ("view", lambda x, local: x.view(local or (4, 4, 2, 4)), [R(4, 4, 8)], {"size": [4, 4, 2, 4]}),
    ("view", lambda x, local: x.view(local or (4, 32)), [R(4, 4, 8)], {"size": [4, 32]}),
    ("reshape", lambda x, local: x.reshape(local or (16, 8)), [R(4, 4, 8)], {"size": [16, 8]}),
    ("flatten", lambda x, local: x.flatten(1), [R(4, 4, 8)], {"start_dim": 1}),
    ("unflatten", lambda x, local: x.unflatten(2, local[2:4] if local else (2, 4)), [R(4, 4, 8)],
     {"dim": 2, "sizes": [2, 4]}),
    ("unsqueeze", lambda x, local: x.unsqueeze(1), [R(4, 8)], {"dim": 1}),
    ("squeeze", lambda x, local: x.squeeze(1), [R(4, 1, 8)], {"dim": [1]}),
    ("permute", lambda x, local: x.permute(2, 0, 1), [R(4, 4, 8)], {"dims": [2, 0, 1]}),
    ("transpose", lambda x, local: x.transpose(1, 2), [R(4, 4, 8)], {"dim0": 1, "dim1": 2}),
    ("t", lambda x, local: x.t(), [R(4, 8)], {}),
    ("expand", lambda x, local: x.expand(local or (4, 4, 8)), [R(4, 1, 8)], {"size": [4, 4, 8]}),
    ("cat", lambda x, y, local: torch.cat([x, y], 1), [R(4, 4, 8), R(4, 4, 8)], {"dim": 1}),
    ("split", lambda x, local: x.split(4, 2), [R(4, 4, 8)], {"split_size": 4, "dim": 2}),
    ("unbind", lambda x, local: x.unbind(1), [R(4, 2, 8)], {"dim": 1}),
    ("select", lambda x, local: x.select(1, 0), [R(4, 4, 8)], {"dim": 1, "index": 0}),
    ("slice", lambda x, local: x[:, 1:3], [R(4, 4, 8)], {"dim": 1, "start": 1, "end": 3}),
], ids=lambda c: c[0] if isinstance(c, tuple) else None)
def test_shape_ops(case, mesh_shape):
    op, fn, operands, attrs = case

    def with_local(*args, local):
        # The runtime replaces a shape argument by the local output shape; emulate that here.
        return fn(*args, local=tuple(local) if local is not None else None)

    check_op(op, with_local, operands, attrs, mesh_shape, min_strategies=1)


def test_view_only_shards_the_outer_dim_of_a_split_group():
    rule = load_rules()["view"]
    meta = TensorMeta((2, 16, 64), "float32", 4)
    inst = instantiate(rule, [meta], (2, 16, 4, 16), {"size": [2, 16, 4, 16]})
    assert inst.operands[0] == ("g0", "g1", "g2")
    assert inst.output == ("g0", "g1", "g2", None)
    specs = {s.out_spec for s in strategies(inst, (4,))}
    assert TensorSpec(((), (), (), (0,))) not in specs
    assert TensorSpec(((), (), (0,), ())) in specs


def test_slapo_search_space_keeps_only_the_last_two_dims():
    rule = load_rules()["linear"]
    metas = [TensorMeta((8, 16, 16), "float32", 4), TensorMeta((32, 16), "float32", 4)]
    inst = instantiate(rule, metas, (8, 16, 32), {})
    allowed = {s.assignment for s in strategies(inst, (8,), lambda d, r: d >= r - 2)}
    assert (("b0", (0,)),) not in allowed and (("b1", (0,)),) in allowed


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_pointwise_losses_shard_every_dim(reduction):
    names = {0: "none", 1: "mean", 2: "sum"}
    fn = lambda x, t, local: F.mse_loss(x, t, reduction=names[reduction])
    found = check_op("mse_loss", fn, [R(4, 8), R(4, 8)], {"reduction": reduction}, (2, 2))
    assert any(s.out_spec.partial for s in found) == (reduction != 0)


def test_conv_with_groups_keeps_channels_whole():
    fn = lambda x, w, local: F.conv2d(x, w, groups=2)
    found = check_op("conv2d", fn, [R(2, 4, 4, 4), R(4, 2, 1, 1)], {"groups": 2}, (2,))
    assert all(not s.in_specs[0].dims[1] for s in found)


def _values_and_indices(result):
    """values + indices as one float tensor: both must match the global op's piece locally."""
    return result.values + result.indices


@pytest.mark.parametrize("mesh_shape", MESHES)
@pytest.mark.parametrize("case", [
    ("conv1d", lambda x, w, b, local: F.conv1d(x, w, b, padding=1), [R(2, 4, 6), R(4, 4, 3), R(4)], {}),
    ("conv3d", lambda x, w, b, local: F.conv3d(x, w, b, padding=1), [R(2, 4, 3, 3, 3), R(4, 4, 3, 3, 3), R(4)], {}),
    ("conv_transpose1d", lambda x, w, b, local: F.conv_transpose1d(x, w, b, stride=2), [R(2, 4, 3), R(4, 4, 2), R(4)],
     {}),
    ("conv_transpose2d", lambda x, w, b, local: F.conv_transpose2d(x, w, b, stride=2), [R(2, 4, 3, 3), R(4, 2, 2, 2),
                                                                                       R(2)], {}),
    ("einsum", lambda x, w, local: torch.einsum("bij,jk->bik", x, w), [R(4, 4, 8), R(8, 4)],
     {"equation": "bij,jk->bik"}),
    ("einsum", lambda q, k, local: torch.einsum("b h q d, b h k d -> b h q k", q, k), [R(2, 2, 4, 4), R(2, 2, 4, 4)],
     {"equation": "b h q d, b h k d -> b h q k"}),
    ("einsum", lambda a, b, local: torch.einsum("...ij,jk", a, b), [R(2, 4, 4, 8), R(8, 4)], {"equation": "...ij,jk"}),
    ("einsum", lambda a, b, local: torch.einsum("bi,bj->", a, b), [R(4, 4), R(4, 2)], {"equation": "bi,bj->"}),
    ("outer", lambda a, b, local: torch.outer(a, b), [R(4), R(8)], {}),
    ("mv", lambda a, b, local: torch.mv(a, b), [R(4, 8), R(8)], {}),
    ("addmv", lambda c, a, b, local: torch.addmv(c, a, b), [R(4), R(4, 8), R(8)], {}),
], ids=lambda c: c[0] if isinstance(c, tuple) else None)
def test_more_contractions(case, mesh_shape):
    op, fn, operands, attrs = case
    check_op(op, fn, operands, attrs, mesh_shape)


def test_einsum_derives_partial_sums_from_its_equation():
    rule = load_rules()["einsum"]
    metas = [TensorMeta((4, 4, 8), "float32", 4), TensorMeta((8, 4), "float32", 4)]
    inst = instantiate(rule, metas, (4, 4, 4), {"equation": "bij,jk->bik"})
    assert inst.contracted == {"j"}
    with pytest.raises(RuleError):
        instantiate(rule, metas[:1], (4,), {"equation": "bii->bi"})


@pytest.mark.parametrize("mesh_shape", MESHES)
@pytest.mark.parametrize("case", [
    ("batch_norm", lambda x, w, b, m, v, local: F.batch_norm(x, m.detach(), v.detach(), w, b), [R(4, 4, 2, 2), R(4), R(4), R(4),
                                                                            R(4).abs() + 0.5], {"training": False}),
    ("batch_norm", lambda x, m, v, local: F.batch_norm(x, m.detach(), v.detach()), [R(4, 4), R(4), R(4).abs() + 0.5], {}),
    ("batch_norm", lambda x, w, b, local: F.batch_norm(x, None, None, w, b, training=True), [R(4, 4, 2), R(4), R(4)],
     {"training": True}),
    ("group_norm", lambda x, w, b, local: F.group_norm(x, 2, w, b), [R(4, 4, 2, 2), R(4), R(4)], {"num_groups": 2}),
    ("instance_norm", lambda x, w, b, local: F.instance_norm(x, weight=w, bias=b), [R(4, 4, 4), R(4), R(4)], {}),
    ("prelu", lambda x, w, local: F.prelu(x, w), [R(4, 4, 2), R(4)], {}),
    ("prelu", lambda x, w, local: F.prelu(x, w), [R(4, 4, 2), R(1)], {}),
    ("max", lambda x, local: _values_and_indices(x.max(dim=1)), [R(4, 4, 2)], {"dim": 1}),
    ("min", lambda x, local: _values_and_indices(torch.min(x, -1, keepdim=True)), [R(4, 4)],
     {"dim": -1, "keepdim": True}),
    ("max", lambda x, y, local: torch.max(x, y), [R(4, 4), R(4, 4)], {}),
    ("topk", lambda x, local: _values_and_indices(x.topk(2, dim=1)), [R(4, 4, 2)], {"k": 2, "dim": 1}),
    ("sort", lambda x, local: _values_and_indices(x.sort(dim=-1)), [R(4, 4)], {"dim": -1}),
    ("logsumexp", lambda x, local: x.logsumexp(1), [R(4, 4, 2)], {"dim": [1]}),
    ("glu", lambda x, local: F.glu(x, 1), [R(4, 4, 2)], {"dim": 1}),
    ("normalize", lambda x, local: F.normalize(x, dim=-1), [R(4, 4, 2)], {"dim": -1}),
    ("roll", lambda x, local: torch.roll(x, 1, 1), [R(4, 4, 2)], {"shifts": [1], "dims": [1]}),
    ("flip", lambda x, local: x.flip(0), [R(4, 4)], {"dims": [0]}),
    ("expand_as", lambda x, y, local: x.expand_as(y), [R(4, 1), R(4, 4)], {}),
], ids=lambda c: c[0] if isinstance(c, tuple) else None)
def test_normalisations_selections_and_reorders(case, mesh_shape):
    op, fn, operands, attrs = case
    check_op(op, fn, operands, attrs, mesh_shape, min_strategies=1)


def test_batch_norm_with_batch_statistics_only_shards_channels():
    fn = lambda x, w, b, local: F.batch_norm(x, None, None, w, b, training=True)
    found = check_op("batch_norm", fn, [R(4, 4, 2), R(4), R(4)], {"training": True}, (2,))
    assert {a for s in found for a, _ in s.assignment} == {"c"}


@pytest.mark.parametrize("mesh_shape", MESHES)
@pytest.mark.parametrize("case", [
    ("max_pool1d", lambda x, local: F.max_pool1d(x, 2), [R(4, 4, 4)], {}),
    ("avg_pool1d", lambda x, local: F.avg_pool1d(x, 2), [R(4, 4, 4)], {}),
    ("adaptive_avg_pool1d", lambda x, local: F.adaptive_avg_pool1d(x, 1), [R(4, 4, 4)], {}),
    ("adaptive_max_pool2d", lambda x, local: F.adaptive_max_pool2d(x, 1), [R(4, 4, 4, 4)], {}),
    ("avg_pool3d", lambda x, local: F.avg_pool3d(x, 2), [R(2, 4, 2, 2, 2)], {}),
    ("interpolate", lambda x, local: F.interpolate(x, scale_factor=2.0), [R(4, 4, 3, 3)], {}),
    ("interpolate", lambda x, local: F.interpolate(x, size=5, mode="linear"), [R(4, 4, 3)], {}),
    ("upsample_bilinear2d", lambda x, local: F.interpolate(x, size=(5, 4), mode="bilinear"), [R(4, 4, 3, 3)], {}),
], ids=lambda c: c[0] if isinstance(c, tuple) else None)
def test_windows_and_resampling_shard_batch_and_channels(case, mesh_shape):
    op, fn, operands, attrs = case
    found = check_op(op, fn, operands, attrs, mesh_shape)
    assert all(not d for s in found for d in s.in_specs[0].dims[2:])


@pytest.mark.parametrize("mesh_shape", MESHES)
@pytest.mark.parametrize("case", [
    ("tensor_getitem", lambda x, local: x[:, :2, :], [R(4, 4, 4)], {"index": [[None] * 3, [None, 2, None], [None] * 3]}),
    ("tensor_getitem", lambda x, local: x[:, 0], [R(4, 4, 4)], {"index": [[None] * 3, 0]}),
    ("tensor_getitem", lambda x, local: x[..., None], [R(4, 4)], {"index": ["...", None]}),
    ("tensor_getitem", lambda x, local: x[None, 1:, ..., 0:8], [R(4, 4, 4)],
     {"index": [None, [1, None, None], "...", [0, 8, None]]}),
    ("tensor_getitem", lambda x, local: x[:, ::2], [R(4, 4, 4)], {"index": [[None] * 3, [None, None, 2]]}),
    ("stack", lambda x, y, local: torch.stack([x, y], 1), [R(4, 4), R(4, 4)], {"dim": 1}),
    ("repeat", lambda x, local: x.repeat(2, 1, 2), [R(4, 4)], {"repeats": [2, 1, 2]}),
    ("tile", lambda x, local: x.tile((2,)), [R(4, 4)], {"dims": [2]}),
    ("pad", lambda x, local: F.pad(x, (1, 2)), [R(4, 4, 4)], {"pad": [1, 2]}),
    ("pad", lambda x, local: F.pad(x, (0, 0, 1, 1), mode="reflect"), [R(4, 4, 4)], {"pad": [0, 0, 1, 1]}),
    ("gather", lambda x, i, local: torch.gather(x, 2, i), [R(4, 4, 4), torch.randint(0, 4, (4, 4, 2))], {"dim": 2}),
    ("gather", lambda x, i, local: torch.gather(x, 1, i), [R(4, 4, 4), torch.randint(0, 4, (4, 2, 2))], {"dim": 1}),
    ("index_select", lambda x, i, local: torch.index_select(x, 1, i), [R(4, 4, 4), torch.tensor([0, 2, 2])],
     {"dim": 1}),
    ("slice_scatter", lambda x, y, local: torch.slice_scatter(x, y, 2, 0, 2), [R(4, 4, 4), R(4, 4, 2)],
     {"dim": 2, "start": 0, "end": 2, "step": 1}),
    ("select_scatter", lambda x, y, local: torch.select_scatter(x, y, 1, 3), [R(4, 4, 4), R(4, 4)],
     {"dim": 1, "index": 3}),
    ("movedim", lambda x, local: x.movedim(0, -1), [R(4, 4, 2)], {"source": [0], "destination": [-1]}),
    ("mT", lambda x, local: x.mT, [R(2, 4, 8)], {}),
], ids=lambda c: c[0] if isinstance(c, tuple) else None)
def test_indexing_stacking_repeating_padding(case, mesh_shape):
    op, fn, operands, attrs = case
    check_op(op, fn, operands, attrs, mesh_shape, min_strategies=1)


def test_tensor_getitem_shards_only_untouched_dims():
    rule = load_rules()["tensor_getitem"]
    inst = instantiate(rule, [TensorMeta((4, 8, 6), "float32", 4)], (4, 1, 6, 1),
                       {"index": [[None, None, None], 0, None, "...", None]})
    assert inst.operands == (("d0", None, "d2"),)
    assert inst.output == ("d0", None, "d2", None)
