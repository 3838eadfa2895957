"""Models, traced graphs and plans (data-parallel, Megatron, random) for the executor tests.

Tracing is the slow part (GPT-2 through torch.export takes seconds), so each model is traced
once per session. Any choice of one strategy per problem node is a valid plan, so random
choices are the broadest correctness test the executor has.
"""

from __future__ import annotations

import functools
import random
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils import _pytree as pytree

from autoshard.problem.baselines.megatron import megatron_choice
from autoshard.problem.build import BuildOptions, ModelProblem, build_problem
from autoshard.cost.communication import make_cost_model
from autoshard.frontend.load import load_model
from autoshard.frontend.trace import trace
from autoshard.frontend.graph import NodeKind, OpGraph
from autoshard.sharding.mesh import parse_mesh
from autoshard.problem.plan import Plan
from autoshard.problem.readback import make_plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example_module(name: str):
    """Import examples/<name>.py by path (the examples folder is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MLP = functools.partial(_example_module("mlp").MLP, 16, 32)
"""The seed MLP's structure (fc1 -> GELU -> fc2, with biases) at a CPU-test size."""



class SequenceParallelBlock(nn.Module):
    """Two MLPs joined by a LayerNorm: Megatron with sequence parallelism uses all three DTensor styles."""

    def __init__(self, hidden: int = 16, inner: int = 32) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, inner), nn.Linear(inner, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc3, self.fc4 = nn.Linear(hidden, inner), nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.fc2(torch.nn.functional.gelu(self.fc1(x))))
        return self.fc4(torch.nn.functional.gelu(self.fc3(h)))


class NormMix(nn.Module):
    """fx-traced einsum, eval-mode batch_norm, tensor slicing and max(dim).values in one block."""

    def __init__(self, hidden: int = 16, seq: int = 8) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(hidden, hidden) / hidden**0.5)
        self.gamma, self.beta = nn.Parameter(torch.rand(seq) + 0.5), nn.Parameter(torch.randn(seq))
        self.register_buffer("mean", torch.randn(seq) / 4)
        self.register_buffer("var", torch.rand(seq) + 0.5)
        self.fc = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.einsum("bsd,de->bse", x, self.w)
        h = torch.nn.functional.batch_norm(h, self.mean, self.var, self.gamma, self.beta)
        h = torch.relu(h[:, :4, :]) + h[:, 4:, :]
        return self.fc(h).max(dim=-1).values, h[:, 0, None]


class CausalAttention(nn.Module):
    """Causal self-attention (is_causal SDPA) between two projections: its query rows may be split."""

    def __init__(self, hidden: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.wq, self.wk, self.wv = (nn.Linear(hidden, hidden, bias=False) for _ in range(3))  # a key bias gets no gradient
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (w(x).view(b, s, self.heads, d // self.heads).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        h = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(h.transpose(1, 2).reshape(b, s, d))


@dataclass
class Traced:
    """A model, its example inputs and its graph."""

    name: str
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    graph: OpGraph


def _seeded(cls: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return cls().eval()


def _encoder_layer() -> nn.Module:
    """torch's own TransformerEncoderLayer: nn.MultiheadAttention splits q, k, v with unflatten(-1, ...)."""
    return nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)


@functools.lru_cache(maxsize=None)
def traced(name: str) -> Traced:
    """``tiny_mlp``, ``sp_block``, ``encoder``, ``norm_mix``, ``causal`` (test models, x [8, 8, 16]) or an example's stem
    (``mlp``, ``gpt2`` ...); ``llama+loss`` is the example with its loss (inputs, then targets)."""
    models = {"tiny_mlp": MLP, "sp_block": SequenceParallelBlock, "encoder": _encoder_layer, "norm_mix": NormMix,
              "causal": CausalAttention}
    if name in models:
        model = _seeded(models[name])
        inputs = (torch.randn(8, 8, 16, generator=torch.Generator().manual_seed(1)),)
    else:
        stem, with_loss = name.removesuffix("+loss"), name.endswith("+loss")
        loaded = load_model(str(EXAMPLES / f"{stem}.py"))
        loaded = loaded.for_training() if with_loss else loaded
        model, inputs = loaded.model.eval(), loaded.example_inputs
    return Traced(name, model, inputs, trace(model, inputs))


def problem(t: Traced, mesh: str, mode: str, pins: dict[str, str] | None = None) -> ModelProblem:
    """The sharding problem of a traced model under the alpha-beta cost model."""
    m = parse_mesh(mesh)
    return build_problem(t.graph, m, make_cost_model("alpha-beta", m), BuildOptions(mode=mode, pins=pins or {}))


def data_parallel_choice(mp: ModelProblem) -> list[int]:
    """Parameters replicated, every activation split on its first (batch) dim over all mesh axes."""
    every = tuple(range(mp.mesh.ndim))
    choice = []
    for name in mp.names:
        cand = mp.candidates[name]

        def fits(i: int) -> bool:
            spec = cand.strategies[i].out_spec
            if cand.node.kind in (NodeKind.PARAM, NodeKind.BUFFER):
                return spec.is_replicated
            return spec.ndim > 0 and spec.dims[0] == every and not spec.partial

        options = [i for i in range(len(cand.strategies)) if fits(i)] or range(len(cand.strategies))
        choice.append(min(options, key=lambda i: cand.costs[i]))
    return mp.with_storage_of_users(choice)


def random_choices(mp: ModelProblem, count: int, seed: int) -> list[list[int]]:
    """``count`` distinct uniformly random choices (fewer if the problem has fewer)."""
    rng = random.Random(seed)
    seen: set[tuple[int, ...]] = set()
    for _ in range(20 * count):
        if len(seen) == count:
            break
        drawn = [rng.randrange(mp.problem.num_strategies(i)) for i in range(len(mp.names))]
        seen.add(tuple(mp.with_storage_of_users(drawn)))
    return [list(c) for c in sorted(seen)]


def scaled_choice(mp: ModelProblem, seed: int) -> list[int] | None:
    """A random choice that runs every op it can as a scaled partial (a mean over a sharded dim), or None."""
    rng = random.Random(seed)
    choice, scaled = [], False
    for name in mp.names:
        strategies = mp.candidates[name].strategies
        options = [i for i, s in enumerate(strategies) if s.scale != 1]
        scaled |= bool(options)
        choice.append(rng.choice(options or range(len(strategies))))
    return mp.with_storage_of_users(choice) if scaled else None


def context_parallel_choice(mp: ModelProblem) -> list[int] | None:
    """Data parallelism with every causal attention's query rows split over the last mesh axis
    (and its batch over the others), or None without causal attention."""
    causal = [n for n in mp.names if mp.candidates[n].node.attrs.get("is_causal")]
    if not causal:
        return None
    choice = data_parallel_choice(mp)
    last = mp.mesh.ndim - 1
    for name in causal:
        cand = mp.candidates[name]
        rows = [i for i, s in enumerate(cand.strategies) if s.in_specs[0].dims[-2] == (last,)]
        choice[mp.names.index(name)] = min(rows, key=lambda i: cand.costs[i])
    return mp.with_storage_of_users(choice)


def plans(t: Traced, mesh: str, mode: str, n_random: int, data_parallel: bool = False) -> dict[str, Plan]:
    """Megatron (and data-parallel) plus random plans (one with scaled means if the model has means, one
    splitting causal attention's rows if it has some), by label."""
    mp = problem(t, mesh, mode)
    seed = zlib.crc32(f"{t.name} {mesh} {mode}".encode())
    chosen = {"megatron": megatron_choice(mp)}
    if data_parallel:
        chosen["data-parallel"] = data_parallel_choice(mp)
    for k, choice in enumerate(random_choices(mp, n_random, seed)):
        chosen[f"random{k}"] = choice
    scaled = scaled_choice(mp, seed)
    if scaled is not None:
        chosen["random-scaled"] = scaled
    rows = context_parallel_choice(mp)
    if rows is not None:
        chosen["context-parallel"] = rows
    return {label: make_plan(mp, choice, model=t.name) for label, choice in chosen.items()}


def sequence_parallel_plan(t: Traced, mesh: str, mode: str) -> Plan:
    """Megatron with the LayerNorm of ``sp_block`` run sequence-parallel (reduce-scatter in, all-gather out)."""
    mp = problem(t, mesh, mode, pins={"layer_norm": "RSR"})
    return make_plan(mp, megatron_choice(mp), model=t.name)


def loss_weights(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The fixed random R of loss = sum(output * R), one per output."""
    gen = torch.Generator().manual_seed(2)
    return [torch.randn(o.shape, generator=gen) for o in outputs]


def reference(t: Traced, training: bool) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """The unsharded model's outputs and (training) parameter gradients under loss = sum(output * R)."""
    t.model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(training):
        outputs = pytree.tree_leaves(t.model(*t.inputs))
    grads = {}
    if training:
        sum((o * w).sum() for o, w in zip(outputs, loss_weights(outputs))).backward()
        grads = {name: p.grad.clone() for name, p in t.model.named_parameters()}
        t.model.zero_grad(set_to_none=True)
    return [o.detach() for o in outputs], grads


def batch_pins(t: Traced) -> dict[str, str]:
    """Pins for data parallelism along axis 0 of a 2-D mesh: the inputs and every op that reads a parameter
    cut on dim 0 (where it divides), the rest left to the solver."""
    pins = {n.name: "S0" + "R" * (len(n.tensor.shape) - 1) for n in t.graph
            if n.kind == NodeKind.INPUT and n.tensor is not None}
    for node in t.graph:
        reads_param = any(t.graph[src].kind == NodeKind.PARAM for src in node.inputs)
        if node.kind == NodeKind.OP and reads_param and node.tensor is not None and node.tensor.shape \
                and node.tensor.shape[0] % 2 == 0:
            pins[node.name] = "S0" + "R" * (len(node.tensor.shape) - 1)
    return pins


def megatron_pins(t: Traced, row_parallel: tuple[str, ...]) -> dict[str, str]:
    """torchtitan's tensor-parallel plan on axis 1 of a 2x2 mesh with the batch on axis 0, as pins: every
    nn.Linear column-parallel (weight S1R, output S0..S1) except the modules named in ``row_parallel``
    (weight RS1, output a partial sum over axis 1), the norms' outputs and the inputs cut on the batch."""
    pins = {name: spec for name, spec in batch_pins(t).items() if t.graph[name].op != "linear"}
    for node in t.graph:
        if node.op == "linear" and t.graph[node.inputs[1]].kind == NodeKind.PARAM:
            weight = t.graph[node.inputs[1]].qualname
            middle = "R" * (len(node.tensor.shape) - 2)
            row = weight.rpartition(".")[0].rpartition(".")[2] in row_parallel
            pins[weight] = "RS1" if row else "S1R"
            pins[node.name] = f"S0{middle}RP1" if row else f"S0{middle}S1"
    return pins
