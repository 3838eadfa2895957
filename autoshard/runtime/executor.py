"""Run a solved plan on torch.distributed with the numerics of the unsharded model, forward and backward.

:func:`parallelize` turns a model and its :class:`~autoshard.problem.plan.Plan` into a
:class:`ParallelModule` that holds only this rank's pieces of the parameters and buffers (laid
out by ``plan.param_specs``, as DTensors) and whose ``forward`` runs the plan lowered for this
rank to one ``torch.fx.GraphModule`` (``runtime/graph``: the model's ops on local pieces, every
planned collective an explicit node, an autograd Function whose backward runs the plan's
gradient steps). The module checks the inputs against the traced shapes, hands the program the
local pieces (``runtime/pieces.py``: the autograd leaves whose gradients the DTensor parameters
show) and the whole inputs, and returns the local output pieces: replicated in inference; in
training in the layout the loss reads them, so the caller computes the loss on local pieces.
An inference plan has no gradient steps, so its forward runs without autograd.

The plan's hidden edges (``EdgeReshard.hidden``, ``cost/overlap.py``'s rule) are issued ahead in
the program and waited at first use; their backward gathers and gradient reductions run in
flight through ``runtime/overlap.py``; every other collective is blocking. Recomputed blocks run
under checkpointing (``runtime/graph/segments.py``, ``runtime/recompute.py``: full or selective),
re-gathered parameters are saved as their pieces; experts run through ``runtime/experts.py``,
causal attention on split query rows through ``runtime/context.py``.

Every collective of an eager run is logged on the edge (or loss node, or expert-parallel node)
it belongs to, in both passes, so :meth:`ParallelModule.collectives` can be compared with
:func:`~autoshard.runtime.checks.expected_collectives`, the list the plan (and the cost model)
charged (``runtime/checks.py``). :meth:`ParallelModule.compile` compiles the program with
``torch.compile`` (inductor), which then logs nothing.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from autoshard.errors import AutoshardError
from autoshard.frontend.trace import trace
from autoshard.frontend.graph import RECEIVED, NodeKind, OpGraph, OpNode
from autoshard.problem.plan import Plan
from autoshard.runtime.checks import (Collective, check_backend, check_layouts, check_model, check_world, count_label,
                                      edge_label, replayed_edges)
from autoshard.runtime.collectives import CommLog
from autoshard.runtime.experts import exchange_label
from autoshard.runtime.float8 import convert_program
from autoshard.runtime.graph.lower import lower
from autoshard.runtime.graph.runtime import Runtime
from autoshard.runtime.groups import MeshGroups
from autoshard.runtime.overlap import Overlap
from autoshard.runtime.pieces import LocalPieces
from autoshard.runtime.placements import as_dtensor, distribute, local_of
from autoshard.runtime.recompute import KeptOps
from autoshard.runtime.weights import broadcast_state, model_state, transient_buffers
from autoshard.sharding.spec import TensorSpec


class ParallelModule(nn.Module):
    """A model running one plan on this rank: DTensor parameters and the plan's program.

    Parameters and buffers keep their original dotted names (``named_parameters()`` and
    ``state_dict()`` match the model's) and global shapes (with one rank in all they are plain
    tensors, each its own whole piece, ``placements.as_dtensor``); ``local_value(name)`` is this rank's
    piece, ``param_specs[name]`` its layout and ``output_specs`` that of each output, for
    :func:`gather_full`. ``program`` is the lowered GraphModule. The program differentiates the
    parameters' local tensors, whose gradients the DTensor parameters show after each backward
    (``runtime/pieces.py``): differentiate the loss with ``backward()``, not ``torch.autograd.grad``
    with respect to the DTensor parameters.
    """

    def __init__(self, graph: OpGraph, plan: Plan, groups: MeshGroups, state: Mapping[str, torch.Tensor],
                 transient: frozenset[str] = frozenset(), float8: str | None = None) -> None:
        """``state`` holds whole values by node name; buffers named in ``transient`` stay out of state_dict();
        ``float8``: a torchao recipe the converted linears run with (``runtime/float8.py``)."""
        super().__init__()
        self.plan, self.groups = plan, groups
        self._training = plan.mode == "training"
        self.param_specs: dict[str, TensorSpec] = {}
        self._parameter_names = {n.qualname for n in graph if n.kind == NodeKind.PARAM}
        self._pieces = LocalPieces()
        for node in graph:
            if node.kind in (NodeKind.PARAM, NodeKind.BUFFER):
                spec = plan.nodes[node.name].out_spec
                whole = state[node.name].detach()
                local = distribute(whole, spec, groups).clone()
                self._register(node, as_dtensor(local, spec, groups, tuple(whole.shape)),
                               persistent=node.qualname not in transient)
                self.param_specs[node.qualname] = spec
        output = next(n for n in graph if n.kind == NodeKind.OUTPUT)
        self.output_specs: list[TensorSpec] = list(plan.nodes[output.name].in_specs)
        logs = {edge_label(e): CommLog() for e in plan.edges if e.steps or e.grad_steps}
        logs |= {count_label(n.name): CommLog() for n in plan.nodes.values() if n.count_steps}
        logs |= {exchange_label(n.name): CommLog() for n in plan.nodes.values() if n.exchanges}
        selective = plan.mode == "training" and plan.recompute and plan.recompute_kept
        self._runtime = Runtime(logs, policy=KeptOps() if selective else None)
        if any(e.hidden for e in plan.edges):
            self._runtime.overlap = Overlap(graph, plan, groups, logs, edge_label, replayed_edges(plan),
                                            self._pieces.of, self._pieces.accumulate)
        program = lower(graph, plan, groups, self._runtime)
        if float8 is not None:
            convert_program(program.module, graph, float8)
        object.__setattr__(self, "program", program.module)  # not a submodule: it holds no state of its own
        self._run = program.module.forward
        self._inputs = [(graph[name], self._input_shape(graph[name])) for name in program.inputs]

    def _register(self, node: OpNode, value: torch.Tensor, persistent: bool) -> None:
        """Attach a parameter or buffer under its dotted name, creating empty parent modules on the way."""
        *path, leaf = node.qualname.split(".")
        owner: nn.Module = self
        for part in path:
            if part not in owner._modules:
                if hasattr(owner, part):
                    raise AutoshardError(f"{node.qualname}: the name {part!r} is taken by ParallelModule itself; "
                                         "rename that submodule of the model")
                owner.add_module(part, nn.Module())
            owner = owner._modules[part]
        if node.kind == NodeKind.PARAM:
            owner.register_parameter(leaf, nn.Parameter(value, requires_grad=node.requires_grad))
        else:
            owner.register_buffer(leaf, value, persistent=persistent)
        self._pieces.add(node.name, owner, leaf, node.kind == NodeKind.PARAM)

    def _input_shape(self, node: OpNode) -> tuple[int, ...] | None:
        """The shape input ``node`` must arrive in: the traced one (a received input: its piece)."""
        if node.tensor is None:
            return None
        if node.attrs.get(RECEIVED):
            return self.plan.nodes[node.name].out_spec.local_shape(node.tensor.shape, self.groups.mesh.shape)
        return tuple(node.tensor.shape)

    def local_value(self, name: str) -> torch.Tensor:
        """This rank's piece of parameter or buffer ``name`` (dotted), autograd-connected to the DTensor."""
        return local_of(self.get_parameter(name) if name in self._parameter_names else self.get_buffer(name))

    def forward(self, *inputs: torch.Tensor) -> Any:
        """Run the plan on whole inputs; returns the local output pieces (a tuple if several)."""
        if len(inputs) != len(self._inputs):
            raise AutoshardError(f"the model takes {len(self._inputs)} inputs "
                                 f"({', '.join(node.name for node, _ in self._inputs)}) but got {len(inputs)}: "
                                 "pass them positionally as to the original model")
        for (node, want), value in zip(self._inputs, inputs):
            if not isinstance(value, torch.Tensor) or (want is not None and value.shape != want):
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise AutoshardError(f"input {node.name} is {got} but the plan was made for shape {want}: "
                                     "pass inputs of the traced shapes (or re-plan for the new ones)")
        if self._training and torch.is_grad_enabled():
            outputs = self._run(*self._pieces.values(), *inputs)
            self._pieces.watch(outputs)
        else:
            with torch.no_grad():
                outputs = self._run(*self._pieces.values(), *inputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def compile(self, **options: Any) -> None:  # type: ignore[override]
        """Run the program under ``torch.compile(**options)`` from now on (in place; inductor by
        default). The module's own checks stay eager; a compiled program logs no collectives."""
        self._run = torch.compile(self.program, **options)

    def collectives(self) -> list[Collective]:
        """Every collective an eager run executed since the last :meth:`reset_log`, by plan edge
        (then execution order)."""
        return [Collective(label, r.kind, r.axis, r.sent_bytes, r.phase, r.routed, r.ahead)
                for label, log in self._runtime.logs.items() for r in log.records]

    def reset_log(self) -> None:
        """Forget the collectives run so far."""
        for log in self._runtime.logs.values():
            log.records.clear()

    def parameter_bytes(self) -> int:
        """Bytes of this rank's pieces of the parameters and buffers."""
        return sum(local_of(t).numel() * t.element_size() for t in (*self.parameters(), *self.buffers()))


def parallelize(
    model: nn.Module,
    plan: Plan,
    mesh_groups: MeshGroups | None = None,
    *,
    example_inputs: Sequence[torch.Tensor] | None = None,
    graph: OpGraph | None = None,
    validate: bool = True,
    float8: str | None = None,
) -> ParallelModule:
    """This rank's part of ``model`` running ``plan``; call on every rank with the same arguments.

    The model is re-traced on ``example_inputs`` with the plan's frontend unless its ``graph`` is given, and checked
    against the plan (fingerprint, world size, collectives of the backend) before anything runs; with ``validate``
    the plan's recorded layouts and steps are also checked to fit together (``check_layouts``: a hand-edited or
    damaged plan is refused in one line instead of failing inside a collective). Callers that checked already,
    or that run deliberately wrong plans to test the executor, pass ``validate=False``.
    ``mesh_groups`` defaults to the plan mesh's groups over the initialized default process group.
    The mesh's first rank broadcasts its parameters and buffers to the others (collective);
    ``model`` itself is not modified. ``float8`` (``tensorwise``/``rowwise``) runs the linears torchao
    converts as its Float8 training does (``runtime/float8.py``; emulated off CUDA).
    """
    if graph is None:
        if example_inputs is None:
            raise AutoshardError("parallelize needs example_inputs (to re-trace the model) or the traced graph")
        graph = trace(model, tuple(example_inputs), plan.frontend or "auto")
    distributed = dist.is_available() and dist.is_initialized()
    world = mesh_groups.mesh.size if mesh_groups is not None else dist.get_world_size() if distributed else 1
    plan = check_model(plan, graph)
    if validate:
        check_layouts(plan, graph)
    check_world(plan, world)
    if mesh_groups is not None and mesh_groups.mesh.shape != plan.mesh.shape:
        raise AutoshardError(f"plan is for mesh {plan.mesh.label} but the groups span mesh {mesh_groups.mesh.label}: "
                             f"create them with MeshGroups.create(plan.mesh)")
    if distributed:
        check_backend(plan, dist.get_backend())
    if mesh_groups is None:
        mesh_groups = MeshGroups.create(plan.mesh) if distributed else MeshGroups.single()
    state = broadcast_state(model_state(model, graph), mesh_groups)
    return ParallelModule(graph, plan, mesh_groups, state, transient_buffers(model, graph), float8)

