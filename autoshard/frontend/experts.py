"""Mixture-of-experts layers as one graph node: ``moe_experts(hidden, top_k_index, top_k_weights, gate_up, down)``.

Hugging Face's expert modules (transformers 5: Mixtral, Qwen2-MoE, ... decorated with
``use_experts_implementation``) trace to some twenty ops: a sort of the token-expert pairs, a
gather of their rows, ``histc`` counts and their ``cumsum``, two grouped matmuls, the gated
activation, an inverse permutation written by ``index_put`` and a sum over the top-k copies.
Taken one by one, these ops only shard in ways that keep the sorted rows whole; taken together
they are a per-token computation, ``out[t] = sum_j w[t, j] * Expert_{idx[t, j]}(x[t])``, which
is what expert parallelism distributes. :func:`fuse_experts` replaces each such module's nodes
by one ``moe_experts`` node (rule in specs/ops.toml), called as :func:`moe_experts`:

- rows of the pairs in expert order (``sort``, a gather), counts per expert, their ends;
- ``gate_up`` then the gated activation then ``down`` as grouped matmuls (:func:`grouped_mm`,
  an op with a fake kernel and a flop formula, so torch's profiler measures the node like any
  other: static shapes, ``2 * rows * k * n`` flops per grouped matmul);
- each row times its routing weight, added back to its token (``index_add``).

``first_expert`` makes the same function run a slice of the experts (the others' pairs add
nothing): the local computation of an expert-sharded layout. Only modules whose computation is
exactly this (gate and up concatenated, no biases, weights not transposed, no post-expert
norm, an activation this module knows, checked on sample values) are fused; others keep their
traced ops.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake
from torch.utils.flop_counter import register_flop_formula

from autoshard.frontend.call import NODE_CALLS_KEY, NodeCall, Operand
from autoshard.frontend.graph import EXPERTS_OP, NodeKind, OpGraph, OpNode, TensorMeta

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
}
"""Gate activations a fused node may name (``activation`` attribute)."""


def _kernel_takes(*tensors: torch.Tensor) -> bool:
    """``torch._grouped_mm`` runs these operands: one dtype its kernel has (float32 or bfloat16 on CPU,
    bfloat16 on CUDA) and every stride but the unit one, and the data, on 16-byte boundaries."""
    first = tensors[0]
    kinds = (torch.float32, torch.bfloat16) if first.device.type == "cpu" else (torch.bfloat16,)
    if not hasattr(torch, "_grouped_mm") or first.dtype not in kinds or first.device.type not in ("cpu", "cuda"):
        return False
    return all(t.dtype == first.dtype and t.data_ptr() % 16 == 0
               and all(stride == 1 or stride * t.element_size() % 16 == 0 for stride in t.stride())
               for t in tensors)


@torch.library.custom_op("autoshard::grouped_mm", mutates_args=())
def grouped_mm(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Rows ``ends[g-1]:ends[g]`` of ``x`` [R, K] times ``w[g]`` [K, N]; rows past ``ends[-1]`` give zeros.

    What ``torch._grouped_mm`` computes, in any dtype and for any strides: its kernel where it takes
    the operands (``_kernel_takes``), which leaves the rows past the last group unwritten, else a
    loop over the groups.
    """
    if _kernel_takes(x, w):
        out = torch._grouped_mm(x, w, offs=ends.to(torch.int32))
        out[int(ends[-1]):] = 0
        return out
    out = x.new_zeros(x.shape[0], w.shape[2])
    start = 0
    for g, end in enumerate(ends.tolist()):
        if end > start:
            out[start:end] = x[start:end] @ w[g]
        start = end
    return out


@grouped_mm.register_fake
def _grouped_mm_fake(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[2])


@torch.library.custom_op("autoshard::grouped_mm_backward", mutates_args=())
def grouped_mm_backward(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor,
                        grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`grouped_mm` with respect to ``x`` and ``w`` (the kernel where it takes them:
    ``grad`` times each group's ``w[g]`` transposed, and ``x`` transposed times ``grad`` grouped along
    the rows)."""
    wt, xt = w.transpose(1, 2), x.t()
    if _kernel_takes(grad, wt) and _kernel_takes(xt, grad):
        offs = ends.to(torch.int32)
        grad_x = torch._grouped_mm(grad, wt, offs=offs)
        grad_x[int(ends[-1]):] = 0
        grad_w = torch._grouped_mm(xt, grad, offs=offs)
        empty = torch.diff(ends, prepend=ends.new_zeros(1)) == 0
        if bool(empty.any()):
            grad_w[empty] = 0
        return grad_x, grad_w
    grad_x, grad_w = torch.zeros_like(x), torch.zeros_like(w)
    start = 0
    for g, end in enumerate(ends.tolist()):
        if end > start:
            grad_x[start:end] = grad[start:end] @ w[g].T
            grad_w[g] = x[start:end].T @ grad[start:end]
        start = end
    return grad_x, grad_w


@grouped_mm_backward.register_fake
def _grouped_mm_backward_fake(x, w, ends, grad):
    return torch.empty_like(x), torch.empty_like(w)


def _setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, w, ends = inputs
    ctx.save_for_backward(x, w, ends)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    x, w, ends = ctx.saved_tensors
    grad_x, grad_w = grouped_mm_backward(x, w, ends, grad.contiguous())
    return grad_x, grad_w, None


grouped_mm.register_autograd(_backward, setup_context=_setup)


def _grouped_mm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """2 * rows * k * n: every row of ``a`` meets one group's [k, n] matrix (all rows counted)."""
    if len(a_shape) == 2 and len(b_shape) == 2:  # groups along k (a weight gradient): k summed once
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    rows = a_shape[0] if len(a_shape) == 2 else a_shape[0] * a_shape[1]
    return 2 * rows * a_shape[-1] * b_shape[-1]


def _grouped_mm_backward_flops(x_shape, w_shape, ends_shape, grad_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * _grouped_mm_flops(x_shape, w_shape)


@functools.cache
def register_grouped_mm_flops() -> None:
    """Flop formulas for the grouped matmuls torch's counter does not know: ours, ``aten._grouped_mm``
    and transformers' CPU fallback (when transformers has registered it)."""
    register_flop_formula(torch.ops.autoshard.grouped_mm)(_grouped_mm_flops)
    register_flop_formula(torch.ops.autoshard.grouped_mm_backward)(_grouped_mm_backward_flops)
    register_flop_formula(torch.ops.aten._grouped_mm)(_grouped_mm_flops)
    try:
        fallback = torch.ops.transformers.grouped_mm_fallback
        fallback_backward = torch.ops.transformers.grouped_mm_fallback_backward
    except (AttributeError, RuntimeError):
        return
    register_flop_formula(fallback)(_grouped_mm_flops)
    register_flop_formula(fallback_backward)(_grouped_mm_backward_flops)


def _eager_kernel(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> bool:
    """Real tensors outside torch.compile whose matmuls the kernel takes: ``torch._grouped_mm`` then
    runs with its own autograd (the custom op stands in for it under fake tensors and compile)."""
    return (not is_fake(x) and not torch.compiler.is_compiling()
            and _kernel_takes(x, gate_up.transpose(1, 2)) and _kernel_takes(x, down.transpose(1, 2)))


def _kernel_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ends: torch.Tensor,
                activation: str) -> torch.Tensor:
    """:func:`expert_mlp` on ``torch._grouped_mm``. The kernel leaves rows past the last group unwritten,
    forward and backward: the rows are masked before the first matmul (whose backward then zeros
    their gradient) and after the second."""
    offs = ends.to(torch.int32)
    counted = (torch.arange(x.shape[0], device=x.device) < ends[-1]).unsqueeze(1)
    h = torch._grouped_mm(torch.where(counted, x, 0), gate_up.transpose(1, 2), offs=offs)
    gate, up = h.chunk(2, dim=-1)
    h = (ACTIVATIONS[activation](gate) * up).to(down.dtype)
    y = (torch._grouped_mm(h, down.transpose(1, 2), offs=offs) if _kernel_takes(h, down.transpose(1, 2))
         else grouped_mm(h, down.transpose(1, 2), ends))
    return torch.where(counted, y, 0)


def expert_mlp(rows: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ends: torch.Tensor,
               activation: str) -> torch.Tensor:
    """``down_g(act(gate_g r) * up_g r)`` for the rows of each expert g (rows sorted by expert, ``ends``
    their cumulative counts; rows past the last give zeros); ``gate_up`` [E, 2I, H] holds gate then
    up, ``down`` [E, H, I]."""
    x = rows.to(gate_up.dtype)
    if _eager_kernel(x, gate_up, down):
        return _kernel_mlp(x, gate_up, down, ends, activation)
    h = grouped_mm(x, gate_up.transpose(1, 2), ends)
    gate, up = h.chunk(2, dim=-1)
    h = ACTIVATIONS[activation](gate) * up
    return grouped_mm(h.to(down.dtype), down.transpose(1, 2), ends)


def moe_experts(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, gate_up: torch.Tensor,
                down: torch.Tensor, activation: str = "silu", first_expert: int = 0) -> torch.Tensor:
    """``out[t] = sum_j top_k_weights[t, j] * Expert_{top_k_index[t, j]}(hidden[t])`` over the experts
    ``first_expert ..`` that ``gate_up``/``down`` hold (pairs routed elsewhere add nothing).

    Static shapes throughout (every pair keeps a row; pairs of other experts sort last, past the
    counted rows), so fake and meta tensors run it: torch measures its flops and saved tensors.
    """
    tokens, k = top_k_index.shape
    held = gate_up.shape[0]
    ids = top_k_index.reshape(-1) - first_expert
    mine = (ids >= 0) & (ids < held)
    _, order = torch.sort(torch.where(mine, ids, held), stable=True)
    counts = torch.zeros(held + 1, dtype=torch.long, device=ids.device).scatter_add_(
        0, torch.where(mine, ids, held), torch.ones_like(ids))[:held]
    token = order // k
    y = expert_mlp(hidden[token], gate_up, down, counts.cumsum(0), activation)
    weighted = y * top_k_weights.reshape(-1)[order].unsqueeze(-1)
    out = weighted.new_zeros(tokens, hidden.shape[-1]).index_add(0, token, weighted)
    return out.to(hidden.dtype)


def _activation_name(module: torch.nn.Module) -> str | None:
    """The name in ACTIVATIONS of the module's ``act_fn``, checked on sample values, or None."""
    act = getattr(module, "act_fn", None)
    if not callable(act):
        return None
    sample = torch.linspace(-4.0, 4.0, 33, dtype=torch.float64)
    with torch.no_grad():
        try:
            got = act(sample)
        except Exception:  # noqa: BLE001 - an activation that cannot run on a CPU tensor is not ours
            return None
    return next((name for name, fn in ACTIVATIONS.items() if torch.allclose(got, fn(sample), rtol=0, atol=1e-12)),
                None)


def experts_activation(module: torch.nn.Module) -> str | None:
    """The gate activation of a Hugging Face experts module whose forward :func:`moe_experts` computes
    exactly, or None for any other module."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not (isinstance(gate_up, torch.nn.Parameter) and isinstance(down, torch.nn.Parameter)):
        return None
    flags = {"has_gate": True, "has_bias": False, "is_transposed": False, "is_concatenated": True,
             "has_post_expert_norm": False}
    if any(getattr(module, name, None) is not value for name, value in flags.items()):
        return None
    if getattr(getattr(type(module), "_apply_gate", None), "__name__", "") != "_default_apply_gate":
        return None
    experts, inner, hidden = gate_up.shape if gate_up.dim() == 3 else (0, 0, 0)
    if down.shape != (experts, hidden, inner // 2) or inner % 2:
        return None
    return _activation_name(module)


def fuse_experts(graph: OpGraph, model: torch.nn.Module) -> list[str]:
    """Replace the traced ops of every fusable experts module by one ``moe_experts`` node.

    The node keeps the name of the module's result (its consumers are unchanged) and reads the
    module's three inputs and two weights. A module whose traced ops do not form one region
    with exactly those inputs and one result is left as traced. Returns the fused module paths.
    """
    fused = []
    for path, module in model.named_modules():
        activation = experts_activation(module)
        if activation is not None and _fuse_one(graph, path, activation):
            fused.append(path)
    return fused


def _fuse_one(graph: OpGraph, path: str, activation: str) -> bool:
    """Fuse the ops of module ``path``; False (graph unchanged) when they do not fit."""
    region = [n for n in graph if n.kind == NodeKind.OP and (n.module == path or n.module.startswith(path + "."))]
    inside = {n.name for n in region}
    params = {graph[s].qualname: s for n in region for s in n.inputs if graph[s].kind == NodeKind.PARAM}
    gate_up, down = params.get(f"{path}.gate_up_proj"), params.get(f"{path}.down_proj")
    external = list(dict.fromkeys(s for n in region for s in n.inputs if s not in inside))
    results = [n for n in region if any(n.name in u.inputs for u in graph if u.name not in inside)]
    if gate_up is None or down is None or len(results) != 1 or len(external) != 5:
        return False
    weight_shape = graph[gate_up].tensor.shape
    activations = [s for s in external if s not in (gate_up, down)]
    roles = _roles([graph[s].tensor for s in activations], weight_shape[2])
    if roles is None:
        return False
    hidden, index, weights = (activations[r] for r in roles)
    result = results[0]
    node = OpNode(result.name, NodeKind.OP, "autoshard.moe_experts", op=EXPERTS_OP,
                  inputs=(hidden, index, weights, gate_up, down), attrs={"activation": activation},
                  out=result.out, module=path, requires_grad=result.requires_grad)
    graph.nodes = {name: (node if name == result.name else n) for name, n in graph.nodes.items()
                   if name not in inside or name == result.name}
    calls: dict[str, NodeCall] = graph.module.meta[NODE_CALLS_KEY]
    for name in inside:
        calls.pop(name, None)
    calls[result.name] = NodeCall(moe_experts, tuple(Operand(i) for i in range(5)), {"activation": activation},
                                  slots={"activation": "activation"})
    return True


def _roles(metas: list[TensorMeta | None], hidden_size: int) -> tuple[int, int, int] | None:
    """Positions of (hidden [T, H], top-k index [T, k] integer, top-k weights [T, k] float), or None."""
    if any(m is None or len(m.shape) != 2 for m in metas):
        return None
    index = [i for i, m in enumerate(metas) if not m.is_float]
    floats = [i for i, m in enumerate(metas) if m.is_float]
    if len(index) != 1 or len(floats) != 2:
        return None
    k = metas[index[0]].shape
    hidden = [i for i in floats if metas[i].shape[1] == hidden_size and metas[i].shape != k]
    weights = [i for i in floats if metas[i].shape == k]
    if len(hidden) != 1 or len(weights) != 1 or hidden == weights or metas[hidden[0]].shape[0] != k[0]:
        return None
    return hidden[0], index[0], weights[0]
