"""The callables a lowered program's ``call_function`` nodes name (``runtime/graph/lower.py``).

Each is built once per rank with its constants (resolved steps, labels, the traced call) and
named after what it runs, so the program's code reads as the plan (``reshard_<src>_<dst>_<operand>``
for an edge, ``issue_...`` for a gather issued ahead, ``recomputed_<first node>`` for a block). In eager mode they log their collectives and follow the
recomputation and overlap state of :class:`~autoshard.runtime.graph.runtime.Runtime`; under
``torch.compile`` (``compiling()``) each takes its plain, traceable path.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any, Callable, Mapping

import torch

from autoshard.frontend.call import node_caller
from autoshard.frontend.graph import OpGraph, OpNode
from autoshard.problem.plan import EdgeReshard, NodePlacement
from autoshard.runtime import overlap as overlap_module
from autoshard.runtime.collectives import (BACKWARD, FORWARD, RECOMPUTE, CommLog, Op, reshard_ops, reshard_value,
                                          run_ops)
from autoshard.runtime.context import causal_rows_attention
from autoshard.runtime.experts import run_experts
from autoshard.runtime.graph.runtime import Runtime, compiling
from autoshard.runtime.groups import MeshGroups
from autoshard.runtime.recompute import Regathering


class Named:
    """A callable the program's code names ``<kind>_<what>`` (fx takes a target's ``__name__``)."""

    def __init__(self, kind: str, what: str) -> None:
        self.__name__ = f"{kind}_{re.sub(r'[^0-9a-zA-Z_]', '_', what)}"
        self.__module__ = "autoshard_plan"


class Reshard(Named):
    """An edge's reshard (``collectives.reshard_ops``): forward steps, gradient steps, logged
    under the edge's label in the pass running. ``hidden``: the forward was issued ahead
    (``ready``: what :class:`Issue` returned) and the gradient is reduced in flight, and in a
    recomputation its gather is issued ahead in the backward (``runtime/overlap.py``).
    ``keep``: the reshard into a kept op of a selective block, kept from the forward for the
    recomputation (``runtime/recompute.py``). An edge along which no gradient flows
    (``grad_src_spec`` None: inference, integer masks, shape-only reads) reshards its value
    without autograd."""

    def __init__(self, edge: EdgeReshard, label: str, fwd: tuple[Op, ...], bwd: tuple[Op, ...], runtime: Runtime,
                 keep: bool) -> None:
        super().__init__("reshard", f"{edge.src}_{edge.dst}_{edge.operand}")
        self.edge, self.label, self.fwd, self.bwd, self.runtime, self.keep = edge, label, fwd, bwd, runtime, keep
        self.hidden, self.differentiable = edge.hidden, edge.grad_src_spec is not None

    def __call__(self, x: torch.Tensor, ready: torch.Tensor | None = None) -> torch.Tensor:
        if compiling():
            return self._run(x, ready, None, FORWARD, None)
        rt = self.runtime
        log, phase = rt.log(self.label), rt.phase
        hidden = self.hidden and rt.overlap is not None
        if hidden and phase == RECOMPUTE:
            ready = rt.overlap.again(self.edge, RECOMPUTE)
        if self.keep and rt.kept is not None:
            if phase == RECOMPUTE:
                return rt.kept.pop(self.label).requires_grad_(self.differentiable and x.requires_grad)
            out = self._run(x, ready, log, phase, None)
            rt.kept[self.label] = out.detach()
            return out
        reduce = rt.overlap.reducer(self.edge, x.requires_grad) if hidden and phase != RECOMPUTE else None
        return self._run(x, ready, log, phase, reduce)

    def _run(self, x: torch.Tensor, ready: torch.Tensor | None, log: CommLog | None, phase: str,
             reduce: Callable[[torch.Tensor], None] | None) -> torch.Tensor:
        if not self.differentiable:
            return reshard_value(x, self.fwd, log, phase, ready)
        return reshard_ops(x, self.fwd, self.bwd, log, phase, ready, reduce)


class Issue(Named):
    """A hidden edge's forward steps issued ahead on its parameter's piece (``overlap.issue_ahead``)."""

    def __init__(self, edge: EdgeReshard, label: str, ops: tuple[Op, ...], runtime: Runtime) -> None:
        super().__init__("issue", f"{edge.src}_{edge.dst}_{edge.operand}")
        self.label, self.ops, self.runtime = label, ops, runtime

    def __call__(self, piece: torch.Tensor) -> torch.Tensor:
        return overlap_module.issue_ahead(piece, self.ops, self.runtime.log(self.label), FORWARD)


class Call(Named):
    """A traced node's own call (``frontend.call.node_caller``) with the plan's local attributes,
    where the program cannot spell it as the traced target itself (``emit.py``)."""

    def __init__(self, graph: OpGraph, node: OpNode, attrs: Mapping[str, Any]) -> None:
        super().__init__("call", node.name)
        self.call, self.attrs = node_caller(graph, node.name), dict(attrs)

    def __call__(self, *operands: Any) -> Any:
        return self.call(operands, self.attrs)


class CountMean(Call):
    """A mean loss (cross-entropy, NLL) on this rank's targets: local sum / global count of valid targets.

    Dividing each shard's own mean would weigh shards by 1 / their count of targets that are
    not ``ignore_index`` (a causal LM's shifted labels end each row with -100). The count is
    data, not a parameter: it has no gradient; its all-reduce is logged under ``label``.
    """

    def __init__(self, graph: OpGraph, node: OpNode, attrs: Mapping[str, Any], ops: tuple[Op, ...], label: str,
                 runtime: Runtime) -> None:
        super().__init__(graph, node, {**attrs, "reduction": 2})
        self.__name__ = f"mean_over_global_count_{node.name}"
        self.ignore_index = node.attrs.get("ignore_index", -100)
        self.ops, self.label, self.runtime = ops, label, runtime

    def __call__(self, *operands: Any) -> torch.Tensor:
        total = self.call(operands, self.attrs)
        valid = operands[1] != self.ignore_index
        with torch.no_grad():
            count = run_ops(valid.sum().to(total.dtype), self.ops, self.runtime.log(self.label), self.runtime.phase)
        return total / count


class Experts(Named):
    """A mixture-of-experts node on this rank's experts and tokens (``runtime/experts.py``), its
    token exchanges logged under ``label``. Data-dependent (routed split sizes): a compiled
    program runs it outside the graph."""

    def __init__(self, node: OpNode, place: NodePlacement, groups: MeshGroups, label: str, runtime: Runtime) -> None:
        super().__init__("experts", node.name)
        self.node, self.place, self.groups, self.label, self.runtime = node, place, groups, label, runtime

    @torch.compiler.disable
    def __call__(self, *operands: torch.Tensor) -> torch.Tensor:
        return run_experts(operands, self.node, self.place, self.groups, self.runtime.log(self.label))


class CausalRows(Named):
    """Causal attention on this rank's query rows over all keys (``runtime/context.py``)."""

    def __init__(self, node: OpNode, place: NodePlacement, groups: MeshGroups) -> None:
        super().__init__("causal_rows", node.name)
        self.node, self.place, self.groups = node, place, groups

    def __call__(self, *operands: torch.Tensor) -> torch.Tensor:
        return causal_rows_attention(operands, self.node, self.place, self.groups)


class Kept(Named):
    """An op a selective block keeps: every op it dispatches is saved, not recomputed (``KeptOps``)."""

    def __init__(self, inner: Callable[..., Any], name: str, runtime: Runtime) -> None:
        super().__init__("kept", name)
        self.inner, self.runtime = inner, runtime

    def __call__(self, *operands: Any) -> Any:
        if compiling() or self.runtime.policy is None:
            return self.inner(*operands)
        with self.runtime.policy.keeping(True):
            return self.inner(*operands)


class Regathered(Named):
    """An op whose re-gathered parameters (``EdgeReshard.regather``) it saves for backward as
    their pieces, gathered again when the backward needs them (``recompute.Regathering``).
    Called with the op's operands, then the pieces of the ``edges`` (operand index, edge, label, ops).
    Saved-tensor hooks have no compiled form: under ``torch.compile`` the op keeps what it saves
    (the gathered copy, as without re-gathering); the numerics are the same."""

    def __init__(self, inner: Callable[..., Any], name: str, operands: int,
                 edges: list[tuple[int, EdgeReshard, str, tuple[Op, ...]]], runtime: Runtime) -> None:
        super().__init__("regathered", name)
        self.inner, self.operands, self.edges, self.runtime = inner, operands, edges, runtime

    def __call__(self, *args: Any) -> Any:
        operands, pieces = args[:self.operands], args[self.operands:]
        if compiling() or not torch.is_grad_enabled():
            return self.inner(*operands)
        rt = self.runtime
        hooks = Regathering()
        for (k, edge, label, ops), piece in zip(self.edges, pieces):
            again = partial(rt.overlap.again, edge, BACKWARD) if rt.overlap is not None and edge.hidden else None
            hooks.add(operands[k], piece, ops, rt.log(label), again)
        with hooks:
            return self.inner(*operands)


class Scaled(Named):
    """An output (or each floating tensor of a tuple output) times the plan's ``scale``."""

    def __init__(self, name: str, factor: float) -> None:
        super().__init__("scaled", name)
        self.factor = factor

    def __call__(self, out: Any) -> Any:
        if isinstance(out, (tuple, list)):
            return type(out)(self(o) for o in out)
        return out * self.factor if isinstance(out, torch.Tensor) and out.is_floating_point() else out

