"""Asynchronous tensor parallelism (``--async-tp``): activation collectives hidden under the matmuls beside them.

torch's async TP (``torch._inductor`` micro-pipeline TP pass, ``enable_symm_mem_for_group``;
torchtitan's ``--experimental.enable_async_tensor_parallel``, which needs torch.compile) splits
the all-gather in front of a column-parallel matmul and the reduce-scatter behind a row-parallel
one into chunks over symmetric memory, each chunk's transfer running while the matmul works on
the previous chunk. Priced on every activation edge next to a matmul: with ``F`` and ``B`` its
forward and backward reshards, and the adjacent matmuls' own forward and backward compute
(``fwd_src + fwd_dst``, ``bwd_src + bwd_dst``, where the producer or the consumer is a matmul,
else 0), the edge is charged what they cannot hide,

    cost(i, j) = max(0, F_ij - fwd_src_i - fwd_dst_j) + max(0, B_ij - bwd_src_i - bwd_dst_j).

Edges between other ops are charged in full, as without it.
"""

from __future__ import annotations

import numpy as np

MatmulTicks = tuple[np.ndarray, np.ndarray] | None
"""(forward, backward) compute ticks per strategy of a matmul; None for any other op."""


def exposed(forward: np.ndarray, backward: np.ndarray, producer: MatmulTicks, consumer: MatmulTicks) -> np.ndarray:
    """What an edge's forward and backward reshard matrices (producer x consumer strategies) leave
    exposed next to the matmuls ``producer`` and ``consumer`` (module doc)."""
    hide_forward = np.zeros_like(forward)
    hide_backward = np.zeros_like(backward)
    if producer is not None:
        hide_forward = hide_forward + producer[0][:, None]
        hide_backward = hide_backward + producer[1][:, None]
    if consumer is not None:
        hide_forward = hide_forward + consumer[0][None, :]
        hide_backward = hide_backward + consumer[1][None, :]
    return np.maximum(0, forward - hide_forward) + np.maximum(0, backward - hide_backward)
