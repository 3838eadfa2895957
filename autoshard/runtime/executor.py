"""Run a solved plan on torch.distributed with the numerics of the unsharded model, forward and backward.

:func:`parallelize` turns a model and its :class:`~autoshard.problem.plan.Plan` into a
:class:`ParallelModule` that holds only this rank's pieces of the parameters and buffers (laid
out by ``plan.param_specs``) and whose ``forward`` interprets the traced graph node by node:

- model inputs arrive whole on every rank and are cut to their planned layout;
- every operand goes through its edge's reshard, an autograd Function whose forward runs the
  edge's ``steps`` and whose backward runs its ``grad_steps`` (``runtime.collectives.reshard``);
  a ``getitem`` takes its element of the producer's tuple first, then reshards it;
- operands added into a partial-sum output (``masked_operands``) are zeroed off coordinate 0 of
  the partial axes, so the sum counts them once, while their gradient passes unmasked (the
  output's gradient arrives replicated over those axes, so each device has the whole gradient);
- the op runs through ``frontend.call.node_caller`` with the plan's ``local_attrs`` and its
  output is multiplied by ``scale``; a mean loss with ``count_steps`` (targets sharded, see
  ``strategy.count_steps``) runs as the local sum divided by the number of valid targets
  all-reduced over the ranks that share the loss, so shards holding different numbers of
  ``ignore_index`` targets still give the unsharded mean;
- the outputs are returned in their planned layout (replicated in inference; in training where
  the loss reads them, so the caller computes the loss on local pieces).

The plan's hidden edges (``EdgeReshard.hidden``, ``cost/overlap.py``'s rule) run through
``runtime/overlap.py``: their gathers issued a layer ahead, their gradient reductions in flight
during the next layer's backward; every other collective is blocking. Recomputed segments and
selective recomputation run through ``runtime/recompute.py``.

A mixture-of-experts node runs through ``runtime/experts.py``: its local experts, and for an
expert-parallel placement the token exchanges over its ``exchange_axis``. Causal attention with
its query rows split runs through ``runtime/context.py`` (its mask from the rows' positions).

Every collective is logged on the edge (or loss node, or expert-parallel node) it belongs to,
in both passes, so :meth:`ParallelModule.collectives` can be compared with
:func:`~autoshard.runtime.checks.expected_collectives`, the list the plan (and the cost model)
charged (``runtime/checks.py``). An inference plan has no gradient steps, so its forward runs
without autograd rather than produce gradients nobody planned.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from autoshard.errors import AutoshardError
from autoshard.frontend.call import node_caller
from autoshard.frontend.experts import EXPERTS_OP
from autoshard.frontend.trace import trace
from autoshard.frontend.graph import RECEIVED, NodeKind, OpGraph, OpNode
from autoshard.problem.plan import EdgeReshard, Plan
from autoshard.sharding.reshard import Step
from autoshard.runtime.checks import (Collective, check_backend, check_layouts, check_model, check_world, count_label,
                                      edge_label, replayed_edges)
from autoshard.runtime.collectives import BACKWARD, FORWARD, RECOMPUTE, CommLog, mask_to_first, reshard, run_steps
from autoshard.runtime.experts import exchange_label, run_experts
from autoshard.runtime.groups import MeshGroups
from autoshard.runtime.placements import as_dtensor, distribute, local_of
from autoshard.runtime.context import causal_rows_attention, splits_causal_rows
from autoshard.runtime.overlap import Overlap
from autoshard.runtime.recompute import KeptOps, Regathering, run_recomputed
from autoshard.runtime.weights import broadcast_state, model_state, transient_buffers
from autoshard.sharding.spec import TensorSpec

class ParallelModule(nn.Module):
    """A model running one plan on this rank: DTensor parameters and the planned collectives.

    Parameters and buffers keep their original dotted names (``named_parameters()`` and
    ``state_dict()`` match the model's) and global shapes; ``local_value(name)`` is this rank's
    piece, ``param_specs[name]`` its layout and ``output_specs`` that of each output, for
    :func:`gather_full`.
    """

    def __init__(self, graph: OpGraph, plan: Plan, groups: MeshGroups, state: Mapping[str, torch.Tensor],
                 transient: frozenset[str] = frozenset()) -> None:
        """``state`` holds whole values by node name; buffers named in ``transient`` stay out of state_dict()."""
        super().__init__()
        self.plan, self.groups = plan, groups
        self.param_specs: dict[str, TensorSpec] = {}
        self._graph = graph
        self._edges = {(e.dst, e.operand): e for e in plan.edges}
        self._regathered: dict[str, list[tuple[int, EdgeReshard]]] = {}
        for e in plan.edges:
            if e.regather:
                self._regathered.setdefault(e.dst, []).append((e.operand, e))
        self._logs = {edge_label(e): CommLog() for e in plan.edges if e.steps or e.grad_steps}
        self._logs |= {count_label(n.name): CommLog() for n in plan.nodes.values() if n.count_steps}
        self._logs |= {exchange_label(n.name): CommLog() for n in plan.nodes.values() if n.exchanges}
        self._state_names: dict[str, str] = {}
        self._parameter_names = {n.qualname for n in graph if n.kind == NodeKind.PARAM}
        self._attrs = {n.name: _local_attrs(n, plan) for n in graph if n.kind == NodeKind.OP}
        self._dying = _last_readers(graph)
        self._segments = {segment[0]: segment for segment in plan.recompute} if plan.mode == "training" else {}
        self._kept, self._replayed = frozenset(plan.recompute_kept), replayed_edges(plan)
        self._policy = KeptOps() if self._kept and self._segments else None
        self._overlap = Overlap(graph, plan, groups, self._logs, edge_label, self._replayed) \
            if any(e.hidden for e in plan.edges) else None
        self._read_outside: dict[str, set[str]] = {}
        for node in graph:
            for src in node.inputs:
                self._read_outside.setdefault(src, set()).add(node.name)
        for node in graph:
            if node.kind in (NodeKind.PARAM, NodeKind.BUFFER):
                spec = plan.nodes[node.name].out_spec
                whole = state[node.name].detach()
                local = distribute(whole, spec, groups).clone()
                self._register(node, as_dtensor(local, spec, groups, tuple(whole.shape)),
                               persistent=node.qualname not in transient)
                self.param_specs[node.qualname] = spec
                self._state_names[node.name] = node.qualname
        output = next(n for n in graph if n.kind == NodeKind.OUTPUT)
        self.output_specs: list[TensorSpec] = list(plan.nodes[output.name].in_specs)

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

    def local_value(self, name: str) -> torch.Tensor:
        """This rank's piece of parameter or buffer ``name`` (dotted), as the plan's ops read it.

        Gradients flow back to the DTensor parameter in its own placements (see module doc).
        """
        return local_of(self.get_parameter(name) if name in self._parameter_names else self.get_buffer(name))

    def forward(self, *inputs: torch.Tensor) -> Any:
        """Run the plan on whole inputs; returns the local output pieces (a tuple if several)."""
        grad = self.plan.mode == "training" and torch.is_grad_enabled()
        with torch.set_grad_enabled(grad):
            outputs = self._interpret(inputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _interpret(self, inputs: Sequence[torch.Tensor]) -> list[Any]:
        """Walk the graph once: every node's local value, then the output node's operands
        (recomputed segments run whole, under checkpointing, at their first node)."""
        placeholders = [n for n in self._graph if n.kind == NodeKind.INPUT]
        if len(inputs) != len(placeholders):
            raise AutoshardError(f"the model takes {len(placeholders)} inputs ({', '.join(n.name for n in placeholders)}) "
                                 f"but got {len(inputs)}: pass them positionally as to the original model")
        fed = dict(zip((n.name for n in placeholders), inputs))
        if self._overlap is not None:
            self._overlap.start_forward()
        values: dict[str, Any] = {}
        done: set[str] = set()
        for node in self._graph:
            if node.name in done:
                continue
            if node.kind == NodeKind.OUTPUT:
                return [self._operand(node, k, values) for k in range(len(node.inputs))]
            segment = self._segments.get(node.name)
            if segment is not None and torch.is_grad_enabled():
                self._run_segment(segment, values, fed)
                done.update(segment)
                continue
            self._step(node, values, fed, FORWARD)
        raise AutoshardError("the traced graph has no output node: re-trace the model")

    def _run_segment(self, segment: list[str], values: dict[str, Any], fed: Mapping[str, torch.Tensor]) -> None:
        """A recomputed segment: its outside inputs in, its values read outside out (runtime/recompute.py)."""
        inside = set(segment)
        external = list(dict.fromkeys(src for name in segment for src in self._graph[name].inputs
                                      if src not in inside))
        outputs = [name for name in segment if self._read_outside.get(name, inside) - inside]

        kept: dict[str, torch.Tensor] = {}  # reshards into kept ops, from the forward to the recomputation

        def run(phase: str, args: Sequence[Any]) -> list[Any]:
            local = dict(zip(external, args))
            for name in segment:
                self._step(self._graph[name], local, fed, phase, keep=set(external) | set(outputs), kept=kept)
            return [local[name] for name in outputs]

        values.update(zip(outputs, run_recomputed(run, [values[src] for src in external], self._policy)))
        for name in segment:
            for src in self._dying.get(name, ()):
                values.pop(src, None)

    def _step(self, node: OpNode, values: dict[str, Any], fed: Mapping[str, torch.Tensor], phase: str,
              keep: set[str] = frozenset(), kept: dict[str, torch.Tensor] | None = None) -> None:
        """Compute ``node``'s local value into ``values``; drop the values it was the last to read
        (but those in ``keep``). ``kept``: the segment's store of reshards into kept ops."""
        place = self.plan.nodes.get(node.name)
        if self._overlap is not None and phase == FORWARD:
            self._overlap.reached(node.name, self._piece)
        if node.kind == NodeKind.INPUT and node.attrs.get(RECEIVED):  # a pipeline stage's input: its piece
            values[node.name] = self._checked_input(node, fed[node.name], place.out_spec)
        elif node.kind == NodeKind.INPUT:
            values[node.name] = distribute(self._checked_input(node, fed[node.name]), place.out_spec, self.groups)
        elif node.kind in (NodeKind.PARAM, NodeKind.BUFFER):
            values[node.name] = self.local_value(self._state_names[node.name])
        elif node.op == "getitem" and isinstance(values[node.inputs[0]], (tuple, list)):
            values[node.name] = self._operand(node, 0, values, phase, kept)
        else:
            operands = [self._operand(node, k, values, phase, kept) for k in range(len(node.inputs))]
            if place is not None:
                for k in place.masked_operands:
                    operands[k] = mask_to_first(operands[k], place.out_spec.partial, self.groups, mask_grad=False)
            keeping = self._policy.keeping(node.name in self._kept) if self._policy is not None else nullcontext()
            with self._regathering(node, operands, values), keeping:
                if place is not None and place.count_steps:
                    out = self._mean_over_global_count(node, operands, place.count_steps, phase)
                elif node.op == EXPERTS_OP and place is not None:
                    out = run_experts(operands, node, place, self.groups, self._logs.get(exchange_label(node.name)))
                elif splits_causal_rows(node, place):
                    out = causal_rows_attention(operands, node, place, self.groups)
                else:
                    out = node_caller(self._graph, node.name)(operands, self._attrs[node.name])
            del operands
            values[node.name] = out if place is None or place.scale == 1 else _scaled(out, float(place.scale))
        for src in self._dying.get(node.name, ()):
            if src not in keep:
                values.pop(src, None)

    def _regathering(self, node: OpNode, operands: list[Any], values: Mapping[str, Any]) -> AbstractContextManager:
        """Hooks saving this op's re-gathered parameters as their pieces (none: a null context)."""
        edges = self._regathered.get(node.name)
        if not edges or not torch.is_grad_enabled():
            return nullcontext()
        hooks = Regathering(self.groups)
        for k, edge in edges:
            again = None
            if self._overlap is not None and edge.hidden:
                again = partial(self._overlap.again, edge, BACKWARD, self._piece)
            hooks.add(operands[k], values[node.inputs[k]], edge.steps, self._logs[edge_label(edge)], again)
        return hooks

    def _piece(self, src: str) -> torch.Tensor:
        """This rank's piece of parameter or buffer node ``src``."""
        return self.local_value(self._state_names[src])

    def _mean_over_global_count(self, node: OpNode, operands: list[Any], steps: tuple[Step, ...],
                                phase: str = FORWARD) -> torch.Tensor:
        """A mean loss (cross-entropy, NLL) on this rank's targets: local sum / global count of valid targets.

        Dividing each shard's own mean would weigh shards by 1 / their count of targets that are
        not ``ignore_index`` (a causal LM's shifted labels end each row with -100). The count is
        data, not a parameter: it has no gradient.
        """
        total = node_caller(self._graph, node.name)(operands, {**self._attrs[node.name], "reduction": 2})
        valid = operands[1] != node.attrs.get("ignore_index", -100)
        with torch.no_grad():
            count = run_steps(valid.sum().to(total.dtype), steps, self.groups, self._logs[count_label(node.name)],
                              phase)
        return total / count

    def _checked_input(self, node: OpNode, value: torch.Tensor, local: TensorSpec | None = None) -> torch.Tensor:
        """``value`` if it has the traced shape (``local``: its piece in that layout)."""
        want = node.tensor.shape if node.tensor is not None else None
        if local is not None and want is not None:
            want = local.local_shape(want, self.groups.mesh.shape)
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != want:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise AutoshardError(f"input {node.name} is {got} but the plan was made for shape {want}: "
                                 "pass inputs of the traced shapes (or re-plan for the new ones)")
        return value

    def _operand(self, node: OpNode, index: int, values: Mapping[str, Any], phase: str = FORWARD,
                 kept: dict[str, torch.Tensor] | None = None) -> Any:
        """Operand ``index`` of ``node`` in the layout the node's strategy requires (its reshard's
        collectives logged in ``phase``). The reshard of another op's output into a kept op of a
        selective segment is stored in ``kept`` by the forward and taken from there, not run, by
        the recomputation (its gradient steps are the forward graph's business)."""
        value = values[node.inputs[index]]
        if node.op == "getitem" and isinstance(value, (tuple, list)):
            value = value[node.attrs.get("index", 0)]
        edge = self._edges.get((node.name, index))
        if edge is None or not (edge.steps or edge.grad_steps):
            return value
        label = edge_label(edge)
        if self._overlap is not None and edge.hidden:  # issued ahead: runtime/overlap.py
            if phase == RECOMPUTE:
                ready = self._overlap.again(edge, RECOMPUTE, self._piece)
                return reshard(value, edge.steps, edge.grad_steps, self.groups, self._logs[label], phase, ready)
            param = self.get_parameter(self._state_names[edge.src])
            return reshard(value, edge.steps, edge.grad_steps, self.groups, self._logs[label], phase,
                           self._overlap.ready(edge), self._overlap.reducer(edge, param))
        if kept is None or not edge.steps or node.name not in self._kept or label in self._replayed:
            return reshard(value, edge.steps, edge.grad_steps, self.groups, self._logs[label], phase)
        if phase == RECOMPUTE:
            return kept.pop(label).requires_grad_(value.requires_grad)
        out = reshard(value, edge.steps, edge.grad_steps, self.groups, self._logs[label], phase)
        kept[label] = out.detach()
        return out

    def collectives(self) -> list[Collective]:
        """Every collective run since the last :meth:`reset_log`, by plan edge (then execution order)."""
        return [Collective(label, r.kind, r.axis, r.sent_bytes, r.phase, r.routed, r.ahead)
                for label, log in self._logs.items() for r in log.records]

    def reset_log(self) -> None:
        """Forget the collectives run so far."""
        for log in self._logs.values():
            log.records.clear()

    def parameter_bytes(self) -> int:
        """Bytes of this rank's pieces of the parameters and buffers."""
        return sum(local_of(t).numel() * t.element_size() for t in (*self.parameters(), *self.buffers()))


def _last_readers(graph: OpGraph) -> dict[str, list[str]]:
    """For each node, the values whose last reader it is: the interpreter drops them after it runs,
    as eager PyTorch frees a tensor nobody refers to (autograd keeps what backward needs)."""
    last: dict[str, OpNode] = {}
    for node in graph:
        for src in node.inputs:
            last[src] = node
    dying: dict[str, list[str]] = {}
    for src, reader in last.items():
        if reader.kind != NodeKind.OUTPUT:
            dying.setdefault(reader.name, []).append(src)
    return dying


def _local_attrs(node: OpNode, plan: Plan) -> dict[str, Any]:
    """The plan's attribute overrides for ``node``, checked against the attributes the node has."""
    place = plan.nodes.get(node.name)
    attrs = dict(place.local_attrs) if place is not None else {}
    unknown = sorted(set(attrs) - set(node.attrs))
    if unknown:
        raise AutoshardError(f"plan overrides {', '.join(unknown)} of node {node.name} ({node.op}), which has only "
                             f"{', '.join(node.attrs) or 'no attributes'}: fix the op's rule in autoshard/sharding/ops.toml")
    return attrs


def _scaled(out: Any, factor: float) -> Any:
    if isinstance(out, (tuple, list)):
        return type(out)(_scaled(o, factor) for o in out)
    return out * factor if isinstance(out, torch.Tensor) and out.is_floating_point() else out


def parallelize(
    model: nn.Module,
    plan: Plan,
    mesh_groups: MeshGroups | None = None,
    *,
    example_inputs: Sequence[torch.Tensor] | None = None,
    graph: OpGraph | None = None,
    validate: bool = True,
) -> ParallelModule:
    """This rank's part of ``model`` running ``plan``; call on every rank with the same arguments.

    The model is re-traced on ``example_inputs`` with the plan's frontend unless its ``graph`` is given, and checked
    against the plan (fingerprint, world size, collectives of the backend) before anything runs; with ``validate``
    the plan's recorded layouts and steps are also checked to fit together (``check_layouts``: a hand-edited or
    damaged plan is refused in one line instead of failing inside a collective). Callers that checked already,
    or that run deliberately wrong plans to test the executor, pass ``validate=False``.
    ``mesh_groups`` defaults to the plan mesh's groups over the initialized default process group.
    The mesh's first rank broadcasts its parameters and buffers to the others (collective);
    ``model`` itself is not modified.
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
    return ParallelModule(graph, plan, mesh_groups, state, transient_buffers(model, graph))

