"""torch's ring attention (``context_parallel``) on one device: its causal work and its merge traffic.

torchtitan runs context parallelism through ``torch.distributed.tensor.experimental.context_parallel``
(``_attention.py``), whose defaults (``_ContextParallelOptions``: ``enable_load_balance=True``,
``rotate_method=ALL_GATHER``, ``convert_to_f32=True``) are what its published runs used. With load
balancing the sequence is cut into ``2p`` chunks of ``c`` tokens over ``p`` devices and device ``r``
holds chunks ``r`` and ``2p - 1 - r`` (its queries, keys and values). Attention then runs ``p``
flash kernels per pass (``_templated_ring_attention``), on the keys and values of device
``(r - i) mod p`` at step ``i``:

    step 0:             both local query chunks on both local key chunks, ``is_causal``;
    step i <= r:        both query chunks on the first key chunk (every pair visible);
    step i > r:         the second query chunk on both key chunks (every pair visible),

so every device computes ``2 c^2`` query-key pairs a step, ``2 p c^2`` in all: an even share of
the causal square ``(2 p c)^2 / 2``, where query rows split into ``p`` contiguous blocks leave the
last device ``2 - 1/p`` times its share (``cost/compute.py``: ``causal_split_load``). Each later
step's output is merged into the running one by its log-sum-exp in fp32 (``_SDPAMerger``), and the
backward accumulates the query's and the travelling keys' and values' gradients in fp32
(``_templated_ring_attention_backward``); ``merge_bytes`` counts that HBM traffic as one fused pass
per step (inductor fuses the pointwise merge of a compiled block).

The keys and values reach a device by one all-gather per pass (``_AllGatherRotater``), but their
gradients travel the ring: after every backward step the device sends its fp32 key and value
gradient buffers to the next rank (``dkv_rotater``, always ``ALL_TO_ALL``: ``permute_tensor``), ``p``
exchanges of ``2 E`` fp32 elements for keys and values of ``E`` local elements each
(``gradient_ring_bytes``). Under torch.compile the ring is traced into the block's graph, where
each functional collective is awaited where it is issued (``_maybe_wrap_tensor``: ``wait_tensor``
at once while tracing; inductor moves no wait unless ``reorder_for_compute_comm_overlap``, off by
default), so every exchange is exposed; eagerly each overlaps the next step's kernel
(``gradient_ring_seconds``).
"""

from __future__ import annotations

FP32 = 4
"""Bytes of an fp32 element: the merged output and the accumulated gradients (``convert_to_f32``)."""


def ring_blocks(rank: int, parts: int) -> list[tuple[int, int, bool]]:
    """The (query chunks, key chunks, causal) of each of device ``rank``'s ``parts`` kernels of one
    pass, chunks of ``S / 2 parts`` tokens, as ``_templated_ring_attention`` runs them (module doc)."""
    if not 0 <= rank < parts:
        raise ValueError(f"rank {rank} outside a ring of {parts}")
    return [(2, 2, True)] + [(2, 1, False) if i <= rank else (1, 2, False) for i in range(1, parts)]


def ring_pairs(rank: int, parts: int) -> float:
    """Query-key pairs device ``rank`` computes in one pass, in units of ``c^2`` (a causal block
    computes half its square, the kernel skipping what its mask hides)."""
    return sum(q * k / (2 if causal else 1) for q, k, causal in ring_blocks(rank, parts))


def ring_load(parts: int) -> float:
    """The busiest device's causal attention work over an even share of the causal square under
    torch's load-balanced ring (1: every device computes ``2 parts`` of the ``2 parts^2`` units)."""
    share = (2 * parts) ** 2 / 2 / parts
    return max(ring_pairs(r, parts) for r in range(parts)) / share


def merge_bytes(elements: int, parts: int, itemsize: int = 2) -> tuple[int, int]:
    """(forward, backward) HBM bytes of the ring's merges on one device, for an attention whose local
    query, key, value and output each hold ``elements`` elements of ``itemsize`` bytes (keys and
    values repeated to the query heads, as torchtitan's LLaMA passes them). Forward: the first
    block's output kept in fp32, each later block's merged into it (read the fp32 output, the block's,
    write the fp32 output) and the result cast back. Backward: fp32 zeros for the three gradients;
    each step adds the block's query gradient into its fp32 accumulator and the key and value
    gradients into the fp32 buffer that travels on (read it and the block's, write it); the query
    and the arriving key and value gradients cast back at the end."""
    if parts < 2:
        return 0, 0
    cast_in, cast_out = elements * (itemsize + FP32), elements * (FP32 + itemsize)
    merge = elements * (FP32 + itemsize + FP32)
    forward = cast_in + (parts - 1) * merge + cast_out
    zeros = 3 * elements * FP32
    step = 3 * merge  # the query's accumulator and the travelling key and value buffers
    backward = zeros + parts * step + 3 * cast_out
    return forward, backward


def gradient_ring_bytes(elements: int, parts: int) -> int:
    """Bytes one device sends in a backward's ring of key and value gradients, for keys and values of
    ``elements`` local elements each: ``parts`` exchanges of both fp32 buffers, ``parts * 2 E * 4``
    (0 on one device, which runs no ring)."""
    return 0 if parts < 2 else parts * 2 * elements * FP32


def gradient_ring_seconds(elements: int, parts: int, latency: float, bandwidth: float,
                          hidden_under: float | None) -> float:
    """Exposed seconds of that ring on a link of ``latency`` s and ``bandwidth`` bytes/s, each exchange
    taking ``t = latency + 8 E / bandwidth``. Traced (``hidden_under`` None: each exchange awaited where
    it is issued): ``p t``. Eager: the exchange sent after step ``i`` is awaited after step ``i + 1``'s
    kernel of ``hidden_under`` seconds, the last one after the loop: ``(p - 1) max(0, t - h) + t``."""
    if parts < 2:
        return 0.0
    exchange = latency + gradient_ring_bytes(elements, parts) / parts / bandwidth
    if hidden_under is None:
        return parts * exchange
    return (parts - 1) * max(0.0, exchange - hidden_under) + exchange
