"""A recomputed block (``Plan.recompute``) in the program: its own GraphModule, run under checkpointing.

The block's nodes, and the reshards of the edges into them, are lowered into a GraphModule of
their own (``lower.py``) whose arguments are the gathers its hidden edges had issued ahead in
the forward, then the values it reads from outside; it returns the values read outside it.
:class:`Recomputed` runs it under ``torch.utils.checkpoint`` (``recompute.run_recomputed``):
now, in the forward pass, and again inside the backward, in the ``recompute`` pass, where the
gathers issued ahead are not passed again (they are issued anew, a layer ahead in the backward,
``runtime/overlap.py``) and a selective block takes the reshards into its kept ops from its
forward (``Runtime.kept``). The gathers issued ahead reach the forward run through the closure,
not as checkpoint inputs, so the checkpoint does not keep them alive until the backward.

Without gradients the block simply runs. Under ``torch.compile`` it runs as
``checkpoint(block, *args)``, which the compiler turns into saved and recomputed values
(a selective block's node-level policy has no compiled form: it is recomputed whole there).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch.utils.checkpoint import checkpoint

from autoshard.runtime.collectives import FORWARD, RECOMPUTE
from autoshard.runtime.graph.calls import Named
from autoshard.runtime.graph.runtime import Runtime, compiling
from autoshard.runtime.recompute import run_recomputed


class Recomputed(Named):
    """One recomputed block: ``program(*ready, *inputs)`` under checkpointing (module doc)."""

    def __init__(self, program: fx.GraphModule, name: str, ready: int, runtime: Runtime) -> None:
        super().__init__("recomputed", name)
        self.program, self.ready, self.runtime = program, ready, runtime

    def __call__(self, *args: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.program(*args)
        if compiling():
            return checkpoint(self.program, *args, use_reentrant=False)
        rt = self.runtime
        held = list(args[:self.ready])
        kept: dict[str, torch.Tensor] = {}
        runs = 0

        def run(*inputs: Any) -> Any:
            nonlocal held, runs
            first = runs == 0
            runs += 1
            ready, held = (held if first else [None] * self.ready), []
            before = rt.phase, rt.kept
            rt.phase, rt.kept = (FORWARD if first else RECOMPUTE), kept
            try:
                return self.program(*ready, *inputs)
            finally:
                rt.phase, rt.kept = before

        return run_recomputed(run, args[self.ready:], rt.policy)
