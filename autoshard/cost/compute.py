"""Seconds of an op's local computation under one sharding strategy: a roofline per pass.

The flops are torch's own (``OpWork``, from ``torch.utils.flop_counter`` at global shapes): a
strategy that assigns mesh axes of total size ``degree`` to the op's indices runs ``1/degree`` of
them on each device (every formula torch counts — matmuls, convolutions, attention — is a
product of index sizes, so this equals the formula applied to the local shapes; the tests check
it). The bytes are those of the local operands and results:

    forward  = max(flops / peak(dtype),          (sum_k in_k + out) / bandwidth)
    backward = max(backward_flops / peak(dtype), (out + sum_k in_k + sum_{k needs grad} in_k) / bandwidth)

(the backward reads the output gradient and the saved operands, and writes the gradients of the
operands that need one). A view costs nothing; an op torch could not replay counts its bytes only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from autoshard.cost.devices import Device
from autoshard.frontend.graph import OpWork


@dataclass(frozen=True)
class PassTimes:
    """Seconds of one op's forward and backward on one device."""

    forward: float
    backward: float


def roofline(flops: float, nbytes: float, peak: float, bandwidth: float) -> float:
    """The slower of arithmetic at ``peak`` flop/s and memory traffic at ``bandwidth`` bytes/s."""
    return max(flops / peak, nbytes / bandwidth)


def backward_bytes(in_bytes: Sequence[int], needs_grad: Sequence[bool], out_bytes: int) -> int:
    """Bytes a backward moves: the output gradient, the saved operands, the operand gradients."""
    return out_bytes + sum(in_bytes) + sum(b for b, g in zip(in_bytes, needs_grad) if g)


def op_times(work: OpWork | None, degree: int, in_bytes: Sequence[int], needs_grad: Sequence[bool],
             out_bytes: int, dtype: str, device: Device) -> PassTimes:
    """Forward and backward seconds of one op on one device (local bytes, ``1/degree`` of its flops)."""
    if work is not None and work.alias_of is not None:
        return PassTimes(0.0, 0.0)
    flops = work.flops if work is not None else 0
    backward_flops = work.backward_flops if work is not None else 0
    peak, bandwidth = device.flops_per_second(dtype), device.memory_bandwidth
    forward = roofline(flops / degree, sum(in_bytes) + out_bytes, peak, bandwidth)
    backward = 0.0
    if any(needs_grad):
        backward = roofline(backward_flops / degree, backward_bytes(in_bytes, needs_grad, out_bytes), peak, bandwidth)
    return PassTimes(forward, backward)
