"""runtime/context.py: a device's query rows of causal attention equal those rows of the whole one.

Every piece of a torch.chunk cut (even and uneven), forward and the gradients of the query, keys and
values, with and without grouped-query heads. On CPU the first piece runs ``is_causal`` and the
others a mask over the keys up to their last row; on CUDA (where one is present) those run torch's
flash kernel without a mask, its causal mask aligned bottom-right.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from autoshard.runtime.context import causal_rows_attention, flash_runs
from autoshard.sharding.spec import TensorSpec

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def rows_attention(q, k, v, pieces: int, gqa: bool) -> list[torch.Tensor]:
    """Each device's rows of causal attention when the rows are cut into ``pieces`` over one mesh axis."""
    seq = q.shape[-2]
    node = SimpleNamespace(attrs={"is_causal": True, "enable_gqa": gqa}, out=SimpleNamespace(shape=q.shape))
    place = SimpleNamespace(in_specs=[TensorSpec(((), (), (0,), ()))] * 3)
    outs = []
    for device, rows in enumerate(q.chunk(pieces, dim=-2)):
        groups = SimpleNamespace(coords=(device,), mesh=SimpleNamespace(shape=(pieces,)))
        outs.append(causal_rows_attention([rows, k, v], node, place, groups))
    assert sum(o.shape[-2] for o in outs) == seq
    return outs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seq,pieces", [(16, 2), (16, 4), (13, 3), (10, 4)])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_rows_match_the_whole_attention(device: str, seq: int, pieces: int, kv_heads: int) -> None:
    dtype = torch.float64 if device == "cpu" else torch.bfloat16
    gen = torch.Generator().manual_seed(seq * pieces + kv_heads)
    q, k, v = (torch.randn(2, h, seq, 16, generator=gen, dtype=torch.float64).to(device, dtype).requires_grad_()
               for h in (4, kv_heads, kv_heads))
    gqa = kv_heads != 4
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    grad = torch.randn(whole.shape, generator=gen, dtype=torch.float64).to(device, dtype)
    expected = torch.autograd.grad(whole, (q, k, v), grad)
    split = torch.cat(rows_attention(q, k, v, pieces, gqa), dim=-2)
    got = torch.autograd.grad(split, (q, k, v), grad)
    tol = {"atol": 1e-10, "rtol": 1e-10} if dtype == torch.float64 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(split, whole, **tol)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, **tol)


def test_flash_runs_only_where_its_kernel_takes_the_operands() -> None:
    """Metadata only: CPU and fp32 never; on CUDA half precision with a head dim the kernel takes."""
    q = torch.empty(1, 2, 4, 64, device="meta", dtype=torch.bfloat16)
    assert not flash_runs(torch.empty(1, 2, 4, 64, dtype=torch.bfloat16), q, q)
    cuda = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, shape=(1, 2, 4, 64))
    assert flash_runs(cuda, cuda, cuda)
    assert not flash_runs(SimpleNamespace(is_cuda=True, dtype=torch.float32, shape=(1, 2, 4, 64)), cuda, cuda)
    for head in (60, 512):
        odd = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, shape=(1, 2, 4, head))
        assert not flash_runs(odd, odd, odd)
    assert not flash_runs(SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, shape=(1, 2, 0, 64)), cuda, cuda)
