"""The all-to-all exchanges of an expert-parallel op: what is sent, as the plan lists and the cost model prices it.

A strategy with ``exchange_axis`` a (``rules_moe.exchange_variants``) sends each token-expert
pair's row from the device holding the token to the device holding the expert, along a, and
the result back. One forward runs, in this order (``runtime/experts.py``):

1. ``counts``: all_to_all of the number of rows for each (destination, expert of that
   destination): ``n * E_l`` int64 per device, deterministic;
2. ``dispatch``: all_to_all_single of the rows (``H`` values each), split sizes from the counts;
3. ``combine``: the expert outputs back, the split sizes reversed.

Backward runs the gradients of ``combine`` then ``dispatch`` (same sizes, no counts). The row
counts depend on the routing, so the plan prices them under **balanced routing with a capacity
factor** c: a device holding ``T_l`` tokens of top-``k`` routing, in an exchange group of ``n``
devices holding ``n * E_l`` of the ``E`` experts, has ``R = k * T_l * n * E_l / E`` pairs for the
group, and its buffer holds ``ceil(c * R)`` rows of ``H * itemsize`` bytes; an all-to-all sends
``(n - 1) / n`` of it (the rows for its own experts stay). With c = 1 every device sends and
receives exactly its share; c > 1 charges the headroom imbalanced routing needs (the slowest
device sets the step time). The executed bytes are the routing's own (``routed``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from autoshard.sharding.reshard import ALL_TO_ALL, Step
from autoshard.sharding.spec import TensorSpec

COUNT_BYTES = 8
"""Bytes of one exchanged row count (int64)."""


@dataclass(frozen=True)
class Exchange:
    """One all-to-all of an expert-parallel op over mesh axis ``axis``.

    ``in_bytes`` is this device's buffer (for ``routed`` exchanges the planned one: balanced
    routing times the capacity factor); ``phase`` is ``forward`` or ``backward``.
    """

    what: str
    phase: str
    axis: int
    in_bytes: int
    routed: bool

    def sent_bytes(self, axis_size: int) -> int:
        """Bytes this device sends: all but its own 1/n of the buffer."""
        return (axis_size - 1) * self.in_bytes // axis_size

    def step(self) -> Step:
        """The exchange as an all-to-all step of its buffer (rows x values), for the cost model."""
        rows = TensorSpec(((self.axis,), ()))
        return Step(ALL_TO_ALL, self.axis, 0, 0, self.in_bytes, rows, rows)


def balanced_rows(tokens: int, top_k: int, experts: int, local_experts: int, group: int, capacity: float) -> int:
    """Rows one device sends into its exchange group under balanced routing, with the capacity factor."""
    pairs = tokens * top_k * group * local_experts / experts
    return math.ceil(capacity * pairs - 1e-9)


def expert_exchanges(hidden: Sequence[int], itemsize: int, top_k: int, experts: int, local_experts: int,
                     axis: int, axis_size: int, capacity: float, backward: bool) -> tuple[Exchange, ...]:
    """The exchanges of one expert-parallel op, in execution order.

    ``hidden`` is the local [tokens, H] shape of the op's token input, ``local_experts`` how many
    experts each device holds, ``axis``/``axis_size`` the exchange axis.
    """
    rows = balanced_rows(hidden[0], top_k, experts, local_experts, axis_size, capacity)
    row_bytes = rows * hidden[1] * itemsize
    result = [Exchange("counts", "forward", axis, axis_size * local_experts * COUNT_BYTES, False),
              Exchange("dispatch", "forward", axis, row_bytes, True),
              Exchange("combine", "forward", axis, row_bytes, True)]
    if backward:
        result += [Exchange("combine", "backward", axis, row_bytes, True),
                   Exchange("dispatch", "backward", axis, row_bytes, True)]
    return tuple(result)
