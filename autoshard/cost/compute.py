"""Seconds of an op's local computation under one sharding strategy: a roofline per pass.

The flops are torch's own (``OpWork``, from ``torch.utils.flop_counter`` at global shapes): a
strategy that assigns mesh axes of total size ``degree`` to the op's indices runs ``1/degree`` of
them on each device (every formula torch counts — matmuls, convolutions, attention — is a
product of index sizes, so this equals the formula applied to the local shapes; the tests check
it). The bytes are those of the local operands and results. Each pass is a roofline at what its
kernel class achieves on the device (``cost/devices.py``: ``achieved``):

    forward  = max(flops / rate(fwd),          (sum_k in_k + out) / streaming)
    backward = max(backward_flops / rate(bwd), (out + sum_k in_k + sum_{k needs grad} in_k) / streaming)

with rate = peak(dtype) * achieved[class] (or, where the preset measured it, the fraction its
``by_flops`` curve for the class gives at the kernel's local flops: small products and short
attention run far below peak): ``matmul`` for matmuls and convolutions, the fused
attention classes for ``scaled_dot_product_attention`` (forward and backward apart), peak for
any other op (they are bound by the bytes), and streaming = HBM bandwidth * achieved["memory"].
Causal attention (``is_causal``) skips the masked half: torch's counter counts the full square,
FlashAttention's kernels (and its benchmarks' Tflop/s) only the half they compute, so a causal
pass runs half the counted flops at the attention rate.
The backward reads the output gradient and the saved operands, and writes the gradients of the
operands that need one. A view costs nothing; an op torch could not replay counts its bytes only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from autoshard.cost.devices import Device
from autoshard.frontend.graph import OpWork

MATMUL_OPS = frozenset({"linear", "matmul", "bmm", "mm", "addmm", "baddbmm", "einsum", "outer", "dot", "mv",
                        "conv1d", "conv2d", "conv3d", "convolution", "conv_transpose1d", "conv_transpose2d",
                        "conv_transpose3d", "moe_experts"})
"""Ops whose flops run on the tensor cores as GEMMs (``achieved["matmul"]``)."""
ATTENTION_OPS = frozenset({"scaled_dot_product_attention"})
"""Fused attention (``achieved["attention_forward"]`` / ``["attention_backward"]``)."""


def causal_split_load(parts: int) -> float:
    """The busiest device's causal attention work over an even share, when the query rows are
    split into ``parts`` contiguous blocks: the last block attends to every key, so it does
    ``(2 parts - 1) / parts`` of its share (2 - 1/parts; 1 unsplit)."""
    return (2 * parts - 1) / parts


@dataclass(frozen=True)
class PassTimes:
    """Seconds of one op's forward and backward on one device."""

    forward: float
    backward: float


def kernel_classes(op: str | None) -> tuple[str, str]:
    """(forward, backward) kernel class of an op name; ``peak`` for ops bound by their bytes."""
    if op in MATMUL_OPS:
        return "matmul", "matmul"
    if op in ATTENTION_OPS:
        return "attention_forward", "attention_backward"
    return "peak", "peak"


def roofline(flops: float, nbytes: float, rate: float, bandwidth: float) -> float:
    """The slower of arithmetic at ``rate`` flop/s and memory traffic at ``bandwidth`` bytes/s."""
    return max(flops / rate, nbytes / bandwidth)


def backward_bytes(in_bytes: Sequence[int], needs_grad: Sequence[bool], out_bytes: int) -> int:
    """Bytes a backward moves: the output gradient, the saved operands, the operand gradients."""
    return out_bytes + sum(in_bytes) + sum(b for b, g in zip(in_bytes, needs_grad) if g)


def op_times(work: OpWork | None, degree: int, in_bytes: Sequence[int], needs_grad: Sequence[bool],
             out_bytes: int, dtype: str, device: Device, op: str | None = None, causal: bool = False,
             moved: tuple[int, int] | None = None) -> PassTimes:
    """Forward and backward seconds of one op ``op`` on one device (local bytes, ``1/degree`` of its
    flops; ``causal``: masked attention, half of them; ``moved``: the (forward, backward) bytes
    where compiled code moves others than the op's operands and output, ``cost/fusion.py``)."""
    if work is not None and work.alias_of is not None:
        return PassTimes(0.0, 0.0)
    share = 0.5 if causal and op in ATTENTION_OPS else 1.0
    flops = work.flops * share if work is not None else 0
    backward_flops = work.backward_flops * share if work is not None else 0
    forward_class, backward_class = kernel_classes(op)
    bandwidth = device.streaming_bandwidth
    size = flops / degree  # the curves' measure: a product's (or attention's forward) local flops
    forward_bytes, back_bytes = moved if moved is not None else (
        sum(in_bytes) + out_bytes, backward_bytes(in_bytes, needs_grad, out_bytes))
    forward = roofline(flops / degree, forward_bytes, device.flops_per_second(dtype, forward_class, size),
                       bandwidth)
    backward = 0.0
    if any(needs_grad):
        backward = roofline(backward_flops / degree, back_bytes,
                            device.flops_per_second(dtype, backward_class, size), bandwidth)
    return PassTimes(forward, backward)
