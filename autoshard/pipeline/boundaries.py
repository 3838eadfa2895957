"""The tensors pipeline devices pass each other, and the layouts their plans pass them in.

A device's plan may have been solved on an alike device's graph (same layers per stage, same
ends): its received and returned tensors are matched by position and named as on the device's
own graph. Boundary tensors must leave and arrive in one layout; the search fixes every device's
to the layout the lead device (``search.py``) sends their kind (shape and dtype) in.
"""

from __future__ import annotations

from typing import Mapping

from autoshard.api import ModelSolution
from autoshard.frontend.graph import TensorMeta
from autoshard.pipeline.stages import Stage, stage_layouts, stage_outputs
from autoshard.sharding.spec import TensorSpec


def device_layouts(stage: Stage, solution: ModelSolution) -> tuple[dict[str, TensorSpec], dict[str, TensorSpec]]:
    """(received, returned) layouts of a device under ``solution``, which may have been solved on an
    alike device's graph: matched by position, named as on ``stage``."""
    got, gave = stage_layouts(solution.model_problem.graph, solution.plan)
    return dict(zip(stage.received, got.values())), dict(zip(stage_outputs(stage.graph), gave.values()))


def boundary_layouts(stage: Stage, solution: ModelSolution) -> dict[TensorMeta, TensorSpec]:
    """The layout a device (the lead) sends each kind (shape and dtype) of boundary tensor in."""
    sent = device_layouts(stage, solution)[1]
    return {stage.graph[name].tensor: sent[name] for name in stage.sent if stage.graph[name].tensor is not None}


def boundary_of(stage: Stage, layouts: Mapping[TensorMeta, TensorSpec]) -> dict[str, TensorSpec]:
    """The layouts ``stage`` receives and sends its boundary tensors in: those of their kind."""
    names = stage.received + (() if stage.last else stage.sent)
    return {name: layouts[stage.graph[name].tensor] for name in names if stage.graph[name].tensor in layouts}


def boundary_mismatches(stages: list[Stage], solutions: list[ModelSolution]) -> list[str]:
    """Tensors a device receives in another layout than its sender sends them in (``solutions[d]``:
    device ``d``'s, perhaps solved on an alike device's graph)."""
    received: dict[str, TensorSpec] = {}
    sent: dict[str, TensorSpec] = {}
    for stage, sol in zip(stages, solutions):
        got, gave = device_layouts(stage, sol)
        received |= got
        sent |= gave
    ndim = solutions[0].model_problem.mesh.ndim if solutions else 1
    return [f"{name} sent as {sent[name].format(ndim)}, received as {spec.format(ndim)}"
            for name, spec in received.items() if name in sent and sent[name] != spec]
