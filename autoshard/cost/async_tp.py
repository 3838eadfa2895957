"""Asynchronous tensor parallelism (``--async-tp``): activation collectives hidden under the matmul fused with them.

torch's async TP (``torch._inductor`` micro-pipeline TP pass, ``enable_symm_mem_for_group``;
torchtitan's ``--experimental.enable_async_tensor_parallel``, which needs torch.compile) fuses an
all-gather with the matmul that consumes it (``fused_all_gather_matmul``) and a reduce-scatter
with the matmul that produces it (``fused_matmul_reduce_scatter``; their ``_scaled_mm`` forms under
Float8): the matmul runs chunk by chunk, each chunk's transfer under the previous chunk's product.
One collective hides under that one matmul only, not under the ops on its other side. In the
backward the collective's reverse fuses with the same matmul's input-gradient product, half its
backward (a linear's input and weight gradients are products of equal flops). Priced on every
activation edge next to a matmul: with ``F`` and ``B`` its forward and backward reshards and
``M``, ``G`` the forward and backward compute of the matmul beside it (the producer's or the
consumer's, whichever hides more where both are matmuls; 0 for other ops),

    cost(i, j) = max(0, F_ij - M_ij) + max(0, B_ij - G_ij / 2),   M_ij = max(fwd_src_i, fwd_dst_j),
                                                                  G_ij = max(bwd_src_i, bwd_dst_j).

The chunked pipeline leaves the first chunk's transfer (or the last chunk's product) in the open,
1/n of it over n devices; that is not charged, so the rule is an upper bound on what is hidden.
Edges between other ops are charged in full, as without async TP.
"""

from __future__ import annotations

import numpy as np

MatmulTicks = tuple[np.ndarray, np.ndarray] | None
"""(forward, backward) compute ticks per strategy of a matmul; None for any other op."""


def exposed(forward: np.ndarray, backward: np.ndarray, producer: MatmulTicks, consumer: MatmulTicks) -> np.ndarray:
    """What an edge's forward and backward reshard matrices (producer x consumer strategies) leave
    exposed beside the matmul fused with their collectives, ``producer`` or ``consumer`` (module doc)."""
    hide_forward = np.zeros_like(forward)
    hide_backward = np.zeros_like(backward)
    if producer is not None:
        hide_forward = np.maximum(hide_forward, producer[0][:, None])
        hide_backward = np.maximum(hide_backward, producer[1][:, None])
    if consumer is not None:
        hide_forward = np.maximum(hide_forward, consumer[0][None, :])
        hide_backward = np.maximum(hide_backward, consumer[1][None, :])
    return np.maximum(0, forward - hide_forward) + np.maximum(0, backward - hide_backward // 2)
