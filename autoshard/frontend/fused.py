"""Ops a GPU runs as one fused kernel where torch's CPU path decomposes them, as autograd sees the kernel.

The frontend measures what autograd saves, and what an op allocates, on fake CPU tensors
(``frontend/profile.py``). For most ops the CPU and CUDA paths keep the same tensors. Not for
``rms_norm``: on CUDA, ``torch.rms_norm`` calls the fused ``_fused_rms_norm`` kernel, which keeps
its input, its weight and one fp32 reciprocal RMS per row, and allocates only its two outputs.
On the CPU, it decomposes into fp32 elementwise ops that keep two fp32 copies of the input.

A plan runs on GPUs, so these ops are measured through a stand-in. It is an autograd function
that saves and allocates what the CUDA kernel does and computes nothing. The flop counts still
come from the original call.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from autoshard.frontend.call import NodeCall


class _FusedRmsNorm(torch.autograd.Function):
    """``_fused_rms_norm`` as autograd sees it on CUDA: it saves input, weight and fp32 rstd per row."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, normalized_shape: tuple[int, ...], weight: torch.Tensor | None,
                eps: float | None) -> torch.Tensor:
        rows = x.shape[: x.dim() - len(normalized_shape)]
        rstd = x.new_empty((*rows, *(1 for _ in normalized_shape)), dtype=torch.float32)
        ctx.save_for_backward(x, weight, rstd)
        dtype = x.dtype if weight is None else torch.promote_types(x.dtype, weight.dtype)
        return x.new_empty(x.shape, dtype=dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, _ = ctx.saved_tensors
        return (torch.empty_like(x) if ctx.needs_input_grad[0] else None, None,
                torch.empty_like(weight) if weight is not None and ctx.needs_input_grad[2] else None, None)


def fused_rms_norm(input: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
                   eps: float | None = None) -> torch.Tensor:
    """``torch.rms_norm`` as CUDA runs it, for measuring saved tensors and allocations (no values)."""
    return _FusedRmsNorm.apply(input, tuple(normalized_shape), weight, eps)


GPU_KERNELS: dict[Callable[..., Any], Callable[..., Any]] = {F.rms_norm: fused_rms_norm, torch.rms_norm: fused_rms_norm}
"""Targets whose CUDA path keeps other tensors than the CPU path, and the stand-in measured instead."""


def as_on_gpu(call: NodeCall) -> NodeCall:
    """``call`` with its target replaced by the stand-in of the kernel a GPU runs, where there is one."""
    standin = None if call.method else GPU_KERNELS.get(call.target)
    return call if standin is None else dataclasses.replace(call, target=standin)
