"""The grouped matmul of the experts node against a float64 loop over its groups, on both of its paths.

``grouped_mm`` and its backward run ``torch._grouped_mm`` where the kernel takes the operands
(float32 or bfloat16, 16-byte aligned strides) and a loop otherwise; either way rows past the last
group are zeros in the output and in the input's gradient, and a group with no rows gets a zero
weight gradient (the kernel leaves such memory unwritten).
"""

from __future__ import annotations

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from autoshard.frontend.experts import _eager_kernel, _kernel_takes, expert_mlp, grouped_mm, grouped_mm_backward


def _reference(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor,
               grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x, w, grad = x.double(), w.double(), grad.double()
    out, grad_x, grad_w = x.new_zeros(x.shape[0], w.shape[2]), torch.zeros_like(x), torch.zeros_like(w)
    start = 0
    for g, end in enumerate(ends.tolist()):
        out[start:end], grad_x[start:end] = x[start:end] @ w[g], grad[start:end] @ w[g].T
        grad_w[g] = x[start:end].T @ grad[start:end]
        start = end
    return out, grad_x, grad_w


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 5), min_size=1, max_size=5), tail=st.integers(0, 3),
       k=st.sampled_from([3, 4, 8, 16]), n=st.sampled_from([5, 4, 8, 12]),
       dtype=st.sampled_from([torch.float32, torch.float64]), transposed=st.booleans(), seed=st.integers(0, 99))
def test_grouped_mm_and_its_backward_equal_the_loop_over_groups(counts: list[int], tail: int, k: int, n: int,
                                                                dtype: torch.dtype, transposed: bool, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    ends = torch.tensor(counts).cumsum(0)
    rows = int(ends[-1]) + tail
    x = torch.randn(rows, k, dtype=dtype, generator=generator)
    w = (torch.randn(len(counts), n, k, dtype=dtype, generator=generator).transpose(1, 2) if transposed
         else torch.randn(len(counts), k, n, dtype=dtype, generator=generator))
    grad = torch.randn(rows, n, dtype=dtype, generator=generator)
    want = _reference(x, w, ends, grad)
    got = (grouped_mm(x, w, ends), *grouped_mm_backward(x, w, ends, grad))
    for have, ref in zip(got, want):
        assert have.dtype == dtype and have.shape == ref.shape
        torch.testing.assert_close(have.double(), ref, rtol=1e-5, atol=1e-5)


def test_the_kernel_takes_aligned_float32_and_bfloat16_and_not_the_rest() -> None:
    assert _kernel_takes(torch.zeros(6, 8), torch.zeros(2, 8, 4))
    assert _kernel_takes(torch.zeros(6, 8, dtype=torch.bfloat16), torch.zeros(2, 8, 8, dtype=torch.bfloat16))
    assert not _kernel_takes(torch.zeros(6, 8), torch.zeros(2, 8, 5))  # a row of 5 floats: 20-byte stride
    assert not _kernel_takes(torch.zeros(6, 8, dtype=torch.float64), torch.zeros(2, 8, 4, dtype=torch.float64))
    assert not _kernel_takes(torch.zeros(6, 8), torch.zeros(2, 8, 4, dtype=torch.bfloat16))


@settings(max_examples=30, deadline=None)
@given(counts=st.lists(st.integers(0, 4), min_size=1, max_size=4), tail=st.integers(0, 3), seed=st.integers(0, 99))
def test_the_expert_mlp_on_the_kernel_equals_it_on_the_custom_op(counts: list[int], tail: int, seed: int) -> None:
    """float32 operands take ``torch._grouped_mm`` and its own autograd; float64 ones the custom op.
    Rows past the last group (other experts' pairs) give zeros and get zero gradients on both."""
    assume(sum(counts) + tail > 0)  # a layer always has token-expert pairs
    generator = torch.Generator().manual_seed(seed)
    ends = torch.tensor(counts).cumsum(0)
    rows = torch.randn(int(ends[-1]) + tail, 8, generator=generator)
    gate_up, down = torch.randn(len(counts), 16, 8, generator=generator), torch.randn(len(counts), 8, 8, generator=generator)
    grad = torch.randn(rows.shape[0], 8, generator=generator)
    results = []
    for dtype in (torch.float32, torch.float64):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (rows, gate_up, down)]
        assert _eager_kernel(*leaves) == (dtype == torch.float32)
        out = expert_mlp(*leaves, ends, "silu")
        out.backward(grad.to(dtype))
        results.append([out.detach(), *(t.grad for t in leaves)])
    for kernel, loop in zip(*results):
        torch.testing.assert_close(kernel.double(), loop, rtol=1e-4, atol=1e-4)
    assert not results[0][0][int(ends[-1]):].any() and not results[0][1][int(ends[-1]):].any()
