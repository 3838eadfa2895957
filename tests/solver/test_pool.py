"""The edge-matrix and usage-vector pools (core/pool.py) against a brute-force reference: equal
contents share one entry whatever object, view or memory order holds them, and any difference (an
entry the sample misses, the dtype, the shape) keeps them apart."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.solver.core.pool import (POOLED_ENTRIES, POOLED_LENGTH, SAMPLE, _sample, content_keys, matrix_pool,
                                        vector_pool)


def _unsampled(m: np.ndarray) -> tuple[int, ...]:
    """A position of ``m`` that its cheap key does not read, so only the full comparison sees it."""
    marked = np.zeros(m.shape, dtype=np.int64)
    probe = np.arange(m.size, dtype=np.int64).reshape(m.shape)
    marked[np.isin(probe, np.frombuffer(_sample(probe), dtype=np.int64))] = 1
    return tuple(int(i) for i in np.argwhere(marked == 0)[0])


def random_matrices(rng: np.random.Generator) -> list[np.ndarray]:
    """Matrices drawn from a few bases as the solver meets them: the same object again, its
    transposed view, an equal copy in C or Fortran order, a copy off by one unsampled entry, the
    same values as int32 or reshaped, and small matrices equal to each other."""
    bases = [rng.integers(0, 3, size=shape, dtype=np.int64) for shape in [(64, 64), (64, 64), (80, 60), (60, 80)]]
    small = rng.integers(0, 3, size=(8, 8), dtype=np.int64)
    out: list[np.ndarray] = []
    for _ in range(40):
        b = bases[rng.integers(len(bases))]
        kind = rng.integers(8)
        if kind == 0:
            out.append(b)
        elif kind == 1:
            out.append(b.T)
        elif kind == 2:
            out.append(b.copy(order="C" if rng.random() < 0.5 else "F"))
        elif kind == 3:
            off = b.copy()
            off[_unsampled(off)] += 1 + rng.integers(2)
            out.append(off)
        elif kind == 4:
            out.append(b.astype(np.int32))
        elif kind == 5:
            out.append(b.reshape(b.shape[1], b.shape[0]))
        elif kind == 6:
            out.append(small if rng.random() < 0.5 else small.copy())
        else:
            out.append(b.T.copy())
    return out


def same_class(a: np.ndarray, b: np.ndarray) -> bool:
    """The reference: large, same dtype, same shape, same entries."""
    return (a.size >= POOLED_ENTRIES and a.dtype == b.dtype and a.shape == b.shape
            and bool((a == b).all()))


@pytest.mark.parametrize("seed", range(12))
def test_content_keys_join_exactly_the_equal_large_matrices(seed: int) -> None:
    matrices = random_matrices(np.random.default_rng(seed))
    keys = content_keys(matrices)
    for i, a in enumerate(matrices):
        for j, b in enumerate(matrices[:i]):
            assert (keys[i] == keys[j]) == same_class(a, b), (i, j)


@pytest.mark.parametrize("seed", range(12))
def test_matrix_pool_stores_each_class_once_and_reads_back_every_matrix(seed: int) -> None:
    matrices = random_matrices(np.random.default_rng(seed))
    pooled, moff = matrix_pool(matrices)
    assert pooled.dtype == np.int64 and moff.dtype == np.int64
    for i, m in enumerate(matrices):
        assert np.array_equal(pooled[moff[i]:moff[i] + m.size].reshape(m.shape), m)
        for j, b in enumerate(matrices[:i]):
            assert (moff[i] == moff[j]) == same_class(m, b), (i, j)
    first = {int(o): m.size for o, m in zip(moff, matrices)}
    assert len(pooled) == sum(first.values())


def test_a_difference_outside_the_sample_keeps_two_matrices_apart() -> None:
    a = np.zeros((128, 128), dtype=np.int64)
    b = a.copy()
    b[_unsampled(b)] = 1
    assert len(np.frombuffer(_sample(a), dtype=np.int64)) == SAMPLE and _sample(a) == _sample(b)
    assert content_keys([a, b, a.copy()]) == [0, 1, 0]


def test_an_empty_list_pools_to_nothing() -> None:
    pooled, moff = matrix_pool([])
    assert pooled.shape == (0,) and moff.shape == (0,)


@pytest.mark.parametrize("seed", range(4))
def test_vector_pool_stores_each_distinct_vector_once_and_reads_back_every_one(seed: int) -> None:
    """Against the reference (distinct contents by value): the same object, an equal copy, a
    strided view with equal entries, an int32 copy, and vectors one entry or one length apart."""
    rng = np.random.default_rng(seed)
    bases = [rng.integers(0, 4, size=n, dtype=np.int64) for n in (POOLED_LENGTH, POOLED_LENGTH, POOLED_LENGTH + 7)]
    bases.append(rng.integers(0, 4, size=POOLED_LENGTH - 1, dtype=np.int64))  # short: copied each time
    variants = [
        lambda b: b,
        lambda b: b.copy(),
        lambda b: np.repeat(b, 2)[::2],
        lambda b: b.astype(np.int32),
        lambda b: np.append(b, 0),
        lambda b: np.where(np.arange(len(b)) == rng.integers(len(b)), b + 1, b),
    ]
    vectors = [variants[rng.integers(len(variants))](bases[rng.integers(len(bases))]) for _ in range(30)]
    pooled, starts = vector_pool(vectors)
    for v, at in zip(vectors, starts.tolist()):
        assert np.array_equal(pooled[at:at + len(v)], v)
    distinct = {tuple(np.asarray(v).tolist()) for v in vectors if len(v) >= POOLED_LENGTH}
    assert len(pooled) == sum(len(d) for d in distinct) + sum(len(v) for v in vectors if len(v) < POOLED_LENGTH)
    assert vector_pool([])[0].size == 0
