"""What a lowered program's calls share while it runs eagerly.

The program (``runtime/graph/lower.py``) is the same for every pass; what differs between a
forward and the recomputation of a block inside the backward, or between eager and compiled
runs, is read here at run time: the collective logs by edge label, the pass the forward steps
are logged in, the reshards a selective block keeps from its forward for its recomputation,
the selective policy, and the backward's overlap (``runtime/overlap.py``). Under
``torch.compile`` the calls take their plain path and read none of it (``compiling``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from autoshard.runtime.collectives import FORWARD, CommLog
from autoshard.runtime.overlap import Overlap
from autoshard.runtime.recompute import KeptOps


def compiling() -> bool:
    """True while dynamo traces the program (the compiled graph carries no Python state)."""
    return torch.compiler.is_compiling()


@dataclass
class Runtime:
    """One parallel module's run-time state (module doc)."""

    logs: dict[str, CommLog] = field(default_factory=dict)
    phase: str = FORWARD
    kept: dict[str, torch.Tensor] | None = None
    policy: KeptOps | None = None
    overlap: Overlap | None = None

    def log(self, label: str) -> CommLog | None:
        """The log of ``label``'s collectives (None: not logged)."""
        return self.logs.get(label)
