"""torchao's Float8 training on a lowered plan (``autoshard.train --float8 tensorwise|rowwise``).

torchao converts modules (``convert_to_float8_training`` swaps ``nn.Linear`` for ``Float8Linear``),
and a ``Float8Linear`` does not trace into the op graph the planner and the runtime share. So the
model is traced and planned in bf16 as it is, and the conversion is made on the lowered program
instead: every linear the cost model prices as converted (``cost.float8.converted``: both weight
dims divisible by 16, the vocabulary projection left in bf16, torchtitan's filter) has its call
swapped for the computation ``Float8Linear.forward`` runs,

    y = matmul_with_hp_or_float8_args(x, w^T, linear_mm_config, config) (+ b),

torchao's own autograd function: each GEMM operand cast to float8 with the recipe's scales, the
three GEMMs (output, input gradient, weight gradient) on ``torch._scaled_mm``. The swapped call
runs on this rank's local pieces, so a sharded weight or input is scaled by its own piece's
abs-max (a tensorwise scale per shard, at least as fine as one global scale); on one rank it is
exactly torchao's converted model. The program stays one fx graph, so ``torch.compile`` compiles
it as torchtitan compiles torchao's modules.

On a device without float8 GEMMs (CPU) the calls run torchao's emulation (``emulate=True``: the
same casts, the products in fp32), which is what the tests check against torchao's converted
module; ``autoshard.train`` refuses ``--float8`` there in one line (``cli/train.py``).
Not run here: FSDP all-gathers of weights in float8 (the cost model prices torchtitan's
``enable_fsdp_float8_all_gather``; this runtime gathers the bf16 weight and casts its copy).
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any, Iterator

import torch
import torch.fx as fx

from autoshard.cost.float8 import RECIPES, converted
from autoshard.errors import AutoshardError
from autoshard.frontend.graph import OpGraph
from autoshard.runtime.graph.calls import Call, Named

_LINEAR_TARGETS = frozenset({torch.nn.functional.linear, torch._C._nn.linear, torch.ops.aten.linear.default})
"""The targets a traced linear's call is spelled with in a lowered program (``graph/emit.py``)."""


def _config(recipe: str, emulate: bool) -> Any:
    """torchao's ``Float8LinearConfig`` of ``recipe``, emulated (fp32 products) or not."""
    from torchao.float8 import Float8LinearConfig

    return replace(Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)


def _mm_config(config: Any) -> Any:
    """The ``LinearMMConfig`` ``Float8Linear.__init__`` builds from ``config`` (one per GEMM)."""
    from torchao.float8.float8_training_tensor import LinearMMConfig, ScaledMMConfig

    return LinearMMConfig(*(ScaledMMConfig(config.emulate, gemm.use_fast_accum, False, config.pad_inner_dim)
                            for gemm in (config.gemm_config_output, config.gemm_config_grad_input,
                                         config.gemm_config_grad_weight)))


class Float8Call(Named):
    """A converted linear's call: ``Float8Linear.forward`` on (input, weight, bias) pieces (module doc).
    Emulated on tensors off CUDA, torchao's float8 GEMMs on CUDA."""

    def __init__(self, name: str, recipe: str) -> None:
        super().__init__("float8_linear", name)
        from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

        self.matmul = matmul_with_hp_or_float8_args
        emulated, native = _config(recipe, True), _config(recipe, False)
        # by whether the products are emulated: (config, its LinearMMConfig)
        self.configs = {True: (emulated, _mm_config(emulated)), False: (native, _mm_config(native))}

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        config, mm_config = self.configs[not x.is_cuda]
        out = self.matmul.apply(x, weight.t(), mm_config, config)
        return out if bias is None else out + bias.to(out.dtype)


def _modules(module: fx.GraphModule) -> Iterator[fx.GraphModule]:
    """The program and every GraphModule under it (its recomputed blocks)."""
    yield module
    for child in module.modules():
        if child is not module and isinstance(child, fx.GraphModule):
            yield child


def _linear_operands(node: fx.Node) -> tuple[Any, ...]:
    """(input, weight, bias) of a lowered ``linear(input, weight, bias=None)`` call."""
    args = list(node.args) + [None] * (3 - len(node.args))
    return args[0], node.kwargs.get("weight", args[1]), node.kwargs.get("bias", args[2])


def _swap(node: fx.Node, call: Float8Call) -> bool:
    """Run ``call`` where ``node`` ran its linear: its own target, or the traced call a wrapper
    (``calls.Kept``, ``calls.Regathered``: their ``inner``) runs, the wrapper keeping its part (a
    re-gathered weight's transposed view is saved and restored by its storage, as any view); False
    when it is neither."""
    if node.target in _LINEAR_TARGETS:
        node.target, node.args, node.kwargs = call, _linear_operands(node), {}
        return True
    if isinstance(node.target, Call):
        node.target = call
        return True
    owner = node.target
    while hasattr(owner, "inner"):
        if isinstance(owner.inner, Call):
            owner.inner = call
            return True
        owner = owner.inner
    return False


def convert_program(module: fx.GraphModule, graph: OpGraph, recipe: str) -> list[str]:
    """Swap, in a lowered ``module`` of ``graph`` (and its recomputed blocks), each converted linear's
    call for :class:`Float8Call`; returns the names of the linears swapped, in graph order."""
    if recipe not in RECIPES:
        raise AutoshardError(f"--float8 {recipe!r} is not a recipe: use one of {', '.join(RECIPES)}")
    if importlib.util.find_spec("torchao") is None:
        raise AutoshardError("--float8 needs torchao: pip install 'autoshard[float8]', or drop --float8")
    wanted = [node.name for node in graph if converted(graph, node)]
    if not wanted:
        raise AutoshardError("--float8: the model has no linear torchao converts (weights with both dims divisible "
                             "by 16, other than the output projection): drop --float8")
    names = set(wanted)
    swapped = set()
    for gm in _modules(module):
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.name in names and _swap(node, Float8Call(node.name, recipe)):
                swapped.add(node.name)
        gm.recompile()
    if missing := [name for name in wanted if name not in swapped]:
        raise AutoshardError(f"--float8: the lowered program has no plain call of linear {missing[0]} to convert "
                             f"({len(missing)} of {len(wanted)}): train without --float8")
    return wanted
