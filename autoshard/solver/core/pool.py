"""Edge matrices stored once per distinct content: a model's repeated layers share their matrices,
and the flat arrays the compiled loops take (the core's, TRW-S's) point every sharing edge at one copy."""

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
copied as they come (hashing them costs more than it saves, and neighbourhood search flattens
small restricted cores several times a second)."""


def content_keys(matrices: list[np.ndarray]) -> list[object]:
    """Per matrix, a key equal for equal contents where it pays to find them: a large matrix's
    digest (computed once per array or view of it: repeated layers share their matrices), a small
    matrix's own position (hashing it costs more than storing it twice saves)."""
    by_identity: dict[tuple[int, tuple[int, ...], tuple[int, ...], int], bytes] = {}
    keys: list[object] = []
    for k, m in enumerate(matrices):
        if m.size < POOLED_ENTRIES:
            keys.append(k)
            continue
        seen = _identity(m)
        if seen not in by_identity:
            by_identity[seen] = digest(m)
        keys.append(by_identity[seen])
    return keys


def matrix_pool(matrices: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(the int64 matrices flattened row-major one after another, each input's offset into them): a large
    matrix whose contents were seen before (a model's repeated layers) is not stored again."""
    start: dict[object, int] = {}
    pieces: list[np.ndarray] = []
    moff = np.empty(len(matrices), dtype=np.int64)
    size = 0
    for k, (m, key) in enumerate(zip(matrices, content_keys(matrices))):
        if key not in start:
            start[key] = size
            pieces.append(np.ascontiguousarray(m).ravel())
            size += m.size
        moff[k] = start[key]
    return (np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, dtype=np.int64)), moff


def _identity(m: np.ndarray) -> tuple[int, tuple[int, ...], tuple[int, ...], int]:
    """What makes two arrays alive at once the same view of the same memory (shared edge matrices
    and their transposes), so a content already hashed is not hashed again."""
    return m.__array_interface__["data"][0], m.shape, m.strides, m.dtype.num
