"""Lower a plan, for this rank, to one ``torch.fx.GraphModule`` (the program).

The program takes this rank's pieces of the parameters and buffers (in graph order), then the
model's whole inputs, and returns the local pieces of the outputs (a tuple). It holds:

- the inputs cut to their planned layout (``narrow`` at this rank's offsets), a pipeline stage's
  received inputs as they come (already pieces);
- every op as its traced call on local tensors with the plan's ``local_attrs`` (``emit.py``),
  or a call of ``calls.py`` where it needs one: a mean loss over a global count of targets
  (``count_steps``), experts, causal attention on split query rows, a kept op of a selective
  block, an op saving its re-gathered parameters as pieces;
- before each operand its edge's reshard (``calls.Reshard``: an autograd Function whose forward
  runs the edge's ``steps`` and whose backward its ``grad_steps``); a ``getitem`` of a tuple
  takes its element first; operands added into a partial sum (``masked_operands``) are zeros
  off coordinate 0 of the partial axes, their gradient passing unmasked; an output with a
  ``scale`` is multiplied by it;
- the hidden edges' forward gathers issued ahead (``calls.Issue`` just before the first node of
  the layer before their owner's, ``overlap.forward_issues``), their result waited by the
  owner's reshard, at first use; every other collective blocking, where it is used;
- each recomputed block as its own GraphModule run under checkpointing (``segments.py``).

Every rank lowers the same plan to programs that differ only in their constants (offsets,
coordinates), so every rank issues the same collectives in the same order on each group.
"""

from __future__ import annotations

import keyword
import operator
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from autoshard.errors import AutoshardError
from autoshard.frontend.call import node_caller
from autoshard.frontend.experts import EXPERTS_OP
from autoshard.frontend.graph import RECEIVED, NodeKind, OpGraph, OpNode, TensorMeta
from autoshard.problem.plan import EdgeReshard, NodePlacement, Plan
from autoshard.runtime.checks import count_label, edge_label, replayed_edges
from autoshard.runtime.collectives import masked_here, resolve, zeros_passing_grad
from autoshard.runtime.context import splits_causal_rows
from autoshard.runtime.experts import exchange_label
from autoshard.runtime.graph.calls import (Call, CausalRows, CountMean, Experts, Issue, Kept, Regathered, Reshard,
                                           Scaled)
from autoshard.runtime.graph.emit import emit_call
from autoshard.runtime.graph.runtime import Runtime
from autoshard.runtime.graph.segments import Recomputed
from autoshard.runtime.groups import MeshGroups
from autoshard.runtime.overlap import forward_issues
from autoshard.runtime.uneven import piece_attrs
from autoshard.sharding.spec import piece_range


@dataclass
class Program:
    """A lowered plan: the GraphModule, and the graph nodes its arguments stand for (``pieces``:
    parameters and buffers, then ``inputs``)."""

    module: fx.GraphModule
    pieces: list[str]
    inputs: list[str]


@dataclass
class _Scope:
    """One GraphModule under construction: its graph, the value of every graph node lowered into
    it so far, and the gathers issued ahead it can wait for, by edge label."""

    g: fx.Graph
    env: dict[str, Any] = field(default_factory=dict)
    ready: dict[str, fx.Node] = field(default_factory=dict)


_GLOBALS = frozenset({"self", "torch", "operator", "builtins", "device", "inf", "nan", "math", "fx_pytree", "pytree"})
"""Names the program's code uses for globals, which no argument may shadow."""


def _placeholder(g: fx.Graph, name: str) -> fx.Node:
    """An argument of ``g`` named after ``name`` (fx writes a placeholder's target as the argument's name)."""
    ident = re.sub(r"\W", "_", name)
    if not ident or ident[0].isdigit() or keyword.iskeyword(ident) or ident in _GLOBALS:
        ident = f"_{ident}"
    taken = {n.target for n in g.nodes if n.op == "placeholder"}
    unique, k = ident, 1
    while unique in taken:
        unique, k = f"{ident}_{k}", k + 1
    return g.placeholder(unique)


def local_attrs(node: OpNode, plan: Plan) -> dict[str, Any]:
    """The plan's attribute overrides for ``node``, checked against the attributes the node has."""
    place = plan.nodes.get(node.name)
    attrs = dict(place.local_attrs) if place is not None else {}
    unknown = sorted(set(attrs) - set(node.attrs))
    if unknown:
        raise AutoshardError(f"plan overrides {', '.join(unknown)} of node {node.name} ({node.op}), which has only "
                             f"{', '.join(node.attrs) or 'no attributes'}: fix the op's rule in autoshard/sharding/ops.toml")
    return attrs


class _Lowering:
    """The lowering of one plan on one rank (module doc)."""

    def __init__(self, graph: OpGraph, plan: Plan, groups: MeshGroups, runtime: Runtime) -> None:
        self.graph, self.plan, self.groups, self.rt = graph, plan, groups, runtime
        self.edges = {(e.dst, e.operand): e for e in plan.edges}
        training = plan.mode == "training"
        self.segments = {segment[0]: segment for segment in plan.recompute} if training else {}
        self.kept = frozenset(plan.recompute_kept) if self.segments else frozenset()
        self.replayed = replayed_edges(plan)
        self.issues = forward_issues(graph, plan) if any(e.hidden for e in plan.edges) else {}
        self.regathered: dict[str, list[tuple[int, EdgeReshard]]] = {}
        for e in plan.edges:
            if e.regather:
                self.regathered.setdefault(e.dst, []).append((e.operand, e))
        self.readers: dict[str, set[str]] = {}
        for node in graph:
            for src in node.inputs:
                self.readers.setdefault(src, set()).add(node.name)
        self.root = torch.nn.Module()

    def program(self) -> Program:
        """The whole program."""
        scope = _Scope(fx.Graph())
        pieces = [n for n in self.graph if n.kind in (NodeKind.PARAM, NodeKind.BUFFER)]
        inputs = [n for n in self.graph if n.kind == NodeKind.INPUT]
        for node in [*pieces, *inputs]:
            scope.env[node.name] = _placeholder(scope.g, node.name)
        for node in inputs:
            scope.env[node.name] = self._cut(scope.g, scope.env[node.name], node)
        done: set[str] = set()
        for node in self.graph:
            if node.name in done or node.kind in (NodeKind.PARAM, NodeKind.BUFFER, NodeKind.INPUT):
                continue
            if node.kind == NodeKind.OUTPUT:
                scope.g.output(tuple(self._operand(scope, node, k) for k in range(len(node.inputs))))
                break
            segment = self.segments.get(node.name)
            if segment is not None:
                for name in segment:
                    self._issue(scope, name)
                self._segment(scope, segment)
                done.update(segment)
                continue
            self._issue(scope, node.name)
            scope.env[node.name] = self._op(scope, node)
        else:
            raise AutoshardError("the traced graph has no output node: re-trace the model")
        if scope.ready:
            raise AutoshardError(f"the plan issues {sorted(scope.ready)[0]} ahead but nothing reads it: re-plan")
        module = fx.GraphModule(self.root, scope.g, class_name="PlanProgram")
        for name, block in self.root.named_children():
            module.add_module(name, block)
        return Program(module, [n.name for n in pieces], [n.name for n in inputs])

    def _cut(self, g: fx.Graph, x: fx.Node, node: OpNode) -> fx.Node:
        """A whole input's piece in its planned layout (a received input is a piece already)."""
        spec = self.plan.nodes[node.name].out_spec
        if node.attrs.get(RECEIVED) or node.tensor is None or spec is None:
            return x
        if spec.partial:
            raise ValueError(f"cannot cut a whole tensor into the partial layout {spec}")
        shape = self.groups.mesh.shape
        for d, n in enumerate(node.tensor.shape):
            factor = spec.shard_factor(d, shape)
            if factor > 1:
                start, length = piece_range(n, factor, spec.chunk_index(d, self.groups.coords, shape))
                x = g.call_method("narrow", (x, d, start, length))
        return x

    def _issue(self, scope: _Scope, name: str) -> None:
        """The hidden edges' gathers issued just before node ``name`` (``overlap.forward_issues``)."""
        for edge in self.issues.get(name, ()):
            label = edge_label(edge)
            issue = Issue(edge, label, resolve(edge.steps, self.groups), self.rt)
            scope.ready[label] = scope.g.call_function(issue, (scope.env[edge.src],))

    def _operand(self, scope: _Scope, node: OpNode, k: int) -> Any:
        """Operand ``k`` of ``node`` in the layout the node's strategy requires."""
        value = scope.env[node.inputs[k]]
        if node.op == "getitem" and self._of_tuple(node):
            value = scope.g.call_function(operator.getitem, (value, node.attrs.get("index", 0)))
        edge = self.edges.get((node.name, k))
        if edge is None or not (edge.steps or edge.grad_steps):
            return value
        label = edge_label(edge)
        keep = bool(edge.steps) and node.name in self.kept and label not in self.replayed
        call = Reshard(edge, label, resolve(edge.steps, self.groups), resolve(edge.grad_steps, self.groups), self.rt,
                       keep)
        ready = scope.ready.pop(label, None)
        return scope.g.call_function(call, (value,) if ready is None else (value, ready))

    def _of_tuple(self, node: OpNode) -> bool:
        """True for a ``getitem`` taking an element of its producer's tuple (not indexing a tensor)."""
        return not isinstance(self.graph[node.inputs[0]].out, TensorMeta)

    def _op(self, scope: _Scope, node: OpNode) -> Any:
        """``node``'s local value, its operands resharded first."""
        if node.op == "getitem" and node.inputs and self._of_tuple(node):
            return self._operand(scope, node, 0)
        g, place = scope.g, self.plan.nodes.get(node.name)
        operands = [self._operand(scope, node, k) for k in range(len(node.inputs))]
        if place is not None and place.masked_operands and masked_here(place.out_spec.partial, self.groups):
            for k in place.masked_operands:
                operands[k] = g.call_function(zeros_passing_grad, (operands[k],))
        attrs = {**local_attrs(node, self.plan), **piece_attrs(node, place, self.groups)}
        special = self._special(node, place, attrs)
        regathered = self.regathered.get(node.name, [])
        out = None
        if special is None and node.name not in self.kept and not regathered:
            boolean = isinstance(node.out, TensorMeta) and node.out.dtype == "bool"
            out = emit_call(g, node_caller(self.graph, node.name), operands, attrs, node.name, boolean)
        if out is None:
            call, args = special or Call(self.graph, node, attrs), list(operands)
            if node.name in self.kept:
                call = Kept(call, node.name, self.rt)
            if regathered:
                edges = [(k, e, edge_label(e), resolve(e.steps, self.groups)) for k, e in regathered]
                call = Regathered(call, node.name, len(operands), edges, self.rt)
                args += [scope.env[node.inputs[k]] for k, _ in regathered]
            out = g.create_node("call_function", call, tuple(args), name=node.name)
        if place is not None and place.scale != 1:
            if isinstance(node.out, TensorMeta) and node.out.is_float:
                return g.call_function(operator.mul, (out, float(place.scale)))
            return g.call_function(Scaled(node.name, float(place.scale)), (out,))
        return out

    def _special(self, node: OpNode, place: NodePlacement | None, attrs: dict[str, Any]) -> Any:
        """The call of an op that needs more than its traced call (None: it needs none)."""
        if place is None:
            return None
        if place.count_steps:
            return CountMean(self.graph, node, attrs, resolve(place.count_steps, self.groups), count_label(node.name),
                             self.rt)
        if node.op == EXPERTS_OP:
            return Experts(node, place, self.groups, exchange_label(node.name), self.rt)
        if splits_causal_rows(node, place):
            return CausalRows(node, place, self.groups)
        return None

    def _segment(self, scope: _Scope, segment: list[str]) -> None:
        """A recomputed block as its own GraphModule, called under checkpointing (``segments.py``)."""
        inside = set(segment)
        external = list(dict.fromkeys(src for name in segment for src in self.graph[name].inputs if src not in inside))
        outputs = [name for name in segment if self.readers.get(name, inside) - inside]
        labels = [edge_label(e) for e in self.plan.edges if e.dst in inside and edge_label(e) in scope.ready]
        sub = _Scope(fx.Graph())
        for label in labels:
            sub.ready[label] = _placeholder(sub.g, f"ready_{label}")
        for src in external:
            sub.env[src] = _placeholder(sub.g, src)
        for name in segment:
            sub.env[name] = self._op(sub, self.graph[name])
        sub.g.output(tuple(sub.env[name] for name in outputs))
        index = len(self.root._modules)
        module = fx.GraphModule(torch.nn.Module(), sub.g, class_name="RecomputedBlock")
        self.root.add_module(f"block_{index}", module)
        call = Recomputed(module, segment[0], len(labels), self.rt)
        args = [scope.ready.pop(label) for label in labels] + [scope.env[src] for src in external]
        result = scope.g.call_function(call, tuple(args))
        for i, name in enumerate(outputs):
            scope.env[name] = scope.g.call_function(operator.getitem, (result, i))


def lower(graph: OpGraph, plan: Plan, groups: MeshGroups, runtime: Runtime) -> Program:
    """This rank's program of ``plan`` (module doc); its calls share ``runtime``."""
    return _Lowering(graph, plan, groups, runtime).program()
