"""Run a pipelined plan on torch.distributed: stages sharded by the executor, microbatches passed on.

Rank ``r`` of the mesh is pipeline device ``d`` (its coordinate on the pipeline axis) and runs
its stage's plan with :class:`~autoshard.runtime.executor.ParallelModule` on the other axes. A
training step splits the batch into the option's microbatches and runs the device's actions in
the schedule's order (``pipeline/schedules.device_orders``, the order torch's
``Schedule1F1B``/``ScheduleGPipe`` also run): a forward receives the local pieces of what the
stage before sends (point to point, between ranks with the same coordinates on the other axes,
in the layout both plans agree on), runs the stage and sends its outputs on; a backward
receives their gradients (or, on the last stage, starts from the loss over the number of
microbatches), runs autograd and sends the received inputs' gradients back. Sends are
asynchronous and waited for at the end of the step; gradients accumulate over microbatches.
Every transfer is logged, so :meth:`PipelineRunner.transfers` can be compared with what the
plan charged (:func:`expected_transfers`). One stage per device (GPipe, 1F1B) runs;
interleaved stages are planned and costed, not run.
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
    """This rank's stage of a pipelined plan and the schedule that drives it (collective to build)."""

    def __init__(self, model: nn.Module, graphs: Sequence[OpGraph], plans: Sequence[Plan], mesh: Mesh, axis: int,
                 schedule: str, microbatches: int, input_names: Sequence[str]) -> None:
        if len(graphs) != mesh.shape[axis] or len(plans) != len(graphs):
            raise AutoshardError(f"a pipeline over mesh axis {axis} of {mesh.label} needs {mesh.shape[axis]} stage "
                                 f"plans, got {len(plans)}: one per stage, interleaved stages are not run")
        _check_boundaries(graphs, plans)
        self.groups, self.device, self.pipe_group = MeshGroups.stage(mesh, axis)
        self.mesh, self.axis, self.devices = mesh, axis, mesh.shape[axis]
        self.graph, self.plan = graphs[self.device], plans[self.device]
        self.module: ParallelModule = parallelize(model, self.plan, self.groups, graph=self.graph)
        self.order = device_orders(schedule, self.devices, microbatches)[self.device]
        self.microbatches, self.input_names = microbatches, list(input_names)
        self.received, self.sent = stage_layouts(self.graph, self.plan)
        self.first, self.last = self.device == 0, self.device == self.devices - 1
        self.log: list[Transfer] = []
        self.loss_spec = self.module.output_specs[0] if self.last else None

    def first_rank_of(self, device: int) -> int:
        """The global rank of pipeline device ``device``'s first rank (coordinate 0 on the other axes)."""
        coords = [0] * self.mesh.ndim
        coords[self.axis] = device
        return self.mesh.rank(tuple(coords))

    def _neighbour(self, step: int) -> int:
        coords = list(self.mesh.coords(dist.get_rank()))
        coords[self.axis] += step
        return self.mesh.rank(tuple(coords))

    def _empty(self, name: str, spec: TensorSpec) -> torch.Tensor:
        meta = self.graph[name].tensor
        return torch.empty(spec.local_shape(meta.shape, self.groups.mesh.shape), dtype=getattr(torch, meta.dtype))

    def step(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """One training step on the whole batch ``inputs`` (the model's inputs, then targets):
        gradients accumulate on :attr:`module`'s parameters; returns the last stage's local loss
        (the mean over microbatches), None elsewhere."""
        pieces = [torch.chunk(t, self.microbatches) for t in inputs]
        fed = [dict(zip(self.input_names, (p[i] for p in pieces))) for i in range(self.microbatches)]
        held: dict[int, _InFlight] = {}
        pending: list[Any] = []
        total = None
        for action in self.order:
            i = action.microbatch
            if action.kind == "F":
                held[i] = state = _InFlight()
                for name, spec in self.received.items():
                    buffer = self._empty(name, spec)
                    dist.recv(buffer, self._neighbour(-1))
                    self.log.append(Transfer("received", name, "forward", buffer.nbytes))
                    state.received[name] = buffer.requires_grad_(self.graph[name].requires_grad)
                args = [state.received[n.name] if n.name in state.received else fed[i][n.name]
                        for n in self.graph if n.kind == NodeKind.INPUT]
                out = self.module(*args)
                state.outputs = list(out) if isinstance(out, tuple) else [out]
                if not self.last:
                    for name, value in zip(self.sent, state.outputs):
                        pending.append(dist.isend(value.detach().contiguous(), self._neighbour(1)))
                        self.log.append(Transfer("sent", name, "forward", value.nbytes))
            else:
                state = held.pop(i)
                if self.last:
                    loss = state.outputs[0] / self.microbatches
                    loss.backward()
                    total = loss.detach() if total is None else total + loss.detach()
                else:
                    grads = []
                    for name, value in zip(self.sent, state.outputs):
                        buffer = torch.empty_like(value)
                        dist.recv(buffer, self._neighbour(1))
                        self.log.append(Transfer("received", name, "backward", buffer.nbytes))
                        grads.append(buffer)
                    torch.autograd.backward(state.outputs, grads)
                for name, value in state.received.items():
                    grad = value.grad if value.grad is not None else torch.zeros_like(value)
                    pending.append(dist.isend(grad.contiguous(), self._neighbour(-1)))
                    self.log.append(Transfer("sent", name, "backward", grad.nbytes))
        for work in pending:
            work.wait()
        return total

    def transfers(self) -> list[Transfer]:
        """Every point-to-point message since construction (or :meth:`reset_log`), sorted."""
        return sorted(self.log, key=_order)

    def reset_log(self) -> None:
        """Forget the transfers so far, and the stage's collectives."""
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
