"""Run a pipelined plan on torch.distributed: stages sharded by the executor, microbatches passed on.

Rank ``r`` of the mesh is pipeline device ``d`` (its coordinate on the pipeline axis) and runs
the stages ``d, d + p, ...`` of a pipeline of ``p`` devices (several: interleaved, as
torch.distributed.pipelining's ``ScheduleInterleaved1F1B`` places them), each stage's plan with
:class:`~autoshard.runtime.executor.ParallelModule` on the other axes. A training step splits the
batch into the option's microbatches and runs the device's actions in the schedule's order
(``pipeline/schedules.device_orders``: GPipe, 1F1B, interleaved 1F1B): a forward receives the
local pieces of what the stage before sends (point to point, between ranks with the same
coordinates on the other axes, in the layout both plans agree on, tagged by stage, microbatch
and tensor), runs the stage and sends its outputs on; a backward receives their gradients (or,
on the last stage, starts from the loss over the number of microbatches), runs autograd and
sends the received inputs' gradients back. Sends are asynchronous and waited for at the end of
the step; gradients accumulate over microbatches. A device that keeps its parameters gathered
(``runtime/kept.py``) gathers them before its first action and reduces their gradients after its
last, as the plan priced it. Every transfer is logged, so :meth:`PipelineRunner.transfers` can be
compared with what the plan charged (:func:`expected_transfers`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from autoshard.cost.memory import local_bytes
from autoshard.errors import AutoshardError
from autoshard.frontend.graph import NodeKind, OpGraph
from autoshard.pipeline.schedules import device_orders
from autoshard.pipeline.stages import shared_parameters, stage_layouts
from autoshard.problem.plan import Plan
from autoshard.runtime.executor import ParallelModule, parallelize
from autoshard.runtime.groups import MeshGroups
from autoshard.runtime.kept import KeptParameters, StageParameters, gathered_plan
from autoshard.sharding.mesh import Mesh
from autoshard.sharding.spec import TensorSpec

@dataclass(frozen=True)
class Transfer:
    """One point-to-point message: ``sent`` or ``received``, of tensor ``name``'s local piece
    (``forward``) or its gradient (``backward``)."""

    direction: str
    name: str
    phase: str
    nbytes: int


@dataclass
class _InFlight:
    received: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: list[torch.Tensor] = field(default_factory=list)


def expected_transfers(graph: OpGraph, plan: Plan, microbatches: int, first: bool, last: bool) -> list[Transfer]:
    """What a stage's plan charges per step: each received piece in, its gradient out, and (but
    on the last stage) each sent piece out, its gradient in, once per microbatch."""
    received, sent = stage_layouts(graph, plan)
    found = []
    for name, spec in received.items():
        nbytes = local_bytes(spec, graph[name].tensor, plan.mesh)
        found += [Transfer("received", name, "forward", nbytes), Transfer("sent", name, "backward", nbytes)]
    if not last:
        for name, spec in sent.items():
            nbytes = local_bytes(spec, graph[name].tensor, plan.mesh)
            found += [Transfer("sent", name, "forward", nbytes), Transfer("received", name, "backward", nbytes)]
    return sorted(found * microbatches, key=_order)


def _order(t: Transfer) -> tuple:
    return t.direction, t.name, t.phase, t.nbytes


class PipelineRunner:
    """This rank's stages of a pipelined plan and the schedule that drives them (collective to build).

    ``graphs`` and ``plans``: one per pipeline stage (``p * v`` of them, ``v`` stages per device);
    ``kept``: per device, whether it keeps its parameters gathered over the step."""

    def __init__(self, model: nn.Module, graphs: Sequence[OpGraph], plans: Sequence[Plan], mesh: Mesh, axis: int,
                 schedule: str, microbatches: int, input_names: Sequence[str],
                 kept: Sequence[bool] | None = None) -> None:
        p = mesh.shape[axis]
        if len(plans) != len(graphs) or not graphs or len(graphs) % p:
            raise AutoshardError(f"a pipeline over mesh axis {axis} of {mesh.label} needs a multiple of {p} stage "
                                 f"plans (one per stage), got {len(plans)} plans for {len(graphs)} stages")
        _check_boundaries(graphs, plans)
        self.groups, self.device, self.pipe_group = MeshGroups.stage(mesh, axis)
        self.mesh, self.axis, self.devices, self.virtual = mesh, axis, p, len(graphs) // p
        self.stage_ids = tuple(range(self.device, len(graphs), p))
        self.graphs = {s: graphs[s] for s in self.stage_ids}
        self.plans = {s: plans[s] for s in self.stage_ids}
        keep = bool(kept[self.device]) if kept is not None else False
        self.modules: dict[int, ParallelModule] = {}
        self.kept: list[KeptParameters] = []
        masters = []
        for s in self.stage_ids:
            master = parallelize(model, plans[s], self.groups, graph=graphs[s])
            masters.append(master)
            self.modules[s] = master
            if keep:
                gathered, moved = gathered_plan(plans[s], graphs[s])
                # checked as solved by the master's parallelize; its owner edges now leave the
                # gradient where the owner's backward puts it, which only KeptParameters reduces
                self.modules[s] = parallelize(model, gathered, self.groups, graph=graphs[s], validate=False)
                self.kept.append(KeptParameters(master, self.modules[s], moved, self.groups))
        self.module = StageParameters(masters, list(self.modules.values()))
        self.order = device_orders(schedule, p, microbatches, self.virtual)[self.device]
        self.microbatches, self.input_names = microbatches, list(input_names)
        self.layouts = {s: stage_layouts(graphs[s], plans[s]) for s in self.stage_ids}
        self.last_stage = len(graphs) - 1
        self.first, self.last = 0 in self.stage_ids, self.last_stage in self.stage_ids
        self.log: list[Transfer] = []
        self.loss_spec = self.modules[self.last_stage].output_specs[0] if self.last else None

    def first_rank_of(self, device: int) -> int:
        """The global rank of pipeline device ``device``'s first rank (coordinate 0 on the other axes)."""
        coords = [0] * self.mesh.ndim
        coords[self.axis] = device
        return self.mesh.rank(tuple(coords))

    def _rank_of_stage(self, stage: int) -> int:
        """The rank holding ``stage`` with this rank's coordinates on the other axes."""
        coords = list(self.mesh.coords(dist.get_rank()))
        coords[self.axis] = stage % self.devices
        return self.mesh.rank(tuple(coords))

    def _tag(self, stage: int, microbatch: int, backward: bool, index: int) -> int:
        """The point-to-point tag of tensor ``index`` that ``stage`` receives for ``microbatch``."""
        return ((stage * self.microbatches + microbatch) * 2 + backward) * 64 + index

    def _empty(self, stage: int, name: str, spec: TensorSpec) -> torch.Tensor:
        meta = self.graphs[stage][name].tensor
        return torch.empty(spec.local_shape(meta.shape, self.groups.mesh.shape), dtype=getattr(torch, meta.dtype))

    def step(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """One training step on the whole batch ``inputs`` (the model's inputs, then targets):
        gradients accumulate on :attr:`module`'s parameters; returns the last stage's local loss
        (the mean over microbatches), None elsewhere."""
        pieces = [torch.chunk(t, self.microbatches) for t in inputs]
        fed = [dict(zip(self.input_names, (p[i] for p in pieces))) for i in range(self.microbatches)]
        for stage in self.kept:
            stage.gather()
        held: dict[tuple[int, int], _InFlight] = {}
        pending: list[Any] = []
        total = None
        for action in self.order:
            key = (action.stage, action.microbatch)
            if action.kind == "F":
                held[key] = self._forward(action.stage, action.microbatch, fed[action.microbatch], pending)
            else:
                loss = self._backward(action.stage, action.microbatch, held.pop(key), pending)
                if loss is not None:
                    total = loss if total is None else total + loss
        for work in pending:
            work.wait()
        for stage in self.kept:
            stage.reduce()
        return total

    def _forward(self, stage: int, microbatch: int, fed: dict[str, torch.Tensor], pending: list[Any]) -> _InFlight:
        """Receive ``stage``'s inputs for ``microbatch``, run it and send its outputs on."""
        state = _InFlight()
        received, _ = self.layouts[stage]
        graph = self.graphs[stage]
        for k, (name, spec) in enumerate(received.items()):
            buffer = self._empty(stage, name, spec)
            dist.recv(buffer, self._rank_of_stage(stage - 1), tag=self._tag(stage, microbatch, False, k))
            self.log.append(Transfer("received", name, "forward", buffer.nbytes))
            state.received[name] = buffer.requires_grad_(graph[name].requires_grad)
        args = [state.received.get(n.name, fed.get(n.name)) for n in graph if n.kind == NodeKind.INPUT]
        out = self.modules[stage](*args)
        state.outputs = list(out) if isinstance(out, tuple) else [out]
        if stage != self.last_stage:
            sent = self.layouts[stage][1]
            for k, (name, value) in enumerate(zip(sent, state.outputs)):
                pending.append(dist.isend(value.detach().contiguous(), self._rank_of_stage(stage + 1),
                                          tag=self._tag(stage + 1, microbatch, False, k)))
                self.log.append(Transfer("sent", name, "forward", value.nbytes))
        return state

    def _backward(self, stage: int, microbatch: int, state: _InFlight, pending: list[Any]) -> torch.Tensor | None:
        """Run ``stage``'s backward for ``microbatch`` from its outputs' gradients (the last stage:
        from its loss over the microbatch count, which it returns) and send its inputs' gradients back."""
        loss = None
        if stage == self.last_stage:
            scaled = state.outputs[0] / self.microbatches
            scaled.backward()
            loss = scaled.detach()
        else:
            grads = []
            for k, (name, value) in enumerate(zip(self.layouts[stage][1], state.outputs)):
                buffer = torch.empty_like(value)
                dist.recv(buffer, self._rank_of_stage(stage + 1), tag=self._tag(stage, microbatch, True, k))
                self.log.append(Transfer("received", name, "backward", buffer.nbytes))
                grads.append(buffer)
            torch.autograd.backward(state.outputs, grads)
        for k, (name, value) in enumerate(state.received.items()):
            grad = value.grad if value.grad is not None else torch.zeros_like(value)
            pending.append(dist.isend(grad.contiguous(), self._rank_of_stage(stage - 1),
                                      tag=self._tag(stage - 1, microbatch, True, k)))
            self.log.append(Transfer("sent", name, "backward", grad.nbytes))
        return loss

    def transfers(self) -> list[Transfer]:
        """Every point-to-point message since construction (or :meth:`reset_log`), sorted."""
        return sorted(self.log, key=_order)

    def reset_log(self) -> None:
        """Forget the transfers so far, and the stages' collectives."""
        self.log.clear()
        self.module.reset_log()


def _check_boundaries(graphs: Sequence[OpGraph], plans: Sequence[Plan]) -> None:
    """Refuse stages whose receiver reads a tensor in another layout than its sender sends it in,
    and parameters stored on two stages (tied weights: their gradients are not exchanged)."""
    tied = shared_parameters(graphs)
    if tied:
        raise AutoshardError(f"parameters {', '.join(tied[:3])} are read on two pipeline stages (tied weights), "
                             f"which the pipeline does not synchronise: untie them or plan without --pipeline")
    for d in range(1, len(graphs)):
        received, _ = stage_layouts(graphs[d], plans[d])
        _, sent = stage_layouts(graphs[d - 1], plans[d - 1])
        if list(received) != list(sent):
            raise AutoshardError(f"stage {d} receives {list(received)} but stage {d - 1} sends {list(sent)}: "
                                 f"re-plan the pipeline")
        for name, spec in received.items():
            if sent[name] != spec:
                raise AutoshardError(f"stage {d} receives {name} as {spec} but stage {d - 1} sends it as "
                                     f"{sent[name]}: pin one layout for both (--pin {name}=...) and re-plan")
