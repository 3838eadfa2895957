"""Asynchronous tensor parallelism (``--async-tp``): activation collectives hidden under the matmul fused with them.

torch's async TP (the ``micro_pipeline_tp`` inductor pass, torch/_inductor/fx_passes/micro_pipeline_tp.py,
with ``enable_symm_mem_for_group``; torchtitan's ``--experimental.enable_async_tensor_parallel``,
which needs torch.compile) fuses an all-gather with the matmuls that consume its result
(``fused_all_gather_matmul``: ``_find_consumer_matmuls`` takes every matmul reading the gathered
tensor, run together chunk by chunk) and a reduce-scatter with the matmul that produces its input
(``fused_matmul_reduce_scatter``; their ``_scaled_mm`` forms under Float8): the matmuls run chunk
by chunk, each chunk's transfer under the previous chunk's product. A collective hides under the
matmuls it is fused with only, not under the ops on its other side. In the backward the
collective's reverse fuses with a matmul's input-gradient product, half its backward (a linear's
input and weight gradients are products of equal flops). Priced on every activation edge next to
a matmul: with ``F`` and ``B`` its forward and backward reshards, ``M`` and ``G`` the forward and
backward compute of the matmuls beside it (the producer's, or the consumers' with their forwards
summed, whichever hides more; 0 for other ops),

    cost(i, j) = max(0, F_ij - M_ij) + max(0, B_ij - G_ij / 2),   M_ij = max(fwd_src_i, fwd_dst_j),
                                                                  G_ij = max(bwd_src_i, bwd_dst_j).

A reshard shared by several readers (torchtitan's ``PrepareModuleInput``: one all-gather of a
module's input for wq, wk and wv, or for w1 and w3) reverses into one collective on the sum of
their input gradients. That sum is an add, no matmul's product (``_find_producer_matmul`` finds
none), so with more than one gradient ``writers`` the backward collective fuses with nothing and
is charged in full. A reshard of one reader (each edge's own, as this project's runtime runs
them) has one writer.

The chunked pipeline leaves the first chunk's transfer (or the last chunk's product) in the open,
1/n of it over n devices; that is not charged, so the rule is an upper bound on what is hidden.
Edges between other ops are charged in full, as without async TP.
"""

from __future__ import annotations

import numpy as np

MatmulTicks = tuple[np.ndarray, np.ndarray] | None
"""(forward, backward) compute ticks per strategy of a matmul, or of the matmuls reading one
gathered tensor (forwards summed); None for any other op."""


def exposed(forward: np.ndarray, backward: np.ndarray, producer: MatmulTicks, consumer: MatmulTicks,
            writers: int = 1) -> np.ndarray:
    """What an edge's forward and backward reshard matrices (producer x consumer strategies) leave
    exposed beside the matmuls fused with their collectives, ``producer`` or ``consumer``; with
    more than one gradient ``writers`` summed into the backward collective, all of the backward
    (module doc)."""
    hide_forward = np.zeros_like(forward)
    hide_backward = np.zeros_like(backward)
    if producer is not None:
        hide_forward = np.maximum(hide_forward, producer[0][:, None])
        hide_backward = np.maximum(hide_backward, producer[1][:, None])
    if consumer is not None:
        hide_forward = np.maximum(hide_forward, consumer[0][None, :])
        hide_backward = np.maximum(hide_backward, consumer[1][None, :])
    if writers > 1:
        hide_backward = np.zeros_like(backward)
    return np.maximum(0, forward - hide_forward) + np.maximum(0, backward - hide_backward // 2)
