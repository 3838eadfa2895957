"""Run a solved plan on torch.distributed with the numerics of the unsharded model, forward and backward.

:func:`parallelize` turns a model and its :class:`~autoshard.plan.Plan` into a
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
  ``rules.count_steps``) runs as the local sum divided by the number of valid targets
  all-reduced over the ranks that share the loss, so shards holding different numbers of
  ``ignore_index`` targets still give the unsharded mean;
- the outputs are returned in their planned layout (replicated in inference; in training where
  the loss reads them, so the caller computes the loss on local pieces).

A mixture-of-experts node runs through ``runtime/experts.py``: its local experts, and for an
expert-parallel placement the token exchanges over its ``exchange_axis``.

Every collective is logged on the edge (or loss node, or expert-parallel node) it belongs to,
in both passes, so :meth:`ParallelModule.collectives` can be compared with
:func:`expected_collectives`, the list the plan (and the cost model) charged
(:func:`same_collectives`: an exchange's bytes are the routing's, the plan's an estimate). An
inference plan has no gradient steps, so its
forward runs without autograd rather than produce gradients nobody planned.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autoshard.build import fingerprint, graph_signature
from autoshard.errors import AutoshardError
from autoshard.frontend.call import node_caller
from autoshard.frontend.experts import EXPERTS_OP
from autoshard.frontend.trace import trace
from autoshard.graph import NodeKind, OpGraph, OpNode
from autoshard.plan import EdgeReshard, Plan
from autoshard.sharding.reshard import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, COLLECTIVES, SLICE, Step, reshard_steps
from autoshard.runtime.collectives import BACKWARD, FORWARD, RECOMPUTE, CommLog, mask_to_first, reshard, run_steps
from autoshard.runtime.experts import exchange_label, run_experts
from autoshard.runtime.groups import MeshGroups
from autoshard.runtime.placements import spec_placements
from autoshard.runtime.recompute import Regathering, run_recomputed
from autoshard.runtime.weights import broadcast_state, model_state, transient_buffers
from autoshard.sharding.spec import TensorSpec

BACKEND_COLLECTIVES: dict[str, frozenset[str]] = {
    "gloo": frozenset(COLLECTIVES),  # CPU tensors, torch 2.13
    "nccl": frozenset(COLLECTIVES),
    "mpi": frozenset({ALL_GATHER, ALL_REDUCE, ALL_TO_ALL}),  # ProcessGroupMPI raises on reduce_scatter
}
"""Collectives each torch.distributed backend can run; a plan needing another one is refused."""
NOISE_FLOOR = 1e-3
"""Fraction of the largest reference compared together below which a tensor's own scale is not trusted."""


@dataclass(frozen=True)
class Collective:
    """One collective of a plan edge: its kind, mesh axis, bytes each device sends, and pass."""

    edge: str
    kind: str
    axis: int
    sent_bytes: int
    phase: str
    routed: bool = False


def edge_label(edge: EdgeReshard) -> str:
    """``src->dst[operand]``: how collectives name the edge they belong to."""
    return f"{edge.src}->{edge.dst}[{edge.operand}]"


def count_label(node: str) -> str:
    """``loss[valid count]``: how collectives name a mean loss's all-reduce of its valid-target count."""
    return f"{node}[valid count]"


def expected_collectives(plan: Plan) -> list[Collective]:
    """The collectives one forward (and, for a training plan, one backward) must run, by plan edge:
    forward, then the recomputation's (an edge into a recomputed segment), the re-gather's (a
    parameter gathered again for backward), then the gradient's.

    Bytes are ``Step.sent_bytes``, the quantity the cost model prices; slices are local and omitted.
    """
    result = []
    recomputed = {name for segment in plan.recompute for name in segment}
    for edge in plan.edges:
        passes = [(FORWARD, edge.steps)]
        if plan.mode == "training":
            if edge.dst in recomputed:
                passes.append((RECOMPUTE, edge.steps))
            if edge.regather:
                passes.append((BACKWARD, edge.steps))
            passes.append((BACKWARD, edge.grad_steps))
        for phase, steps in passes:
            for step in steps:
                if step.kind != SLICE:
                    sent = step.sent_bytes(plan.mesh.shape[step.axis])
                    result.append(Collective(edge_label(edge), step.kind, step.axis, sent, phase))
    for node in plan.nodes.values():
        phases = [FORWARD, RECOMPUTE] if node.name in recomputed and plan.mode == "training" else [FORWARD]
        for phase in phases:
            for step in node.count_steps:
                sent = step.sent_bytes(plan.mesh.shape[step.axis])
                result.append(Collective(count_label(node.name), step.kind, step.axis, sent, phase))
        for x in node.exchanges:
            result.append(Collective(exchange_label(node.name), ALL_TO_ALL, x.axis,
                                     x.sent_bytes(plan.mesh.shape[x.axis]), x.phase, x.routed))
    return result


def same_collectives(executed: Sequence[Collective], planned: Sequence[Collective]) -> bool:
    """The executed collectives are the plan's: equal lists, except that a routed exchange sent
    what the routing asked for (the plan holds the balanced-routing estimate)."""
    return len(executed) == len(planned) and all(
        e == p or (p.routed and e.routed and replace(e, sent_bytes=p.sent_bytes) == p)
        for e, p in zip(executed, planned))


def required_collectives(plan: Plan) -> set[str]:
    """Kinds of collective the plan runs on mesh axes with more than one device."""
    steps = [step for edge in plan.edges for step in (*edge.steps, *edge.grad_steps)]
    steps += [step for node in plan.nodes.values() for step in node.count_steps]
    kinds = {step.kind for step in steps if step.kind != SLICE and plan.mesh.shape[step.axis] > 1}
    return kinds | ({ALL_TO_ALL} if any(n.exchanges for n in plan.nodes.values()) else set())


def check_backend(plan: Plan, backend: str, table: Mapping[str, frozenset[str]] = BACKEND_COLLECTIVES) -> None:
    """Refuse a plan that needs a collective ``backend`` lacks (backends not in ``table`` are trusted)."""
    supported = table.get(backend)
    if supported is None:
        return
    missing = sorted(required_collectives(plan) - supported)
    if missing:
        others = [name for name, kinds in table.items() if required_collectives(plan) <= kinds]
        hint = f"use the {others[0]} backend (--backend {others[0]})" if others else "re-plan so it needs none of them"
        raise AutoshardError(f"the plan needs {', '.join(missing)}, which the {backend} backend cannot run: {hint}")


def check_world(plan: Plan, world_size: int) -> None:
    """Refuse to run a plan on a world whose size is not the plan mesh's device count."""
    if world_size != plan.mesh.size:
        raise AutoshardError(f"plan is for mesh {plan.mesh.label} ({plan.mesh.size} devices) but the world has "
                             f"{world_size} ranks: launch torchrun --nproc_per_node={plan.mesh.size}")


def check_model(plan: Plan, graph: OpGraph) -> None:
    """Refuse a plan made for another model (its fingerprint is not the traced graph's), saying what differs."""
    if plan.fingerprint != fingerprint(graph):
        which = f" ({plan.model})" if plan.model else ""
        raise AutoshardError(f"plan was made for another model{which}: {graph_difference(plan, graph)}; "
                             "re-plan this model with autoshard.solve")


def graph_difference(plan: Plan, graph: OpGraph) -> str:
    """What tells the plan's graph from ``graph``: the tracer, the first differing node, or the fingerprints."""
    frontend = ""
    if plan.frontend and plan.frontend != graph.frontend:
        frontend = f"it was traced with {plan.frontend}, this model with {graph.frontend}; "
    ours = graph_signature(graph)
    if not plan.signature:
        return f"{frontend}its fingerprint {plan.fingerprint} is not this model's {fingerprint(graph)}"
    for k, (planned, traced) in enumerate(zip(plan.signature, ours)):
        if planned != traced:
            return f"{frontend}node {k} differs: the plan has {_node_text(planned)}, this model {_node_text(traced)}"
    return f"{frontend}the plan has {len(plan.signature)} nodes, this model {len(ours)}, the first ones equal"


def _node_text(line: str) -> str:
    """``linear_1 (linear, shape (8, 32))`` from a signature line ``linear_1:linear:(8, 32)`` (inputs have no op)."""
    name, op, shape = line.split(":", 2)
    details = [part for part in (op if op != "None" else "", f"shape {shape}" if shape != "None" else "") if part]
    return f"{name} ({', '.join(details)})" if details else name


def distribute(full: torch.Tensor, spec: TensorSpec, groups: MeshGroups) -> torch.Tensor:
    """This rank's piece of a tensor every rank holds whole (a view; ``spec`` must not be partial)."""
    if spec.partial:
        raise ValueError(f"cannot cut a whole tensor into the partial layout {spec}")
    shape = groups.mesh.shape
    for d, n in enumerate(full.shape):
        k = n // spec.shard_factor(d, shape)
        full = full.narrow(d, spec.chunk_index(d, groups.coords, shape) * k, k)
    return full


def gather_full(local: torch.Tensor, spec: TensorSpec, groups: MeshGroups) -> torch.Tensor:
    """The whole tensor on every rank from the local pieces of layout ``spec`` (collective, no autograd;
    a DTensor contributes its local piece)."""
    local = local_of(local)
    mesh = groups.mesh.shape
    shape = tuple(n * spec.shard_factor(d, mesh) for d, n in enumerate(local.shape))
    steps = reshard_steps(spec, TensorSpec.replicated(len(shape)), shape, local.element_size(), mesh)
    with torch.no_grad():
        return run_steps(local, steps, groups)


def relative_errors(got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor]) -> dict[str, tuple[float, float]]:
    """Per name of ``want``: (max |got - want|, max |got - want| / (|want| + s)), in float64; missing names get inf.

    The check is ``torch.testing.assert_close``'s, |got - want| <= atol + rtol |want| elementwise,
    written as one relative error against ``rtol`` with ``atol = rtol * s``; ``s`` scales it to the
    tensor and to everything compared with it: ``s = max(max |want|, NOISE_FLOOR * M)``, where M is
    the largest entry of all ``want`` tensors. A reference that is zero up to float32 rounding
    (an attention key bias's gradient: softmax ignores it) is then judged against 1e-3 of the
    largest gradient, not against its own noise, while an error in any tensor of real magnitude is
    still measured against that tensor. NaN where the reference has NaN (a mean over no targets) is equal.
    """
    largest = max((_finite_max(w) for w in want.values() if w.numel()), default=0.0)
    errors = {}
    for name, w in want.items():
        if name not in got or tuple(got[name].shape) != tuple(w.shape):
            errors[name] = (float("inf"), float("inf"))
            continue
        if not w.numel():
            errors[name] = (0.0, 0.0)
            continue
        g, w64 = got[name].detach().double().cpu(), w.detach().double().cpu()
        diff = (g - w64).abs()
        diff = torch.where(torch.isnan(g) & torch.isnan(w64), 0.0, diff)
        diff = torch.where((g == w64), 0.0, diff)  # equal infinities
        diff = torch.nan_to_num(diff, nan=float("inf"))
        scale = max(_finite_max(w64), NOISE_FLOOR * largest)
        denominator = torch.nan_to_num(w64.abs(), nan=0.0, posinf=0.0) + scale
        relative = diff / denominator if scale > 0 else diff
        errors[name] = (float(diff.max()), float(relative.max()))
    return errors


def _finite_max(t: torch.Tensor) -> float:
    """Largest finite |entry| (0 when none)."""
    finite = t.detach().abs()[torch.isfinite(t.detach())]
    return float(finite.max()) if finite.numel() else 0.0


def local_of(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a DTensor (autograd-connected), or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def as_dtensor(local: torch.Tensor, spec: TensorSpec, groups: MeshGroups, shape: tuple[int, ...]) -> torch.Tensor:
    """``local`` as the DTensor of global ``shape`` laid out by ``spec`` on the groups' DeviceMesh.

    No communication: every rank passes its own piece. Without a DeviceMesh (one device, no
    torch.distributed) the local tensor is the whole tensor and is returned as is.
    """
    if groups.device_mesh is None:
        return local
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, groups.device_mesh, spec_placements(spec, groups.mesh.shape),
                              run_check=False, shape=torch.Size(shape), stride=stride)


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
        self._logs = {edge_label(e): CommLog() for e in plan.edges if e.steps or e.grad_steps}
        self._logs |= {count_label(n.name): CommLog() for n in plan.nodes.values() if n.count_steps}
        self._logs |= {exchange_label(n.name): CommLog() for n in plan.nodes.values() if n.exchanges}
        self._state_names: dict[str, str] = {}
        self._parameter_names = {n.qualname for n in graph if n.kind == NodeKind.PARAM}
        self._attrs = {n.name: _local_attrs(n, plan) for n in graph if n.kind == NodeKind.OP}
        self._dying = _last_readers(graph)
        self._segments = {segment[0]: segment for segment in plan.recompute} if plan.mode == "training" else {}
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

        def run(phase: str, args: Sequence[Any]) -> list[Any]:
            local = dict(zip(external, args))
            for name in segment:
                self._step(self._graph[name], local, fed, phase, keep=set(external) | set(outputs))
            return [local[name] for name in outputs]

        values.update(zip(outputs, run_recomputed(run, [values[src] for src in external])))
        for name in segment:
            for src in self._dying.get(name, ()):
                values.pop(src, None)

    def _step(self, node: OpNode, values: dict[str, Any], fed: Mapping[str, torch.Tensor], phase: str,
              keep: set[str] = frozenset()) -> None:
        """Compute ``node``'s local value into ``values``; drop the values it was the last to read
        (but those in ``keep``)."""
        place = self.plan.nodes.get(node.name)
        if node.kind == NodeKind.INPUT:
            values[node.name] = distribute(self._checked_input(node, fed[node.name]), place.out_spec, self.groups)
        elif node.kind in (NodeKind.PARAM, NodeKind.BUFFER):
            values[node.name] = self.local_value(self._state_names[node.name])
        elif node.op == "getitem" and isinstance(values[node.inputs[0]], (tuple, list)):
            values[node.name] = self._operand(node, 0, values, phase)
        else:
            operands = [self._operand(node, k, values, phase) for k in range(len(node.inputs))]
            if place is not None:
                for k in place.masked_operands:
                    operands[k] = mask_to_first(operands[k], place.out_spec.partial, self.groups, mask_grad=False)
            with self._regathering(node, operands, values):
                if place is not None and place.count_steps:
                    out = self._mean_over_global_count(node, operands, place.count_steps, phase)
                elif node.op == EXPERTS_OP and place is not None:
                    out = run_experts(operands, node, place, self.groups, self._logs.get(exchange_label(node.name)))
                else:
                    out = node_caller(self._graph, node.name)(operands, self._attrs[node.name])
            del operands
            values[node.name] = out if place is None or place.scale == 1 else _scaled(out, float(place.scale))
        for src in self._dying.get(node.name, ()):
            if src not in keep:
                values.pop(src, None)

    def _regathering(self, node: OpNode, operands: list[Any], values: Mapping[str, Any]) -> AbstractContextManager:
        """Hooks saving this op's re-gathered parameters as their pieces (none: a null context)."""
        edges = [(k, e) for k, e in ((k, self._edges.get((node.name, k))) for k in range(len(node.inputs)))
                 if e is not None and e.regather and torch.is_grad_enabled()]
        if not edges:
            return nullcontext()
        hooks = Regathering(self.groups)
        for k, edge in edges:
            hooks.add(operands[k], values[node.inputs[k]], edge.steps, self._logs[edge_label(edge)])
        return hooks

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

    def _checked_input(self, node: OpNode, value: torch.Tensor) -> torch.Tensor:
        want = node.tensor.shape if node.tensor is not None else None
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != want:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise AutoshardError(f"input {node.name} is {got} but the plan was made for shape {want}: "
                                 "pass inputs of the traced shapes (or re-plan for the new ones)")
        return value

    def _operand(self, node: OpNode, index: int, values: Mapping[str, Any], phase: str = FORWARD) -> Any:
        """Operand ``index`` of ``node`` in the layout the node's strategy requires (its reshard's
        collectives logged in ``phase``)."""
        value = values[node.inputs[index]]
        if node.op == "getitem" and isinstance(value, (tuple, list)):
            value = value[node.attrs.get("index", 0)]
        edge = self._edges.get((node.name, index))
        if edge is None or not (edge.steps or edge.grad_steps):
            return value
        return reshard(value, edge.steps, edge.grad_steps, self.groups, self._logs[edge_label(edge)], phase)

    def collectives(self) -> list[Collective]:
        """Every collective run since the last :meth:`reset_log`, by plan edge (then execution order)."""
        return [Collective(label, r.kind, r.axis, r.sent_bytes, r.phase, r.routed)
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
                             f"{', '.join(node.attrs) or 'no attributes'}: fix the op's rule in specs/ops.toml")
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
) -> ParallelModule:
    """This rank's part of ``model`` running ``plan``; call on every rank with the same arguments.

    The model is re-traced on ``example_inputs`` with the plan's frontend unless its ``graph`` is given, and checked
    against the plan (fingerprint, world size, collectives of the backend) before anything runs.
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
    check_model(plan, graph)
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

