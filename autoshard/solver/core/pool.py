"""Edge matrices and usage vectors stored once per distinct content: a model's repeated layers share
their matrices and memory usages, and the flat arrays the compiled loops take point every sharing
edge (``matrix_pool``) and memory segment (``vector_pool``) at one copy.

Finding equal contents must cost far less than the search it feeds (a 1 s solve of a small LLaMA
holds hundreds of megabytes of matrices). So arrays are grouped by identity first (the problem
builder shares one matrix object between identical edges, and a transposed view is the same
memory), then by a cheap key (dtype, shape and a fixed sample of entries), and only arrays whose
cheap keys meet are compared in full (``np.array_equal``): no array is hashed whole.
"""

from __future__ import annotations

import hashlib

import numpy as np


def digest(array: np.ndarray) -> bytes:
    """A 16-byte digest of an array's dtype, shape and contents."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{array.dtype.str}{array.shape}".encode())
    h.update(np.ascontiguousarray(array).data)
    return h.digest()


POOLED_ENTRIES = 4096
"""Matrices of at least this many entries are stored once per distinct content; smaller ones are
copied as they come (comparing them costs more than storing them twice saves, and neighbourhood
search flattens small restricted cores several times a second)."""

SAMPLE = 256
"""Entries read from every large matrix for its cheap key."""

_STRIDE = 2_654_435_761
"""Multiplier spreading the sampled positions over a matrix (a prime near 2**32 / golden ratio)."""


def content_keys(matrices: list[np.ndarray]) -> list[int]:
    """Per matrix, a class number: two large matrices (``POOLED_ENTRIES`` entries or more) get the
    same number exactly when their dtypes, shapes and contents are equal; every small matrix gets a
    number of its own. Numbers count up from 0 in order of first appearance."""
    by_identity: dict[tuple[int, tuple[int, ...], tuple[int, ...], int], int] = {}
    by_sample: dict[tuple[str, tuple[int, ...], bytes], list[tuple[np.ndarray, int]]] = {}
    keys: list[int] = []
    classes = 0
    for m in matrices:
        if m.size < POOLED_ENTRIES:
            keys.append(classes)
            classes += 1
            continue
        seen = _identity(m)
        key = by_identity.get(seen)
        if key is None:
            bucket = by_sample.setdefault((m.dtype.str, m.shape, _sample(m)), [])
            key = next((k for rep, k in bucket if np.array_equal(rep, m)), None)
            if key is None:
                key, classes = classes, classes + 1
                bucket.append((m, key))
            by_identity[seen] = key
        keys.append(key)
    return keys


def matrix_pool(matrices: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(the matrices as int64, flattened row-major one after another, each input's offset into
    them): a large matrix whose contents were seen before (a model's repeated layers) is not
    stored again. Each stored matrix is copied once, straight into the result."""
    keys = content_keys(matrices)
    start: dict[int, int] = {}
    first: list[np.ndarray] = []
    moff = np.empty(len(matrices), dtype=np.int64)
    size = 0
    for k, (m, key) in enumerate(zip(matrices, keys)):
        if key not in start:
            start[key] = size
            first.append(m)
            size += m.size
        moff[k] = start[key]
    pooled = np.empty(size, dtype=np.int64)
    at = 0
    for m in first:
        pooled[at:at + m.size].reshape(m.shape)[...] = m
        at += m.size
    return pooled, moff


def _sample(m: np.ndarray) -> bytes:
    """``SAMPLE`` entries of ``m`` at positions fixed by its shape (spread over the row-major
    order, whatever ``m``'s strides): equal for equal contents."""
    positions = (np.arange(SAMPLE, dtype=np.uint64) * np.uint64(_STRIDE)) % np.uint64(m.size)
    return np.ascontiguousarray(m[np.unravel_index(positions.astype(np.int64), m.shape)]).tobytes()


def _identity(m: np.ndarray) -> tuple[int, tuple[int, ...], tuple[int, ...], int]:
    """What makes two arrays alive at once the same view of the same memory (shared edge matrices
    and their transposes), so a content already compared is not compared again."""
    return m.__array_interface__["data"][0], m.shape, m.strides, m.dtype.num


POOLED_LENGTH = 64
"""Vectors of at least this many entries are stored once per distinct content; shorter ones are
copied as they come (a digest per vector costs ~30 times the copy: neighbourhood search's small
restricted cores would pay it several times a second)."""


def vector_pool(vectors: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(the 1-D vectors as int64 one after another, each distinct content of ``POOLED_LENGTH`` or
    more entries once; each input's start in them). Long vectors are grouped by identity, then by
    a digest of their bytes, and a digest's match is confirmed in full (``np.array_equal``) before
    two vectors share their entries: a reduced core's nodes carry the memory segments of every
    node merged into them, the same in every repeated layer."""
    by_identity: dict[tuple[int, tuple[int, ...], tuple[int, ...], int], int] = {}
    by_digest: dict[bytes, list[tuple[np.ndarray, int]]] = {}
    first: list[np.ndarray] = []
    starts = np.empty(len(vectors), dtype=np.int64)
    size = 0
    for n, given in enumerate(vectors):
        if len(given) < POOLED_LENGTH:
            first.append(np.asarray(given, dtype=np.int64))
            starts[n], size = size, size + len(given)
            continue
        seen = _identity(given)  # the caller's arrays stay alive, so their addresses are not reused
        at = by_identity.get(seen)
        if at is None:
            v = np.asarray(given, dtype=np.int64)
            bucket = by_digest.setdefault(digest(v), [])
            at = next((start for rep, start in bucket if np.array_equal(rep, v)), None)
            if at is None:
                at, size = size, size + len(v)
                first.append(v)
                bucket.append((v, at))
            by_identity[seen] = at
        starts[n] = at
    pooled = np.concatenate(first) if first else np.zeros(0, dtype=np.int64)
    return pooled, starts
