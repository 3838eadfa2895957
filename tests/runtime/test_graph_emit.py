"""The Python bindings a lowered program calls for the frequent aten ops (``runtime/graph/emit.py``'s
``_BINDINGS``) compute what the ``OpOverload`` computes, on every number of positional arguments
the table lets through: with the trailing ones omitted (so the binding's own defaults must equal
the schema's) and with all of them given; forward values and gradients bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from autoshard.runtime.graph.emit import _BINDINGS

_aten = torch.ops.aten


def _t(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), requires_grad=True)


SAMPLES: dict[Any, tuple] = {
    _aten.linear.default: (_t(2, 3, 8), _t(5, 8), _t(5)),
    _aten.matmul.default: (_t(2, 3, 4), _t(2, 4, 5)),
    _aten.transpose.int: (_t(2, 3, 4), 0, 2),
    _aten.reshape.default: (_t(2, 3, 4), [6, 4]),
    _aten.unsqueeze.default: (_t(2, 3), 1),
    _aten.flatten.using_ints: (_t(2, 3, 4, 5), 1, 2),
    _aten.chunk.default: (_t(4, 6), 3, 1),
    _aten.cat.default: ([_t(2, 3), _t(1, 3)], 0),
    _aten.add.Tensor: (_t(2, 3), 2.5),
    _aten.sub.Tensor: (_t(2, 3), _t(3)),
    _aten.mul.Tensor: (_t(2, 3), _t(2, 1)),
    _aten.div.Tensor: (_t(2, 3), 4.0),
    _aten.pow.Tensor_Scalar: (_t(2, 3), 2),
    _aten.neg.default: (_t(2, 3),),
    _aten.rsqrt.default: (torch.rand(2, 3, requires_grad=True),),
    _aten.silu.default: (_t(2, 3),),
    _aten.softmax.int: (_t(2, 3), -1, torch.float64),
    _aten.mean.default: (_t(2, 3),),
    _aten.mean.dim: (_t(2, 3), [-1], True),
    _aten.layer_norm.default: (_t(2, 3, 8), [8], _t(8), _t(8), 1e-3, False),
    _aten.embedding.default: (_t(10, 4), torch.tensor([[1, 2, 0], [0, 9, 2]]), 0, False, False),
    _aten.scaled_dot_product_attention.default: (_t(1, 2, 5, 4), _t(1, 2, 5, 4), _t(1, 2, 5, 4), None, 0.0, True),
    _aten.to.dtype: (_t(2, 3), torch.float64, False, True),
    _aten.expand.default: (_t(2, 1), [2, 4]),
    _aten.contiguous.default: (_t(3, 2).t(),),
}


def _required(op: torch._ops.OpOverload) -> int:
    """How many leading positional arguments ``op``'s schema requires (no default)."""
    return sum(1 for a in op._schema.arguments if not a.kwarg_only and not a.has_default_value())


def _run(call: Any, args: tuple) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The outputs of ``call(*args)`` and the gradients of their sum with respect to the float inputs."""
    out = call(*args)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    leaves += [t for a in args if isinstance(a, list) for t in a if isinstance(t, torch.Tensor)]
    grads = torch.autograd.grad(sum(o.double().sum() for o in outs), leaves, allow_unused=True)
    return [o.detach() for o in outs], [g for g in grads if g is not None]


@pytest.mark.parametrize("op", list(_BINDINGS), ids=str)
def test_each_binding_computes_what_its_aten_op_computes(op: torch._ops.OpOverload) -> None:
    kind, binding, most = _BINDINGS[op]
    sample = SAMPLES[op]
    assert len(sample) == most, f"{op}: the sample must give every argument the table lets through"
    for count in sorted({_required(op), most}):
        args = sample[:count]
        call = binding if kind == "call_function" else (lambda *a: getattr(a[0], binding)(*a[1:]))
        (want, want_grads), (got, got_grads) = _run(op, args), _run(call, args)
        assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want)), (op, count)
        assert len(got_grads) == len(want_grads) and all(torch.equal(g, w) for g, w in zip(got_grads, want_grads))
