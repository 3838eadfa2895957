"""--async-tp pricing (cost/async_tp.py): torch's micro-pipelined collectives, where its pass fuses them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn
from torch._inductor.fx_passes.micro_pipeline_tp import _find_consumer_matmuls, _find_producer_matmul
from torch.fx.experimental.proxy_tensor import make_fx

from autoshard.api import build_model_problem
from autoshard.cost.async_tp import (Gemms, fused_exposed, fused_step, fuses, gather_matmul_ticks,
                                     matmul_scatter_ticks, pipelined_exposed)
from autoshard.cost.devices import get_device
from autoshard.frontend.trace import trace
from autoshard.problem.baselines.megatron import megatron_choice
from autoshard.problem.build import ModelProblem
from autoshard.sharding.reshard import ALL_GATHER, REDUCE_SCATTER, reshard_steps
from autoshard.sharding.spec import TensorSpec


@dataclass(frozen=True)
class Op:
    """One kernel or copy as torch issues it: its stream, the resource it occupies, how long, and
    the ops it waits for besides its stream's previous op."""

    name: str
    stream: int
    resource: str
    duration: int
    waits: tuple[str, ...] = ()


def simulate(ops: list[Op]) -> int:
    """Brute force: the end of the last op when each stream runs in issue order, each resource
    (the SMs, the link, HBM) runs one op at a time, and a free resource takes the op that can start
    first (ties: the one ready first, then the one issued first)."""
    end: dict[str, int] = {}
    last_on_stream: dict[int, str] = {}
    after: dict[str, tuple[str, ...]] = {}
    for op in ops:
        after[op.name] = op.waits + ((last_on_stream[op.stream],) if op.stream in last_on_stream else ())
        last_on_stream[op.stream] = op.name
    free: dict[str, int] = {}
    pending = list(ops)
    while pending:
        ready = [(op, max((end[w] for w in after[op.name]), default=0)) for op in pending
                 if all(w in end for w in after[op.name])]
        op, at = min(ready, key=lambda r: (max(r[1], free.get(r[0].resource, 0)), r[1], pending.index(r[0])))
        start = max(at, free.get(op.resource, 0))
        end[op.name] = free[op.resource] = start + op.duration
        pending.remove(op)
    return max(end.values())


def gather_ops(parts: int, chunk: int, transfer: int, copy: int) -> list[Op]:
    """``_pipelined_all_gather_and_consume`` on one rank: the shard copied into the symmetric buffer
    (compute stream 0), the local chunk's products, then remote chunk k's copy and products on
    stream 1 for odd k, stream 0 for even k (the second stream waits for the first copy)."""
    ops = [Op("mv", 0, "hbm", copy), Op("mm0", 0, "sm", chunk)]
    for k in range(1, parts):
        stream = k % 2
        ops += [Op(f"cp{k}", stream, "link", transfer, ("mv",)), Op(f"mm{k}", stream, "sm", chunk)]
    return ops


def scatter_ops(parts: int, chunk: int, transfer: int, reduction: int) -> list[Op]:
    """``_pipelined_produce_and_all2all`` on one rank: step k's products and pull on stream 1 for odd
    k, stream 0 for even k (barriers between symmetric ranks wait for nothing), this rank's own
    chunk on stream 0, then the sum of the stacked partials once stream 0 has waited for stream 1."""
    ops: list[Op] = []
    for k in range(1, parts):
        stream = k % 2
        ops += [Op(f"mm{k}", stream, "sm", chunk), Op(f"cp{k}", stream, "link", transfer)]
    ops.append(Op("mm0", 0, "sm", chunk))
    ops.append(Op("sum", 0, "hbm", reduction, tuple(op.name for op in ops if op.stream == 1)))
    return ops


ticks = st.integers(0, 10**6)


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 9), ticks, ticks, ticks)
def test_gather_formula_is_the_simulated_timeline(parts: int, chunk: int, transfer: int, copy: int) -> None:
    """copy + g + (n - 1) max(g, c) is when torch's all-gather + matmul pipeline ends."""
    assert gather_matmul_ticks(chunk, transfer, parts, copy) == simulate(gather_ops(parts, chunk, transfer, copy))


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 9), ticks, ticks, ticks)
def test_scatter_formula_is_the_simulated_timeline(parts: int, chunk: int, transfer: int, reduction: int) -> None:
    """g + (n - 1) max(g, c) + (n mod 2) min(g, c) + reduction is when torch's matmul +
    reduce-scatter pipeline ends (for odd n the own chunk waits for the last pull on its stream)."""
    assert matmul_scatter_ticks(chunk, transfer, parts, reduction) == simulate(
        scatter_ops(parts, chunk, transfer, reduction))


def test_fused_steps_are_one_gather_or_scatter_torch_takes() -> None:
    """One all-gather or reduce-scatter (slices aside) fuses; an all-reduce or a reshard of two
    collectives does not; along the last dim only unscaled, and a gathered shard 1024 wide or more."""
    mesh = (2, 8)
    seq, last = TensorSpec(((), (1,), ())), TensorSpec(((), (), (1,)))
    partial = TensorSpec(((), (), ()), frozenset({1}))
    whole = TensorSpec.replicated(3)

    def step(src: TensorSpec, dst: TensorSpec, kind: str, scaled: bool = False, wide: int = 8 * 1024) -> bool:
        return fused_step(reshard_steps(src, dst, (4, 2048, wide), 2, mesh), (4, 2048, wide), mesh, kind,
                          scaled) is not None

    assert step(seq, whole, ALL_GATHER) and step(seq, whole, ALL_GATHER, scaled=True)
    assert step(partial, seq, REDUCE_SCATTER) and step(partial, seq, REDUCE_SCATTER, scaled=True)
    assert not step(seq, whole, REDUCE_SCATTER) and not step(partial, whole, REDUCE_SCATTER)
    assert step(last, whole, ALL_GATHER) and not step(last, whole, ALL_GATHER, scaled=True)
    assert not step(last, whole, ALL_GATHER, wide=8 * 1023)
    assert step(partial, last, REDUCE_SCATTER) and not step(partial, last, REDUCE_SCATTER, scaled=True)
    both = TensorSpec(((0,), (1,), ()))
    assert not step(both, whole, ALL_GATHER)


def test_biased_linear_is_not_fused_as_torch_matches() -> None:
    """Independent reference: torch's pass finds a bias-free linear among the matmuls consuming its
    input (one mm) and no biased one (an addmm); ``fuses`` agrees on the node our frontend traces."""
    for bias in (False, True):
        layer, x = nn.Linear(16, 4, bias=bias), torch.randn(8, 16)
        placeholder = next(n for n in make_fx(layer)(x).graph.nodes if n.op == "placeholder"
                           and tuple(n.meta["val"].shape) == (8, 16))
        (node,) = [n for n in trace(layer, (x,)).nodes.values() if n.op == "linear"]
        assert (len(_find_consumer_matmuls(placeholder)) == 1) == fuses(node) == (not bias)


def test_gathered_output_gradient_feeds_only_the_input_gradient_product() -> None:
    """Independent reference: in a linear's backward, the output gradient (what a row-parallel
    output's reduce-scatter gathers back) is the left operand of the input-gradient product only
    (the weight gradient reads its transpose): the gather hides under half the backward."""
    def step(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(nn.functional.linear(x, w), (x, w), dy)

    graph = make_fx(step)(torch.randn(8, 16, requires_grad=True), torch.randn(4, 16, requires_grad=True),
                          torch.randn(8, 4)).graph
    dy = [n for n in graph.nodes if n.op == "placeholder"][-1]
    (matmul,) = _find_consumer_matmuls(dy)
    assert tuple(matmul.nodes[0].meta["val"].shape) == (8, 16)  # dX = dY W


H100 = get_device("h100")


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([2, 4, 8]), st.integers(10**6, 10**13), st.integers(10**6, 10**10), st.integers(0, 10**9))
def test_pipelined_exposes_at_least_the_unhidden_transfer(parts: int, flops: int, nbytes: int, price: int) -> None:
    """A fused collective never hides more than its products last: T - G >= c (n - 1) - G, for
    either kind, and never less than nothing."""
    gemms = Gemms((flops,), "bfloat16", H100, 10**12)
    for kind, spec in ((ALL_GATHER, TensorSpec(((1,), ()))), (REDUCE_SCATTER, TensorSpec(((), ()), frozenset({1})))):
        (step,) = reshard_steps(spec, TensorSpec(((), ())) if kind == ALL_GATHER else TensorSpec(((1,), ())),
                                (parts * 1024, nbytes // 1024 + 1), 1, (1, parts))
        left = pipelined_exposed(step, parts, price, gemms)
        assert left >= max(0, price - gemms.ticks(1))


def test_pipelined_exposed_by_hand() -> None:
    """One 8-way gather of a 16384 x 8192 bf16 shard into three products, priced as the module
    doc states, from the preset's own figures."""
    parts, rows, width = 8, 16384, 8192
    (step,) = reshard_steps(TensorSpec(((1,), ())), TensorSpec(((), ())), (parts * rows, width), 2, (1, parts))
    price = round((step.sent_bytes(parts) / H100.intra_bandwidth + H100.intra_latency) * 1e12)
    flops = tuple(2 * parts * rows * width * n for n in (1024, 128, 128))
    gemms = Gemms(flops, "bfloat16", H100, 10**12)
    chunk = sum(f / parts / H100.flops_per_second("bfloat16", "matmul", f / parts) for f in flops)
    whole = sum(f / H100.flops_per_second("bfloat16", "matmul", f) for f in flops)
    copy = 2 * rows * width * 2 / H100.streaming_bandwidth
    total = copy + chunk + (parts - 1) * max(chunk, price / 1e12 / (parts - 1))
    assert pipelined_exposed(step, parts, price, gemms) == pytest.approx((total - whole) * 1e12, abs=2)
    assert price / 1e12 > chunk  # the transfer outlasts one chunk's products: most of it shows


def test_fused_exposed_only_where_torch_fuses() -> None:
    """A gather fuses with products of one dtype (Float8 and bf16 together: none); along the last
    dim not when other ops read the gathered tensor too; elsewhere it is charged in full."""
    mesh, shape = (1, 8), (8 * 4096, 8192)
    rows = reshard_steps(TensorSpec(((1,), ())), TensorSpec(((), ())), shape, 2, mesh)
    cols = reshard_steps(TensorSpec(((), (1,))), TensorSpec(((), ())), shape, 2, mesh)
    price, flops = 10**9, 2 * shape[0] * shape[1] * 4096

    def left(steps: tuple, products: list[tuple[int, str]], ragged: bool = False) -> int:
        return fused_exposed(steps, shape, mesh, ALL_GATHER, price, products, H100, 10**12, ragged)

    alone = pipelined_exposed(rows[0], 8, price, Gemms((flops,), "bfloat16", H100, 10**12))
    assert alone < price and left(rows, [(flops, "bfloat16")]) == left(rows, [(flops, "bfloat16")], True) == alone
    assert left(rows, []) == left(rows, [(flops, "bfloat16"), (flops, "float8_e4m3fn")]) == price
    assert left(cols, [(flops, "bfloat16")]) < price == left(cols, [(flops, "bfloat16")], ragged=True)
    assert left(cols, [(flops, "float8_e4m3fn")]) == price
    assert fused_exposed(rows, shape, mesh, REDUCE_SCATTER, price, [(flops, "bfloat16")], H100, 10**12) == price


def _joint(readers: int) -> torch.fx.Graph:
    """The aten graph (make_fx) of a step whose 2-D input ``x`` is read by ``readers`` linears,
    returning the forward products and x's gradient, as inductor's passes see a 2-D TP step."""
    def step(x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = [nn.functional.linear(x, w) for w in weights]
        return (*outs, *torch.autograd.grad(sum(o.sum() for o in outs), x))

    x = torch.randn(8, 16, requires_grad=True)
    return make_fx(step)(x, *(torch.randn(4, 16, requires_grad=True) for _ in range(readers))).graph


@pytest.mark.parametrize("readers", [1, 2, 3])
def test_writers_as_torch_fuses(readers: int) -> None:
    """Independent reference: on a real traced step, torch's micro-pipeline pass finds a matmul
    producing x's gradient (the reduce-scatter it would fuse) only when one linear reads x, and
    finds every reader among the matmuls consuming x (the all-gather it fuses with all of them):
    ``benchmarks/as_torch_runs.py`` fuses a shared input's gradient only with one writer."""
    graph = _joint(readers)
    output = next(n for n in graph.nodes if n.op == "output")
    gradient = output.args[0][-1]
    fused_backward = _find_producer_matmul(gradient) is not None
    x = next(n for n in graph.nodes if n.op == "placeholder")
    assert len(_find_consumer_matmuls(x)) == readers
    assert fused_backward == (readers == 1)


class Mlp(nn.Module):
    """Two Megatron MLPs with a norm between: column- then row-parallel pairs."""

    def __init__(self, dim: int = 1024) -> None:
        super().__init__()
        self.a1, self.a2 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)
        self.norm = nn.RMSNorm(dim)
        self.b1, self.b2 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.a2(torch.relu(self.a1(x)))
        return h + self.b2(torch.relu(self.b1(self.norm(h))))


def test_megatron_plan_cheaper_by_hidden_collectives() -> None:
    """Megatron's plan on 4 devices (sequence-parallel: a row output reduce-scattered, a column input
    gathered) costs less with async TP, by at most its collectives' time."""
    with torch.device("meta"):
        model = Mlp().to(torch.bfloat16)
    graph = trace(model, (torch.zeros(8, 2048, 1024, dtype=torch.bfloat16, device="meta"),))
    costs = {}
    for async_tp in (False, True):
        mp = build_model_problem(graph, 4, mode="training", device="h100", async_tp=async_tp)
        choice = megatron_choice(mp)
        edges = sum(int(m[choice[a], choice[b]]) for (a, b), m in zip(mp.problem.edges, mp.problem.edge_costs))
        costs[async_tp] = (mp.problem.cost(choice), edges)
    (blocking, comm), (overlapped, left) = costs[False], costs[True]
    assert comm > 0 and left < comm
    assert blocking - overlapped == comm - left


def test_titan_plan_fuses_where_torch_would() -> None:
    """benchmarks/as_torch_runs.py on torchtitan's FSDP x TP plan of one LLaMA-3-8B layer in Float8 (8 x 4096
    tokens a data-parallel rank, where chunked products run near the unchunked rate): the input
    gathers of wq/wk/wv, w1/w3 and the output projection fuse forward, the first two with their
    summed gradients reduced in full; the row outputs' reduce-scatters fuse with wo and w2; the
    embedding's and the loss's reshards cost what they cost without async TP."""
    from benchmarks import as_torch_runs, reality
    from benchmarks.titan_llama import Transformer

    with torch.device("meta"):
        model = Transformer(1, 4096, 32, 8, 14336, 4096, 4096).to(torch.bfloat16)
    model.cos, model.sin = model.cos.float(), model.sin.float()
    tokens = torch.zeros(16, 4096, dtype=torch.long, device="meta")
    graph = trace(model, (tokens, tokens.clone()))

    def build(async_tp: bool) -> ModelProblem:
        return build_model_problem(graph, "2x4", mode="training", device="h100-hbm2e", precision="bf16-mixed",
                                   recompute="full", compile="layers", float8="tensorwise", async_tp=async_tp)

    fused, blocking = build(True), build(False)
    choice = reality.torchtitan_choice(blocking)
    prices = as_torch_runs.EdgePrices(fused.mesh, fused.cost_model, fused.options.precision)
    groups: dict[tuple, list] = {}
    for edge in fused.edges:
        if edge.index is not None and fused.candidates[edge.src].storage is None:
            j = choice[fused.problem.edges[edge.index][1]]
            read = fused.candidates[edge.dst].strategies[j].in_specs[edge.operand]
            groups.setdefault((edge.src, read), []).append(edge)
    seen = set()
    for (src, _), members in groups.items():
        readers = tuple(sorted(fused.candidates[e.dst].node.op or "" for e in members))
        left = as_torch_runs.shared_async_ticks(fused, prices, members, choice, True)
        pairs = [tuple(choice[n] for n in blocking.problem.edges[e.index]) for e in members]
        full = max(int(blocking.problem.edge_costs[e.index][pair]) for e, pair in zip(members, pairs))
        i, j = pairs[0]
        dst = fused.candidates[members[0].dst]
        backward = int(prices.reshard_matrices(fused.candidates[src], dst, members[0].operand, members[0].meta,
                                               True)[1][i, j])
        if full == 0:
            continue
        if set(readers) == {"linear"} or fused.candidates[src].node.op == "linear":
            assert left < full
            assert len(readers) == 1 or backward <= left
        else:
            assert left == full
        seen.add((fused.candidates[src].node.op, readers))
    assert {("rms_norm", ("linear",) * 3), ("rms_norm", ("linear",) * 2), ("rms_norm", ("linear",)),
            ("linear", ("add",)), ("embedding", ("add", "rms_norm"))} <= seen


class Readers(nn.Module):
    """A column- then row-parallel pair whose row output is read by ``readers`` ops."""

    def __init__(self, readers: int, dim: int = 1024) -> None:
        super().__init__()
        self.readers = readers
        self.a1, self.a2 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a2(torch.relu(self.a1(x)))
        return x + y if self.readers == 1 else (x + y) * torch.sigmoid(y)


def test_producer_with_another_user_is_not_fused_by_torch() -> None:
    """Independent reference: torch's ``fuse_matmul_reduce_scatter`` skips a product whose result has
    another user than the reduce-scatter (``len(input_node.users) != 1``); on a traced step the
    product found by ``_find_producer_matmul`` has one user per op reading the linear's output."""
    for readers in (1, 2):
        model = Readers(readers, 16)
        graph = make_fx(model)(torch.randn(8, 16)).graph
        products = [n for n in graph.nodes if n.op == "call_function" and _find_producer_matmul(n) is not None
                    and n.target is torch.ops.aten.mm.default]
        y = products[-1]  # a2's product
        assert len(y.users) == readers


@pytest.mark.parametrize("readers", [1, 2])
def test_scatter_fuses_with_a_producer_read_once(readers: int) -> None:
    """The build counts the readers of a linear's output (``reader_counts``) and fuses the reduce-
    scatter of its partial sums with the product only where one edge reads it, as torch's pass
    does: with two readers every forward reshard from a2 costs what it costs without async TP."""
    from autoshard.problem.edges import reader_counts

    with torch.device("meta"):
        model = Readers(readers).to(torch.bfloat16)
    graph = trace(model, (torch.zeros(8, 2048, 1024, dtype=torch.bfloat16, device="meta"),))
    built = {a: build_model_problem(graph, 4, mode="inference", device="h100", async_tp=a) for a in (False, True)}
    (a2,) = [n for n in built[True].names if built[True].candidates[n].node.op == "linear"
             and built[True].candidates[n].node.module.endswith("a2")]
    assert reader_counts(built[True].graph, built[True].candidates)[a2] == readers
    edges = [e.index for e in built[True].edges if e.src == a2 and e.index is not None]
    assert len(edges) == readers
    fused = [built[True].problem.edge_costs[i] for i in edges]
    blocking = [built[False].problem.edge_costs[i] for i in edges]
    assert all((f <= b).all() for f, b in zip(fused, blocking))
    assert any((f < b).any() for f, b in zip(fused, blocking)) == (readers == 1)
