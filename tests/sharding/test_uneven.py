"""Dims the mesh does not divide, cut as ``torch.chunk`` and DTensor cut them.

The piece arithmetic is checked against ``torch.chunk`` itself, and every strategy of an op on
shapes the mesh does not divide runs through the numeric harness of ``test_rules_numeric.py``:
each simulated device computes on its ``torch.chunk`` pieces, which must give its piece of the
global op's output and gradients.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autoshard.frontend.graph import TensorMeta
from autoshard.sharding.reshard import reshard_steps
from autoshard.sharding.rules import instantiate, load_rules, strategies
from autoshard.sharding.spec import TensorSpec, cuts, piece_range
from tests.sharding.test_rules_numeric import R, causal_attention, check_op


@pytest.mark.parametrize("n", range(1, 20))
@pytest.mark.parametrize("pieces", [1, 2, 3, 4, 8])
def test_piece_ranges_are_torch_chunk(n, pieces):
    chunks = torch.arange(n).chunk(pieces)
    for index in range(pieces):
        start, length = piece_range(n, pieces, index)
        expect = chunks[index].tolist() if index < len(chunks) else []
        assert list(range(start, start + length)) == expect


def test_uneven_dims_are_cut_by_one_axis_into_nonempty_pieces():
    assert cuts(31, (4,)) and cuts(131071, (8,)) and cuts(32, (2, 4))
    assert not cuts(5, (4,))  # 2, 2, 1, 0
    assert not cuts(31, (2, 2))


def uneven_strategies(op: str, operands: list, attrs: dict, out_shape: tuple[int, ...], mesh_shape):
    """The strategies of ``op`` that cut some tensor unevenly."""
    metas = [TensorMeta(tuple(x.shape), str(x.dtype).replace("torch.", ""), x.element_size()) for x in operands]
    found = strategies(instantiate(load_rules()[op], metas, out_shape, attrs), mesh_shape)
    return [s for s in found if any(spec is not None and spec.uneven_dims(m.shape, mesh_shape)
                                    for spec, m in zip(s.in_specs, metas))]


@pytest.mark.parametrize("mesh_shape", [(2,), (4,), (2, 2)])
def test_linear_on_odd_tokens_splits_them(mesh_shape):
    operands = [R(7, 3, 8), R(4, 8), R(4)]
    check_op("linear", lambda x, w, b, local: F.linear(x, w, b), operands, {}, mesh_shape)
    assert uneven_strategies("linear", operands, {}, (7, 3, 4), mesh_shape)


@pytest.mark.parametrize("mesh_shape", [(2,), (4,)])
def test_views_norms_and_sums_on_odd_tokens(mesh_shape):
    check_op("view", lambda x, local: x.view(local or (7, 2, 4)), [R(7, 8)], {"size": [7, 2, 4]}, mesh_shape)
    check_op("softmax", lambda x, local: torch.softmax(x, -1), [R(7, 8)], {"dim": -1}, mesh_shape)
    check_op("sum", lambda x, local: x.sum(dim=(0,)), [R(7, 8)], {"dim": [0]}, mesh_shape)
    assert uneven_strategies("sum", [R(7, 8)], {"dim": [0]}, (8,), mesh_shape)


def test_a_mean_over_odd_tokens_is_not_split():
    """A mean of unequal pieces is not the mean of the pieces' means: only even splits are offered."""
    assert not uneven_strategies("mean", [R(7, 8)], {"dim": [0]}, (8,), (2,))
    check_op("mean", lambda x, local: x.mean(0), [R(7, 8)], {"dim": [0]}, (2,), min_strategies=1)


@pytest.mark.parametrize("mesh_shape", [(2,), (4,), (8,)])
def test_a_shifted_loss_splits_its_tokens(mesh_shape):
    """``logits[:, :-1]``: the whole's pieces shortened at the end are the pieces of the slice."""
    fn = lambda x, local: x[:, :local[1]] if local else x[:, :-1]
    found = check_op("slice", fn, [R(2, 16, 3)], {"dim": 1, "start": 0, "end": -1, "step": 1}, mesh_shape)
    assert any(s.out_spec.dims[1] for s in found)
    target = torch.randint(0, 3, (15,))
    target[2] = -100
    check_op("cross_entropy_loss", lambda x, t, local: F.cross_entropy(x, t), [R(15, 3), target], {"reduction": 1},
             mesh_shape, summed_fn=lambda x, t, local: F.cross_entropy(x, t, reduction="sum"),
             count_fn=lambda x, t: (t != -100).sum())


def test_a_slice_whose_pieces_do_not_line_up_keeps_its_dim_whole():
    """``x[:, :4]`` of 8 on 4 devices: pieces of 2 against pieces of 1."""
    found = strategies(instantiate(load_rules()["slice"], [TensorMeta((2, 8), "float32", 4)], (2, 4),
                                   {"dim": 1, "start": 0, "end": 4, "step": 1}), (4,))
    assert not any(s.out_spec.dims[1] for s in found)
    assert any(s.out_spec.dims[0] for s in strategies(instantiate(
        load_rules()["slice"], [TensorMeta((4, 8), "float32", 4)], (4, 4), {"dim": 1, "start": 0, "end": 4}), (4,)))


def test_uneven_steps_carry_the_global_shape_and_price_the_largest_piece():
    row = TensorSpec(((0,), ()))
    steps = reshard_steps(row, TensorSpec.replicated(2), (31, 8), 4, (4,))
    assert steps[0].shape == (31, 8) and steps[0].in_bytes == 8 * 8 * 4
    assert reshard_steps(row, TensorSpec.replicated(2), (32, 8), 4, (4,))[0].shape == ()


@pytest.mark.parametrize("mesh_shape", [(2,), (4,)])
def test_causal_attention_splits_odd_query_rows(mesh_shape):
    """Rows 7 on 2 or 4 devices: each device's mask starts at its piece's global position."""
    found = check_op("scaled_dot_product_attention", causal_attention(mesh_shape, (2, 4, 7, 8)), [R(2, 4, 7, 8)] * 3,
                     {"is_causal": True}, mesh_shape)
    assert any(s.in_specs[0].dims[-2] for s in found)
