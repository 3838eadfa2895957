"""Byte quantities as users write them (``16GiB``, ``512MB``, ``1e9``) and back."""

from __future__ import annotations

import re

from autoshard.errors import AutoshardError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``16GiB`` -> 17179869184; plain numbers are bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in _UNITS:
        raise AutoshardError(f"memory size {text!r} is not a number with an optional unit (B, KB, MB, GB, KiB, MiB, GiB)")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def format_bytes(n: float) -> str:
    """Binary units, three significant digits: 1.5 GiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def format_seconds(seconds: float) -> str:
    """``1.234 ms``: four significant digits in the largest unit that keeps one before the point."""
    if seconds == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-12:.4g} ps"
