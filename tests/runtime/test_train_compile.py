"""``autoshard.train --compile``: the plan's program under torch.compile trains as it does eagerly.

The LLaMA example's Megatron plan on 2 forked gloo ranks, 3 steps of AdamW, eager and with
``--compile`` (inductor on CPU, ``ParallelModule.compile``: the per-rank GraphModule the plan is
lowered to, compiled whole): every step's loss within 1e-4 relative of the eager run's, and
dynamo compiled the program as one graph, without a break. The same check on 4 ranks (mesh
2x2) and 5 steps, which compiles for minutes on two cores, is ``benchmarks/runtime.py
--train-compile``; ``test_graph.py`` compiles programs with every feature the graph carries.
"""

from __future__ import annotations

import io

from autoshard.cli.train import quiet_dtensor_hints, train

from .dist import run_ranks
from .test_train import TOLERANCE, _args, _megatron, _with_plan, _worst


def _train(rank: int, world: int, training, compiled: bool) -> tuple[list[float], int, int]:
    import torch._dynamo.utils

    quiet_dtensor_hints()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    losses = train(_args("--steps", "3", *(["--compile"] if compiled else [])), training, rank, io.StringIO())
    counters = torch._dynamo.utils.counters
    return losses, counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def test_compiled_training_follows_eager_training() -> None:
    training = _with_plan("llama", _megatron("llama", "2"))
    eager = run_ranks(2, _train, training, False, timeout=300)
    compiled = run_ranks(2, _train, training, True, timeout=900)
    for (want, _, _), (got, graphs, breaks) in zip(eager, compiled):
        assert (graphs, breaks) == (1, 0), f"dynamo compiled {graphs} graphs with {breaks} breaks, not the program whole"
        assert _worst(got, want) <= TOLERANCE, (got, want)
