"""Fold names that differ only in a layer number: ``model.layers.{0..31}.mlp.up_proj.weight``.

Large models repeat a block dozens of times; printing one line per copy buries what the plan does.
The layer number is the first dotted component that is an integer (``h.11.attn`` -> 11), so
expert indices deeper in a name stay apart (``layers.{0..3}.experts.7.w``).
"""

from __future__ import annotations

import re

_LAYER = re.compile(r"(^|\.)(\d+)(?=\.|$)")


def layer_key(name: str) -> tuple[str, int | None]:
    """``("model.layers.#.mlp", 3)`` for ``model.layers.3.mlp``; ``(name, None)`` without a layer number."""
    match = _LAYER.search(name)
    if match is None:
        return name, None
    return name[:match.start(2)] + "#" + name[match.end(2):], int(match.group(2))


def numbers_text(numbers: list[int]) -> str:
    """``{0..31}``, ``{0..4,6..31}`` or ``{1,3}``: sorted distinct numbers, runs of three or more as ranges."""
    values = sorted(set(numbers))
    parts, start = [], 0
    for k in range(1, len(values) + 1):
        if k == len(values) or values[k] != values[k - 1] + 1:
            run = values[start:k]
            parts += [f"{run[0]}..{run[-1]}"] if len(run) >= 3 else [str(v) for v in run]
            start = k
    return "{" + ",".join(parts) + "}"


def fold(names: list[str]) -> str:
    """One name with the layer numbers folded when three or more ``names`` differ only there, else them
    joined by ", " (two names read better written out)."""
    keys = [layer_key(name) for name in names]
    patterns = {pattern for pattern, _ in keys}
    if len(set(names)) < 3 or len(patterns) != 1 or any(number is None for _, number in keys):
        return ", ".join(dict.fromkeys(names))
    return keys[0][0].replace("#", numbers_text([number for _, number in keys if number is not None]), 1)


def fold_groups(names: list[str]) -> str:
    """Names folded per pattern (``model.layers.{0..31}, lm_head``), patterns in first-seen order."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(layer_key(name)[0], []).append(name)
    return ", ".join(fold(group) for group in groups.values())
