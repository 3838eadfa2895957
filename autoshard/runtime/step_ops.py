"""A reshard step as one rank runs it (:class:`Op`): the plan's ``reshard.Step`` with this
rank's place on the step's mesh axis. Both the collectives (``collectives.py``) and the padding
of uneven pieces around them (``uneven.py``) read it, so it lives below both."""

from __future__ import annotations

from dataclasses import dataclass

from autoshard.sharding.reshard import SLICE, Step


@dataclass(frozen=True)
class Op:
    """One reshard step as this rank runs it: the step, the devices along its axis, this rank's
    coordinate there and the registered name of the axis's process group (None for one device)."""

    step: Step
    size: int
    coord: int
    group: str | None

    @property
    def communicates(self) -> bool:
        """True for a collective over more than one device (a slice, or any step on one device, is local)."""
        return self.step.kind != SLICE and self.size > 1
