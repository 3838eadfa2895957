"""A pipeline stage that keeps its parameters gathered over the step's microbatches, as priced.

FSDP2 under torch.distributed.pipelining (``reshard_after_forward=False``, gradient sync only
after the last microbatch) gathers a stage's parameters once per step, keeps them for every
microbatch's forward and backward, accumulates their gradients in the gathered layout and
reduces them once. The plan prices exactly that (``problem/edges.py``, kept gathered), and this
module runs it through the executor's public interface, with two modules of one stage:

- the *master* runs ``plan`` as solved: its parameters are stored as the plan stores them, and
  the optimizer, gradient clipping and checkpoints see only them;
- the *compute* module runs :func:`gathered_plan`: every parameter whose only reader is its owner
  is held in the layout the owner reads it in, its owner edge moves nothing either way, so its
  gradient stays where the owner's backward leaves it (perhaps a partial sum) and accumulates.

:meth:`KeptParameters.gather` runs each owner edge's forward steps on the master's piece into
the compute module's (once, before the step's first microbatch); :meth:`KeptParameters.reduce`
runs its gradient steps on the accumulated gradient into the master's (once, after the last).
Every other parameter is copied as it is, and its gradient handed back as it is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch
from torch import nn

from autoshard.frontend.graph import NodeKind, OpGraph
from autoshard.problem.plan import EdgeReshard, Plan
from autoshard.runtime.collectives import CommLog, run_steps
from autoshard.runtime.executor import ParallelModule
from autoshard.runtime.groups import MeshGroups
from autoshard.runtime.placements import as_dtensor, local_of


def gathered_plan(plan: Plan, graph: OpGraph) -> tuple[Plan, dict[str, EdgeReshard]]:
    """``plan`` with each parameter read only by its owner stored in the owner's use layout and its
    owner edge emptied, and those owner edges of ``plan`` by parameter name (dotted)."""
    readers: dict[str, list[EdgeReshard]] = {}
    for edge in plan.edges:
        readers.setdefault(edge.src, []).append(edge)
    params = {n.name: n.qualname for n in graph if n.kind == NodeKind.PARAM}
    moved: dict[str, EdgeReshard] = {}
    for name, qualname in params.items():
        edges = readers.get(name, [])
        if len(edges) != 1 or not (edges[0].steps or edges[0].grad_steps):
            continue
        edge = edges[0]
        grad = edge.grad_src_spec
        if grad is not None and grad.without_partial() != edge.dst_spec:
            continue  # its gradient arrives in another shape than the kept copy: gathered per microbatch
        moved[qualname] = edge
    names = {q: n for n, q in params.items()}
    nodes = dict(plan.nodes)
    for qualname, edge in moved.items():
        nodes[names[qualname]] = replace(nodes[names[qualname]], out_spec=edge.dst_spec)
    edges = [replace(e, src_spec=e.dst_spec, steps=(), grad_dst_spec=e.grad_src_spec, grad_steps=(), regather=False,
                     hidden=False) if params.get(e.src) in moved else e for e in plan.edges]
    specs = {q: moved[q].dst_spec if q in moved else spec for q, spec in plan.param_specs.items()}
    return replace(plan, nodes=nodes, edges=edges, param_specs=specs), moved


class KeptParameters:
    """The step's one gather into the compute module and one gradient reduction into the master."""

    def __init__(self, master: ParallelModule, compute: ParallelModule, moved: dict[str, EdgeReshard],
                 groups: MeshGroups) -> None:
        self.master, self.compute, self.moved, self.groups = master, compute, moved, groups
        self.log = CommLog()
        self.names = [name for name, p in master.named_parameters()]

    def gather(self) -> None:
        """Each parameter's use copy from the master's piece (collective); the compute module's
        gradients cleared for the step."""
        with torch.no_grad():
            for name in self.names:
                piece = local_of(self.master.get_parameter(name))
                edge = self.moved.get(name)
                value = run_steps(piece, edge.steps, self.groups, self.log) if edge is not None else piece
                target = self.compute.get_parameter(name)
                local_of(target).copy_(value)
                target.grad = None

    def reduce(self) -> None:
        """Each accumulated gradient reduced to the master's layout and added to its gradient (collective)."""
        with torch.no_grad():
            for name in self.names:
                source, master = self.compute.get_parameter(name), self.master.get_parameter(name)
                if source.grad is None:
                    continue
                grad = local_of(source.grad)
                edge = self.moved.get(name)
                if edge is not None:
                    grad = run_steps(grad, edge.grad_steps, self.groups, self.log, "backward")
                whole = tuple(master.shape)
                grad = as_dtensor(grad.contiguous(), self.master.param_specs[name], self.groups, whole)
                master.grad = grad if master.grad is None else master.grad + grad


class StageParameters(nn.Module):
    """The parameters and buffers of a device's stages under the model's own names (what the
    optimizer, clipping and checkpoints see: the ``masters``), and the collectives of the modules
    that ran (``computes``: the masters themselves, or a kept stage's compute module)."""

    def __init__(self, masters: Sequence[ParallelModule], computes: Sequence[ParallelModule]) -> None:
        super().__init__()
        self.computes = list(computes)
        self.param_specs = {name: spec for m in masters for name, spec in m.param_specs.items()}
        for module in masters:
            persistent = set(module.state_dict())
            for name, value in module.named_parameters():
                self._owner(name).register_parameter(name.rsplit(".", 1)[-1], value)
            for name, value in module.named_buffers():
                self._owner(name).register_buffer(name.rsplit(".", 1)[-1], value, persistent=name in persistent)

    def _owner(self, name: str) -> nn.Module:
        """The (empty) submodule that holds dotted ``name``'s leaf, created on the way."""
        owner: nn.Module = self
        for part in name.split(".")[:-1]:
            if part not in owner._modules:
                owner.add_module(part, nn.Module())
            owner = owner._modules[part]
        return owner

    def collectives(self) -> list:
        """Every collective its stages' modules ran since the last :meth:`reset_log`."""
        return [c for m in self.computes for c in m.collectives()]

    def reset_log(self) -> None:
        """Forget the collectives run so far."""
        for m in self.computes:
            m.reset_log()
