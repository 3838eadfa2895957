"""cost/ring.py against torch's own ring attention: ``_templated_ring_attention`` and its backward
from the installed torch, run on CPU over a fake process group with stub attention kernels, and the
backward's exchanges timed by a walk of its loop."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as ft_c
from torch.distributed.tensor.experimental._context_parallel import _attention
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.distributed.fake_pg import FakeStore

from autoshard.api import build_model_problem
from autoshard.cost.ring import gradient_ring_bytes, gradient_ring_seconds, ring_blocks
from autoshard.frontend.trace import trace

CHUNK, HEADS, DIM = 3, 2, 4


@pytest.fixture
def ring(request: pytest.FixtureRequest) -> Iterator[dist.ProcessGroup]:
    """A fake process group of ``(rank, parts)``: collectives return buffers of the right size."""
    rank, parts = request.param
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=parts)
    yield dist.group.WORLD
    dist.destroy_process_group()


def local() -> torch.Tensor:
    """A device's query (and key, value) under load balancing: two chunks of ``CHUNK`` tokens."""
    return torch.zeros(1, HEADS, 2 * CHUNK, DIM, dtype=torch.bfloat16)


def run_ring(group: dist.ProcessGroup, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    """(kernels, collectives) of one forward and one backward of torch's ring on this device:
    kernels as (pass, query chunks, key chunks, causal), collectives as (kind, bytes sent, dtype)."""
    kernels: list[tuple[str, int, int, bool]] = []
    sent: list[tuple[str, int, torch.dtype]] = []

    def permute(t: torch.Tensor, dsts: list[int], group: object, tag: str = "") -> torch.Tensor:
        sent.append(("permute", t.numel() * t.element_size(), t.dtype))
        return t.clone()

    def gather(t: torch.Tensor, gather_dim: int, group: dist.ProcessGroup, tag: str = "") -> torch.Tensor:
        sent.append(("all_gather", t.numel() * t.element_size(), t.dtype))
        return torch.cat([t] * dist.get_world_size(group), dim=gather_dim)

    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, **_: object) -> tuple:
        kernels.append(("forward", q.shape[2] // CHUNK, k.shape[2] // CHUNK, is_causal))
        return torch.zeros_like(q), torch.zeros(q.shape[:3])

    def backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, is_causal: bool, **_: object) -> tuple:
        kernels.append(("backward", query.shape[2] // CHUNK, key.shape[2] // CHUNK, is_causal))
        return torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)

    monkeypatch.setattr(ft_c, "permute_tensor", permute)
    monkeypatch.setattr(ft_c, "all_gather_single", gather)
    q = local()
    _attention._templated_ring_attention(group, 2, forward, q, q.clone(), q.clone(), is_causal=True)
    _attention._templated_ring_attention_backward(group, 2, backward, q, "grad_out", q, q.clone(), q.clone(), q,
                                                  torch.zeros(q.shape[:3]), is_causal=True)
    return kernels, sent


CASES = [(r, p) for p in (2, 3, 4, 8) for r in range(p)]


@pytest.mark.parametrize("ring", CASES, indirect=True)
def test_torch_runs_the_blocks_and_sends_the_bytes(ring: dist.ProcessGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's kernels are ``ring_blocks`` in each pass; its backward sends ``gradient_ring_bytes`` in
    ``p`` fp32 exchanges, beside one bf16 all-gather of the keys and values per pass."""
    rank, parts = dist.get_rank(ring), dist.get_world_size(ring)
    kernels, sent = run_ring(ring, monkeypatch)
    blocks = ring_blocks(rank, parts)
    assert kernels == [(p, *b) for p in ("forward", "backward") for b in blocks]
    elements = local().numel()
    gathers = [s for s in sent if s[0] == "all_gather"]
    exchanges = [s for s in sent if s[0] == "permute"]
    assert gathers == [("all_gather", 2 * elements * 2, torch.bfloat16)] * 2
    assert all(dtype == torch.float32 for _, _, dtype in exchanges) and len(exchanges) == parts
    assert sum(b for _, b, _ in exchanges) == gradient_ring_bytes(elements, parts)


@pytest.mark.parametrize("ring", [(1, 4)], indirect=True)
def test_traced_ring_awaits_each_collective_where_it_is_issued(ring: dist.ProcessGroup) -> None:
    """Traced (as torch.compile traces a block), torch's backward ring awaits every collective right
    after issuing it, so no exchange overlaps a kernel: the traced case of ``gradient_ring_seconds``."""

    def backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **_: object) -> tuple:
        return query * 2, key * 2, value * 2

    def step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor) -> tuple:
        return _attention._templated_ring_attention_backward(ring, 2, backward, o, "grad_out", q, k, v, o, lse,
                                                             is_causal=True)

    q = local()
    graph = make_fx(step)(q, q.clone(), q.clone(), q.clone(), torch.zeros(q.shape[:3])).graph
    ops = [n.target.__name__ for n in graph.nodes if n.op == "call_function" and hasattr(n.target, "__name__")]
    issued = [i for i, op in enumerate(ops) if op.startswith(("all_gather", "all_to_all"))]
    assert len(issued) == 1 + 4 and all(ops[i + 1] == "wait_tensor.default" for i in issued)


def walk_exposed(parts: int, exchange: float, kernel: float, traced: bool) -> float:
    """Seconds the compute stream waits on exchanges in torch's backward loop, walked step by step:
    step ``i`` runs its kernel, then (``i > 0``) awaits the exchange sent after step ``i - 1``, then
    sends its own; after the loop it awaits the last. Traced, each send is awaited at once."""
    clock = waited = 0.0
    arrives = None
    for i in range(parts):
        clock += kernel
        if i > 0 and arrives is not None:
            waited += max(0.0, arrives - clock)
            clock = max(clock, arrives)
        arrives = clock + exchange
        if traced:
            waited += exchange
            clock, arrives = arrives, None
    if arrives is not None:
        waited += arrives - clock
    return waited


@pytest.mark.parametrize("parts", [2, 3, 8])
@pytest.mark.parametrize("kernel", [0.0, 1e-4, 5e-3])
def test_exposed_seconds_match_a_walk_of_the_loop(parts: int, kernel: float) -> None:
    """``gradient_ring_seconds`` equals the walk of torch's loop, traced and eager, for exchanges
    shorter and longer than a step's kernel; one device runs no ring."""
    elements, latency, bandwidth = 10**6, 2e-5, 1e11
    exchange = latency + 2 * elements * 4 / bandwidth
    assert gradient_ring_seconds(elements, parts, latency, bandwidth, None) == pytest.approx(
        walk_exposed(parts, exchange, kernel, traced=True))
    assert gradient_ring_seconds(elements, parts, latency, bandwidth, kernel) == pytest.approx(
        walk_exposed(parts, exchange, kernel, traced=False))
    assert gradient_ring_seconds(elements, 1, latency, bandwidth, None) == 0.0 == gradient_ring_bytes(elements, 1)


@pytest.mark.parametrize("compile", ["layers", None])
def test_torchtitan_cp_plan_charges_each_ring_its_exchanges(compile: str | None) -> None:
    """``benchmarks/as_torch_runs.py`` on torchtitan's CP plan of a 2-layer LLaMA over a ring of 4:
    each causal attention splitting its rows pays ``gradient_ring_seconds`` for its local keys and
    values (one head group repeated to every head, 4 heads x S/4 tokens x 32), all exposed where
    the blocks are compiled and less eagerly, where the next step's kernel hides part of each."""
    from benchmarks import as_torch_runs, reality
    from benchmarks.titan_llama import Transformer

    seq, parts = 4096, 4
    run = reality.Run("cp", "cp", "8b", 1, 1, seq, "full", 1.0, 1.0, cp=parts, compile=compile is not None)
    with torch.device("meta"):
        model = Transformer(2, 128, 4, 2, 256, 512, seq).to(torch.bfloat16)
    model.cos, model.sin = model.cos.float(), model.sin.float()
    tokens = torch.zeros(1, seq, dtype=torch.long, device="meta")
    mp = build_model_problem(trace(model, (tokens, tokens.clone())), run.mesh, mode="training", device="h100",
                             precision="bf16-mixed", recompute="full", compile=compile)
    choice = reality.context_parallel_choice(mp, run)
    rings = as_torch_runs.ring_attentions(mp, choice)
    assert [p for _, p in rings] == [parts, parts]
    elements = 4 * seq // parts * 32
    exposed = gradient_ring_seconds(elements, parts, mp.mesh.latency[0], mp.mesh.bandwidth[0], None)
    ticks = as_torch_runs.ring_exchange_ticks(mp, choice)
    if compile is not None:
        assert ticks == mp.cost_model.ticks(2 * exposed)
    else:
        assert mp.cost_model.ticks(2 * exposed / parts) <= ticks < mp.cost_model.ticks(2 * exposed)
