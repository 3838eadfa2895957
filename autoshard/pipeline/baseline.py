"""torchtitan's pipelined recipes costed in our model (``--baseline torchtitan`` with ``--pipeline``).

torchtitan's 3-D runs (pytorch/torchtitan ``benchmarks/llama3_h100_202412_torchtitan.md``, Table
5: LLaMA-3.1-405B on FSDP 8 x TP 8 x PP 8, torchtitan at 9dec370) pipeline the layers over the
outer axis with its defaults of that commit: as many microbatches as pipeline devices
(``pipeline_parallel_microbatches`` unset: the PP degree), splits from ``generate_split_points``
(even, the remainder to the middle stages: ``even_cuts``), two stages per device for looped
schedules, and under PP every block's FSDP2 ``reshard_after_forward=False`` (parameters kept
gathered over the step's microbatches). Every stage is sharded with its FSDP + TP plan
(``problem/baselines/torchtitan.py``) on the other axes. Here each device's problem is the one
our search solves for the same option, so the two steps are comparable: the same stage graphs,
the same in-flight memory, the same critical path.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoshard.pipeline.options import PipelineOption
from autoshard.pipeline.stages import even_cuts
from autoshard.pipeline.search import PipelineSearch
from autoshard.problem.baselines.torchtitan import torchtitan_choice


@dataclass(frozen=True)
class BaselineStep:
    """torchtitan's plan under one option: its step, its fullest device's live peak and whether
    every device stays within the memory budget."""

    option: PipelineOption
    step: float
    peak: int
    fits: bool


def torchtitan_pipeline(engine: PipelineSearch, option: PipelineOption) -> BaselineStep:
    """torchtitan's FSDP + TP plan on every device of ``option``'s pipeline (the devices after the
    first pass their tensors in the layouts the first sends in, as the search's do)."""
    searched = engine.evaluate(option, bounded=True, recipe=torchtitan_choice)
    peak = max(s.solution.peak or 0 for s in searched.solutions.values())
    return BaselineStep(option, searched.step, peak, searched.fits)


def torchtitan_options(layers: int, devices: int, batch: int) -> list[PipelineOption]:
    """torchtitan's pipelined runs: as many microbatches as pipeline devices, even cuts, 1F1B and
    interleaved 1F1B with two stages per device (none where the devices do not divide the batch,
    which torchtitan refuses)."""
    if batch % devices:
        return []
    m = devices
    found = [PipelineOption("1f1b", devices, m, 1, even_cuts(layers, devices))]
    if m % devices == 0 and 2 * devices <= layers:
        found.append(PipelineOption("interleaved-1f1b", devices, m, 2, even_cuts(layers, 2 * devices)))
    return found
