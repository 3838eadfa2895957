"""What the PyTorch-native export emits, as data: each mesh axis's role and the choices per block.

``lower.dtensor`` fills a :class:`NativeLayout` from a plan; ``lower.native_source`` renders it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoshard.lower.blocks import Units
from autoshard.lower.sequence import SequenceAxis
from autoshard.lower.tp_styles import Style

TP, DP, SP, REPLICA = "tp", "dp", "sp", "replica"


@dataclass
class NativeLayout:
    """What the export emits: each axis's role, the styles of the tensor-parallel axis and which model
    inputs it cuts to the rank's batch slice on entry (``PrepareModuleInput`` on the root), the axes
    ``fully_shard`` runs on, the memory units, the batch slices a rank's loss covers, the axis that
    splits the blocks by the sequence (``lower.sequence``), and notes."""

    roles: list[str]
    styles: dict[str, Style] = field(default_factory=dict)
    sliced_inputs: tuple[bool, ...] = ()
    fsdp_axes: list[int] = field(default_factory=list)
    units: Units | None = None
    loss_slices: int = 1
    sequence: SequenceAxis | None = None
    notes: list[str] = field(default_factory=list)
