"""A pipelined plan as data: the chosen option and one stage plan per group of alike devices.

Alike devices (same layers per stage, same ends) share one solved plan, made on the graph of the
first of them; :meth:`PipelinePlan.device_plans` carries it onto every device's own graph, node by
node in graph order (the graphs differ only in their names: ``layers.3`` against ``layers.11``).
The file is what ``autoshard.solve --pipeline --out`` writes and :mod:`autoshard.runtime.pipeline`
runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from autoshard import specs
from autoshard.errors import AutoshardError
from autoshard.frontend.graph import OpGraph
from autoshard.pipeline.stages import Stage
from autoshard.problem.identity import renamed
from autoshard.problem.plan import Plan
from autoshard.sharding.mesh import Mesh


@dataclass
class PipelinePlan:
    """The option (schedule, microbatches, stages per device, layers per stage) on ``mesh`` with
    the pipeline over ``axis``, its step and bound (seconds), and ``groups``: (devices, plan,
    whether those devices keep their parameters gathered over the step's microbatches)."""

    mesh: Mesh
    axis: int
    schedule: str
    microbatches: int
    virtual: int
    counts: tuple[int, ...]
    step: float
    lower_bound: float
    proved: bool
    groups: list[tuple[list[int], Plan, bool]]

    def to_json(self) -> dict:
        """Plain JSON data (the stage plans in :meth:`Plan.to_json`'s form)."""
        return {"pipeline": {"mesh": self.mesh.to_json(), "axis": self.axis, "schedule": self.schedule,
                             "microbatches": self.microbatches, "virtual_stages": self.virtual,
                             "layers_per_stage": list(self.counts), "step_seconds": self.step,
                             "lower_bound_seconds": self.lower_bound, "proved": self.proved},
                "devices": [{"devices": devices, "plan": plan.to_json(), "keep_gathered": kept}
                            for devices, plan, kept in self.groups]}

    @staticmethod
    def from_json(data: dict, source: str = "plan file") -> "PipelinePlan":
        """Inverse of :meth:`to_json`; a malformed file (one that breaks specs/plan.schema.json, or whose
        stage plans are malformed) raises :class:`AutoshardError` naming the field."""
        if not isinstance(data, dict) or "pipeline" not in data:
            raise AutoshardError(f"{source} is not a pipelined plan (it has no 'pipeline' field): re-create it "
                                 f"with autoshard.solve --pipeline --out")
        if wrong := specs.problem(data, specs.PLAN_SCHEMA):
            raise AutoshardError(f"{source} is malformed ({wrong}): re-create it with autoshard.solve --pipeline --out")
        head = data["pipeline"]
        groups = [(list(g["devices"]), Plan.from_json(g["plan"], source), bool(g.get("keep_gathered", False)))
                  for g in data["devices"]]
        return PipelinePlan(Mesh.from_json(head["mesh"]), head["axis"], head["schedule"], head["microbatches"],
                            head["virtual_stages"], tuple(head["layers_per_stage"]), float(head["step_seconds"]),
                            float(head["lower_bound_seconds"]), head["proved"], groups)

    def save(self, path: str | Path) -> None:
        """Write the plan as JSON, checked against specs/plan.schema.json first (as :meth:`Plan.save`)."""
        data = self.to_json()
        if wrong := specs.problem(data, specs.PLAN_SCHEMA):
            raise ValueError(f"the pipelined plan breaks specs/plan.schema.json ({wrong}): the writer and the "
                             f"schema disagree")
        Path(path).write_text(json.dumps(data, indent=1))

    @staticmethod
    def load(path: str | Path) -> "PipelinePlan":
        """Read a file :meth:`save` wrote."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise AutoshardError(f"plan file {str(path)!r} cannot be read ({exc}): re-create it") from None
        return PipelinePlan.from_json(data, f"plan file {str(path)!r}")

    def kept(self, device: int) -> bool:
        """Whether pipeline device ``device`` keeps its parameters gathered over the step."""
        return next(kept for devices, _, kept in self.groups if device in devices)

    def device_plans(self, stages: Sequence[Stage]) -> list[Plan]:
        """Every device's plan on its own graph (``stages``: the model cut under this option)."""
        by_device: dict[int, tuple[int, Plan]] = {}
        for devices, plan, _ in self.groups:
            for d in devices:
                by_device[d] = (devices[0], plan)
        if sorted(by_device) != list(range(len(stages))):
            raise AutoshardError(f"the plan covers pipeline devices {sorted(by_device)}, the mesh has "
                                 f"{len(stages)}: re-plan for this mesh")
        return [relabel(plan, stages[first].graph, stages[d].graph) for d, (first, plan) in sorted(by_device.items())]


def relabel(plan: Plan, source: OpGraph, target: OpGraph) -> Plan:
    """``plan``, made for ``source``, on ``target``: the same nodes in the same order under other
    names (and parameters under other dotted names)."""
    if source is target:
        return plan
    src, dst = list(source), list(target)
    if [(n.kind, n.op, n.out) for n in src] != [(n.kind, n.op, n.out) for n in dst]:
        raise AutoshardError("pipeline devices that share a plan differ in their graphs: re-plan the pipeline")
    name = {a.name: b.name for a, b in zip(src, dst)}
    qualname = {a.qualname: b.qualname for a, b in zip(src, dst) if a.qualname}
    return renamed(plan, name, target, qualname)
