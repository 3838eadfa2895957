"""Cost models: what a resharding step costs, and whether local computation is charged.

All models return plain numbers in their ``unit``; :meth:`ticks` turns them into the integers the
solver works with (the solver core is exact integer arithmetic, like the IOPDDL format).

- ``alpha-beta`` (default), seconds: a collective on mesh axis a moving ``s`` bytes per device
  costs ``latency[a] + s / bandwidth[a]`` with ring traffic (see ``reshard.ring_bytes``):
  all-gather / reduce-scatter (n-1)/n·B, all-reduce 2(n-1)/n·B, all-to-all (n-1)/n²·B, where B
  is the size of the tensor not sharded on that axis. Local compute is the roofline of
  ``cost/compute.py`` on the model's ``device``. Ticks are picoseconds.
- ``slapo``, elements: Slapo's autoshard charges an edge by V = the product of the tensor's last
  two dims: all-reduce V, all-gather V/p, all-to-all V(1/p - 1/p²), reduce-scatter V/p, slice 0;
  compute is free. Ticks are elements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from autoshard.cost.devices import GENERIC, Device
from autoshard.cost.units import format_seconds
from autoshard.sharding.mesh import Mesh
from autoshard.sharding.reshard import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER, SLICE, Step, Traffic, ring_bytes


@dataclass(frozen=True)
class AlphaBetaCost:
    """Seconds from per-axis latency and bandwidth, plus the device's compute roofline."""

    mesh: Mesh
    device: Device = GENERIC
    name: str = "alpha-beta"
    unit: str = "s"
    ticks_per_unit: int = 10**12
    charges_compute: bool = True

    def step_cost(self, step: Step, shape: tuple[int, ...]) -> float:
        """Seconds for one resharding step of a tensor of global ``shape``."""
        return 0.0 if step.kind == SLICE else self.collective_cost(step.kind, step.axis, step.in_bytes, shape)

    def collective_cost(self, kind: str, axis: int, in_bytes: int, shape: tuple[int, ...]) -> float:
        """Seconds for one collective of ``kind`` on mesh axis ``axis`` entered with ``in_bytes``."""
        return self.mesh.latency[axis] + ring_bytes(kind, self.mesh.shape[axis], in_bytes) / self.mesh.bandwidth[axis]

    def traffic_cost(self, traffic: Traffic, shape: tuple[int, ...]) -> float:
        """Seconds for a reshard's collectives (``reshard_traffic``), summed in order as
        :meth:`step_cost` over its steps sums them."""
        return sum(self.collective_cost(kind, axis, in_bytes, shape) for kind, axis, in_bytes in traffic)

    def ticks(self, value: float | Fraction) -> int:
        """Integer solver cost (picoseconds)."""
        return round(value * self.ticks_per_unit)

    def format(self, ticks: int) -> str:
        """Human-readable cost."""
        return format_seconds(ticks / self.ticks_per_unit)


@dataclass(frozen=True)
class SlapoCost:
    """Slapo autoshard's element counts on the last two dims; computation is free."""

    mesh: Mesh
    device: Device = GENERIC
    name: str = "slapo"
    unit: str = "elements"
    ticks_per_unit: int = 1
    charges_compute: bool = False

    def step_cost(self, step: Step, shape: tuple[int, ...]) -> Fraction:
        """Elements charged for one resharding step of a tensor of global ``shape``."""
        return self.collective_cost(step.kind, step.axis, step.in_bytes, shape)

    def collective_cost(self, kind: str, axis: int, in_bytes: int, shape: tuple[int, ...]) -> Fraction:
        """Elements charged for one step of ``kind`` on mesh axis ``axis`` (its bytes aside)."""
        volume = Fraction(math.prod(shape[-2:]))
        p = self.mesh.shape[axis]
        if kind == ALL_REDUCE:
            return volume
        if kind in (ALL_GATHER, REDUCE_SCATTER):
            return volume / p
        if kind == ALL_TO_ALL:
            return volume * (Fraction(1, p) - Fraction(1, p * p))
        return Fraction(0)

    def traffic_cost(self, traffic: Traffic, shape: tuple[int, ...]) -> Fraction:
        """Elements charged for a reshard's collectives (``reshard_traffic``)."""
        return sum((self.collective_cost(kind, axis, in_bytes, shape) for kind, axis, in_bytes in traffic), Fraction(0))

    def ticks(self, value: float | Fraction) -> int:
        """Integer solver cost (elements)."""
        return round(value)

    def format(self, ticks: int) -> str:
        """Human-readable cost."""
        return str(ticks)


CostModel = AlphaBetaCost | SlapoCost
COST_MODELS = ("alpha-beta", "slapo")


def make_cost_model(name: str, mesh: Mesh, device: Device = GENERIC) -> CostModel:
    """The cost model called ``name`` on ``mesh`` of ``device``s."""
    if name == "slapo":
        return SlapoCost(mesh, device)
    if name == "alpha-beta":
        return AlphaBetaCost(mesh, device)
    raise ValueError(f"unknown cost model {name!r}")

