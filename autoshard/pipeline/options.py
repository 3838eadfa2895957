"""The pipeline options searched: schedule, microbatch count, stages per device and layers per stage.

The enumeration is data for :mod:`autoshard.pipeline.search`; the claim it prints is an optimum
over exactly these options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from autoshard.errors import AutoshardError
from autoshard.pipeline.schedules import SCHEDULES, device_orders, timing
from autoshard.pipeline.stages import even_cuts


@dataclass(frozen=True)
class PipelineOption:
    """One point of the pipeline search space (``axis``: the mesh axis it pipelines, where the
    search spans several; schedule :data:`NO_PIPELINE`: the whole model on the whole mesh)."""

    schedule: str
    devices: int
    microbatches: int
    virtual: int
    counts: tuple[int, ...]
    axis: int | None = None

    @property
    def label(self) -> str:
        """E.g. ``1f1b, 8 stages, 32 microbatches, layers 15+16x6+15`` (``axis 0: ...`` when it names its axis)."""
        if self.schedule == NO_PIPELINE:
            return "no pipeline"
        stages = f"{self.devices}x{self.virtual} stages" if self.virtual > 1 else f"{self.devices} stages"
        where = f"axis {self.axis}: " if self.axis is not None else ""
        return f"{where}{self.schedule}, {stages}, {self.microbatches} microbatches, layers {_runs(self.counts)}"


NO_PIPELINE = "none"
"""The schedule of the option that does not pipeline (``pipeline/axes.py``)."""


def _runs(counts: Sequence[int]) -> str:
    """``15+16x6+15``: layer counts with repeats folded."""
    parts, k = [], 0
    while k < len(counts):
        j = k
        while j < len(counts) and counts[j] == counts[k]:
            j += 1
        parts.append(f"{counts[k]}x{j - k}" if j - k > 1 else str(counts[k]))
        k = j
    return "+".join(parts)


def microbatch_counts(devices: int, batch: int, given: Sequence[int] | None = None) -> list[int]:
    """The microbatch counts to search: ``given``, else the divisors of the batch from ``devices``
    (fewer leave a device idle) to ``4 devices`` (the bubble is then under a fifth of the step)."""
    counts = list(given) if given else [m for m in range(devices, 4 * devices + 1) if batch % m == 0]
    if not counts:
        raise AutoshardError(f"no microbatch count between {devices} and {4 * devices} divides the batch of {batch}: "
                             f"give --microbatches")
    bad = [m for m in counts if m < 1 or batch % m]
    if bad:
        raise AutoshardError(f"--microbatches {bad[0]} does not divide the batch of {batch}: use a divisor")
    return counts


def options_for(layers: int, devices: int, microbatches: Sequence[int], schedules: Sequence[str] = SCHEDULES,
                virtual: Sequence[int] = (2,), axis: int | None = None) -> list[PipelineOption]:
    """The enumerated options: each microbatch count with each schedule, interleaved with each count
    of ``virtual`` stages per device, and the cuts: even, or one layer fewer on the last stage
    (which holds the head) and one more in the middle; in order of :func:`schedule_overhead` (the
    search bounds options in this order and may not reach them all in its time: those whose
    schedule idles least come first; their bounds share the parts of their shortened devices
    whatever the order, ``layer_bound.py``)."""
    found = []
    for m in microbatches:
        for schedule in schedules:
            for v in (virtual if schedule == "interleaved-1f1b" else (1,)):
                if schedule == "interleaved-1f1b" and m % devices or devices * v > layers:
                    continue
                even = even_cuts(layers, devices * v)
                cuts = [even]
                if even[-1] > 1 and len(even) > 1:
                    lighter = list(even)
                    lighter[-1] -= 1
                    lighter[(len(lighter) - 1) // 2] += 1
                    cuts.append(tuple(lighter))
                found += [PipelineOption(schedule, devices, m, v, c, axis) for c in cuts]
    return sorted(found, key=schedule_overhead)


def schedule_overhead(option: PipelineOption) -> float:
    """The option's step over the step of its work spread evenly on its devices, where every layer
    takes the same time per token (its backward twice its forward) and nothing else takes any:
    what its schedule's bubble and its cuts' imbalance cost, from the schedule alone (at least 1)."""
    orders = device_orders(option.schedule, option.devices, option.microbatches, option.virtual)
    layers = sum(option.counts)
    forward = [count / (3 * layers * option.microbatches) for count in option.counts]
    return timing(orders, forward, [2 * f for f in forward]).step * option.devices


def stage_label(signature: tuple[tuple[int, ...], bool, bool]) -> str:
    """``layers 8+7 + head``: a device's layers per stage and the ends it holds."""
    counts, first, last = signature
    return f"layers {'+'.join(map(str, counts))}" + (" + embedding" if first else "") + (" + head" if last else "")


def on_stage_mesh(build: Mapping[str, Any], axis: int) -> dict[str, Any]:
    """Build options given on the whole mesh, restated on a stage's mesh (the axes other than the
    pipeline's ``axis``): ``expert_parallel`` and the mesh-axis digits of pinned specs renumbered."""
    def renumber(a: int, what: str) -> int:
        if a == axis:
            raise AutoshardError(f"{what} uses mesh axis {axis}, which carries the pipeline: name another axis "
                                 f"or pipeline over another one")
        return a - (a > axis)

    stage = dict(build)
    if build.get("expert_parallel") is not None:
        stage["expert_parallel"] = renumber(build["expert_parallel"], f"--expert-parallel {build['expert_parallel']}")
    stage["pins"] = {name: "".join(str(renumber(int(c), f"--pin {name}={text}")) if c.isdigit() else c for c in text)
                     for name, text in dict(build.get("pins") or {}).items()}
    return stage
