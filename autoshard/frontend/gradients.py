"""Which tensors of a traced graph receive a gradient, and through which operands it flows.

A plan charges (and the runtime runs) a backward reshard on an edge only if a gradient comes
back through it. Structure alone over-approximates: an op reading a tensor only for its shape
(``zeros_like(x)``, ``x.new_zeros(...)``, Swin's attention-mask construction) has a float output
computed from a tensor that requires grad, yet autograd sends nothing back through it. So
:func:`mark_gradients` replays the graph once on fake tensors (no memory, no compute) with
autograd on, parameters requiring grad as the model's do, and differentiates every float output
with respect to a distinct view of each operand of each op:

- ``OpNode.requires_grad`` of an op becomes True exactly when its output receives a gradient;
- ``OpNode.no_grad_operands`` lists the operands through which none flows although their
  producer requires grad.

The outputs are all differentiated, as ``autoshard.run`` does with ``loss = sum(output * R)``.
When the replay fails (an op without a fake-tensor kernel, a data-dependent shape) the
structural flags stay: a plan may then list backward collectives that never run.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autoshard.frontend.call import node_caller
from autoshard.frontend.graph import NodeKind, OpGraph


def mark_gradients(graph: OpGraph) -> bool:
    """Set ``requires_grad`` and ``no_grad_operands`` of the graph's ops from a fake autograd replay.

    Returns False (flags untouched) when the replay fails.
    """
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode, warnings.catch_warnings(), \
                contextlib.redirect_stderr(io.StringIO()), torch.enable_grad():
            warnings.simplefilter("ignore")
            flows, receives = _replay(graph, mode)
    except Exception:  # noqa: BLE001 - any failure keeps the structural flags, which only over-approximate
        return False
    for node in graph:
        if node.kind is NodeKind.OP:
            node.requires_grad = receives.get(node.name, False)
            node.no_grad_operands = frozenset(k for k, src in enumerate(node.inputs)
                                              if graph[src].requires_grad and not flows.get((node.name, k), False))
    return True


def _replay(graph: OpGraph, mode: FakeTensorMode) -> tuple[dict[tuple[str, int], bool], dict[str, bool]]:
    """Per (op, operand) whether a gradient flows through it; per op whether its output receives one."""
    values: dict[str, Any] = {}
    probes: dict[tuple[str, int], torch.Tensor] = {}
    outputs: list[torch.Tensor] = []
    state = {node.name: node_caller(graph, node.name)([], {}) for node in graph
             if node.kind in (NodeKind.PARAM, NodeKind.BUFFER)}
    device = next((t.device for t in state.values()), torch.device("cpu"))  # inputs live with the weights
    for node in graph:
        if node.kind is NodeKind.INPUT:
            meta = node.tensor
            values[node.name] = torch.zeros(meta.shape, dtype=getattr(torch, meta.dtype), device=device)
        elif node.kind in (NodeKind.PARAM, NodeKind.BUFFER):
            live = state[node.name]
            values[node.name] = mode.from_tensor(live.detach()).requires_grad_(live.requires_grad)
        elif node.kind is NodeKind.OUTPUT:
            outputs = [values[src] for src in node.inputs]
        else:
            operands = []
            for k, src in enumerate(node.inputs):
                value = values[src]
                if node.op == "getitem" and isinstance(value, (tuple, list)):
                    value = value[node.attrs.get("index", 0)]
                if isinstance(value, torch.Tensor) and value.requires_grad:
                    value = value.view_as(value)  # a distinct autograd node: the gradient through this edge
                    probes[(node.name, k)] = value
                operands.append(value)
            if node.op == "getitem" and isinstance(values[node.inputs[0]], (tuple, list)):
                values[node.name] = operands[0]
            else:
                values[node.name] = node_caller(graph, node.name)(operands, {})
    differentiated = [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
    keys = list(probes)
    grads = torch.autograd.grad(differentiated, [probes[k] for k in keys],
                                grad_outputs=[torch.ones_like(o) for o in differentiated], allow_unused=True) \
        if differentiated and keys else [None] * len(keys)
    flows = {key: grad is not None for key, grad in zip(keys, grads)}
    receives: dict[str, bool] = {}
    for (dst, k), flowing in flows.items():
        if flowing:
            receives[graph[dst].inputs[k]] = True
    output = next(n for n in graph if n.kind is NodeKind.OUTPUT)
    for src, value in zip(output.inputs, outputs):
        if isinstance(value, torch.Tensor) and value.requires_grad:
            receives[src] = True
    return flows, receives
