"""``autoshard.train --compile``: the parallel module under torch.compile trains as it does eagerly.

The LLaMA example's Megatron plan on 2 forked gloo ranks, 3 steps of AdamW, eager and with
``--compile`` (inductor on CPU): every step's loss within 1e-4 relative of the eager run's, and
dynamo compiled graphs of it (the flag is not a no-op). The same command on 4 ranks (2x2) and 5
steps is in the README; it is slower than the test budget on two cores.
"""

from __future__ import annotations

import io

from autoshard.cli.train import quiet_dtensor_hints, train

from .dist import run_ranks
from .test_train import TOLERANCE, _args, _megatron, _with_plan, _worst


def _train(rank: int, world: int, training, compiled: bool) -> tuple[list[float], int]:
    import torch._dynamo.utils

    quiet_dtensor_hints()
    torch._dynamo.reset()
    losses = train(_args("--steps", "3", *(["--compile"] if compiled else [])), training, rank, io.StringIO())
    return losses, torch._dynamo.utils.counters["stats"]["unique_graphs"]


def test_compiled_training_follows_eager_training() -> None:
    training = _with_plan("llama", _megatron("llama", "2"))
    eager = run_ranks(2, _train, training, False, timeout=300)
    compiled = run_ranks(2, _train, training, True, timeout=600)
    for (want, _), (got, graphs) in zip(eager, compiled):
        assert graphs > 0, "torch.compile compiled nothing"
        assert _worst(got, want) <= TOLERANCE, (got, want)
