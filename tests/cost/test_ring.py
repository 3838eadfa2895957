"""torch's load-balanced ring attention (cost/ring.py) against a brute-force walk over query-key pairs."""

from __future__ import annotations

import pytest

from autoshard.cost.compute import causal_split_load
from autoshard.cost.ring import FP32, merge_bytes, ring_blocks, ring_load, ring_pairs


def chunks_of(device: int, parts: int, chunk: int) -> list[range]:
    """Token positions of a device's two chunks under torch's round-robin (head-tail) sharding."""
    return [range(c * chunk, (c + 1) * chunk) for c in (device, 2 * parts - 1 - device)]


def computed_pairs(rank: int, parts: int, chunk: int) -> list[tuple[int, int]]:
    """The (query, key) positions device ``rank``'s kernels compute, walking ``ring_blocks``: step
    ``i`` holds the keys of device ``(rank - i) mod p``; a causal kernel on a square block keeps a
    pair where the key's local index is at most the query's (``is_causal``, top-left)."""
    pairs = []
    queries = [t for r in chunks_of(rank, parts, chunk) for t in r]
    for i, (q_chunks, k_chunks, causal) in enumerate(ring_blocks(rank, parts)):
        source = [list(r) for r in chunks_of((rank - i) % parts, parts, chunk)]
        rows = queries if q_chunks == 2 else queries[chunk:]
        keys = source[0] + source[1] if k_chunks == 2 else source[0]
        for a, q in enumerate(rows):
            pairs += [(q, k) for b, k in enumerate(keys) if not causal or b <= a]
    return pairs


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("chunk", [1, 3])
def test_every_device_computes_exactly_its_visible_pairs(parts: int, chunk: int) -> None:
    """The ring's kernels compute each visible pair (key at or before the query) of the device's
    rows once and no hidden one, so its causal work is what the blocks say."""
    for rank in range(parts):
        pairs = computed_pairs(rank, parts, chunk)
        visible = {(q, k) for r in chunks_of(rank, parts, chunk) for q in r for k in range(q + 1)}
        assert len(pairs) == len(set(pairs)) and set(pairs) == visible
        # ring_pairs counts c^2 units, a causal block's half square without its diagonal
        assert len(pairs) == pytest.approx(ring_pairs(rank, parts) * chunk**2 + chunk)


@pytest.mark.parametrize("parts", [1, 2, 4, 8])
def test_load_balanced_ring_is_even_where_contiguous_rows_are_not(parts: int) -> None:
    """Head-tail chunks give every device the same causal work (load 1); contiguous query rows give
    the last device 2 - 1/p of its share (the brute-force count of the visible pairs it owns)."""
    seq = 2 * parts * 8
    busiest = max(sum(q + 1 for q in range(d * seq // parts, (d + 1) * seq // parts)) for d in range(parts))
    share = seq * (seq + 1) / 2 / parts
    assert ring_load(parts) == 1.0
    assert causal_split_load(parts) == pytest.approx(busiest / share, rel=2 / seq)


def test_merge_bytes_reads_and_writes_each_step_once() -> None:
    """Forward: bf16 -> fp32 of the first block, one merge per later block (read fp32 out, block out,
    write fp32 out), fp32 -> bf16 at the end; backward: three fp32 zero fills, per step three
    accumulations of a block's bf16 gradient into an fp32 buffer, three casts back."""
    e, p = 1000, 4
    forward = e * (2 + 4) + (p - 1) * e * (4 + 2 + 4) + e * (4 + 2)
    backward = 3 * e * 4 + p * 3 * e * (4 + 2 + 4) + 3 * e * (4 + 2)
    assert merge_bytes(e, p) == (forward, backward) == (42_000, 150_000)
    assert merge_bytes(e, 1) == (0, 0)
    assert merge_bytes(e, 2, itemsize=FP32)[0] == e * 8 + e * 12 + e * 8
    with pytest.raises(ValueError):
        ring_blocks(3, 3)
