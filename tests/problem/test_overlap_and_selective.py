"""Overlapped parameter traffic and the selective recomputation policy, on a small torchtitan-style LLaMA."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autoshard.api import build_model_problem
from autoshard.errors import AutoshardError
from autoshard.frontend.graph import NodeKind
from autoshard.frontend.trace import trace
from autoshard.problem.baselines.torchtitan import torchtitan_choice
from autoshard.problem.readback import make_plan
from autoshard.runtime.checks import check_layouts
from autoshard.sharding.layers import find_repeated_layers
from autoshard.sharding.reshard import reshard_steps
from autoshard.cost.memory import local_bytes
from benchmarks.titan_llama import Transformer
from tests.runtime.dist import run_ranks

LAYERS = 3


@pytest.fixture(scope="module")
def graph():
    model = Transformer(LAYERS, 64, 4, 2, 128, 256, 128).to(torch.bfloat16)  # activations dominate the peak
    tokens = torch.zeros(8, 128, dtype=torch.long)
    return trace(model, (tokens, tokens.clone()))


def _build(graph, **options):
    return build_model_problem(graph, "4", mode="training", device="h100", precision="bf16-mixed", **options)


def _seconds(mp, spec_from, spec_to, meta) -> int:
    """Ticks of one reshard, priced step by step straight from the cost model."""
    steps = reshard_steps(spec_from, spec_to, meta.shape, meta.itemsize, mp.mesh.shape)
    return mp.cost_model.ticks(sum(mp.cost_model.step_cost(s, meta.shape) for s in steps))


def _fsdp2_copies(rank: int, world: int, dim: int) -> dict[str, list[tuple[int, int]]]:
    """(elements, bytes moved) of each copy FSDP2 itself runs around its collectives in one
    bf16-mixed step of Linears sharded on ``dim`` (fp32 reduction, resharded after forward):
    copy-out per gather, copy-in per gradient reduction, and the ``cat`` between the chunks and
    the parameter's layout where ``dim`` is not 0."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Shard

    mesh = init_device_mesh("cpu", (world,))
    model = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False), torch.nn.Linear(32, 64, bias=False))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=True,
                    shard_placement_fn=lambda _: Shard(dim))
    fully_shard(model, mesh=mesh, mp_policy=policy)
    seen: dict[str, list[tuple[int, int]]] = {"fsdp.split_with_sizes_copy": [], "fsdp.chunk_cat": [], "aten.cat": []}

    class Copies(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = str(func.overloadpacket)
            if name in seen:
                reads = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
                out = kwargs.get("out")
                result = func(*args, **kwargs)
                writes = out if isinstance(out, (list, tuple)) else [result if out is None else out]
                moved = sum(t.numel() * t.element_size() for t in (*reads, *writes))
                seen[name].append((sum(t.numel() for t in writes), moved))
                return result
            return func(*args, **kwargs)

    with Copies():
        model(torch.randn(4, 64)).sum().backward()
    return seen


@pytest.fixture(scope="module")
def fsdp2_bytes_per_element() -> dict[int, tuple[float, float]]:
    """Bytes FSDP2 moves per parameter element, by the dimension it shards: per gather (copy-out,
    then the cat into the parameter's layout), per gradient (the cat into dim-0 chunks, then the
    fp32 copy-in)."""
    measured = {}
    for dim in (0, 1):
        seen = run_ranks(2, _fsdp2_copies, dim)[0]
        copy_out, copy_in, cats = seen["fsdp.split_with_sizes_copy"], seen["fsdp.chunk_cat"], seen["aten.cat"]
        assert len(copy_out) >= 2 and len(copy_in) == 2  # every layer gathered at least once, each gradient reduced once
        assert len(cats) == (0 if dim == 0 else len(copy_out) + len(copy_in))
        per_element = [sum(m for _, m in copies) / sum(e for e, _ in copies) for copies in (copy_out, copy_in)]
        cat = sum(m for _, m in cats) / sum(e for e, _ in cats) if cats else 0.0  # one per gather and per gradient
        measured[dim] = (per_element[0] + cat, per_element[1] + cat)
    return measured


def test_parameter_traffic_in_layers_exposes_only_what_the_owner_compute_cannot_hide(
        graph, fsdp2_bytes_per_element) -> None:
    """Gathers and gradient reductions in repeated layers hide under the owner's compute up to its
    length; FSDP2's copies on the compute stream (bytes measured from FSDP2 itself) never hide and
    are paid by every parameter FSDP2 runs, outside the layers too."""
    hidden, exposed = _build(graph), _build(graph, overlap=False)
    streaming = hidden.cost_model.device.streaming_bandwidth
    in_layers = find_repeated_layers(graph).nodes
    checked = {True: 0, False: 0}
    for edge, edge_off in zip(hidden.edges, exposed.edges):
        if edge.index is None or hidden.life.first_reader.get(edge.src) != edge.dst:
            continue
        param, owner = hidden.candidates[edge.src], hidden.candidates[edge.dst]
        if param.storage is None:
            continue
        on, off = hidden.problem.edge_costs[edge.index], exposed.problem.edge_costs[edge_off.index]
        in_layer = edge.dst in in_layers
        fp32_gradient = replace(edge.meta, itemsize=4)  # bf16-mixed reduces gradients in fp32
        for i, (stored, storage) in enumerate(zip(param.strategies, param.storage)):
            gather = _seconds(hidden, stored.out_spec, storage.use, edge.meta)
            gathered = local_bytes(storage.use, edge.meta, hidden.mesh) // edge.meta.itemsize
            dims = {d for d, axes in enumerate(stored.out_spec.dims) if axes != storage.use.dims[d]}
            copy_out_bytes, copy_in_bytes = fsdp2_bytes_per_element[max(dims, default=0) and 1]
            for j, s in enumerate(owner.strategies):
                again = bool(owner.recompute and owner.recompute[j])
                if s.in_specs[edge.operand] != storage.use or again != bool(param.recompute and param.recompute[i]):
                    continue
                back = _seconds(hidden, s.grad_specs[edge.operand], stored.out_spec, fp32_gradient)
                forward_pass, backward_pass = gather, back + gather * (storage.regather + again)
                assert off[i, j] == forward_pass + backward_pass
                gradient = local_bytes(s.grad_specs[edge.operand], edge.meta, hidden.mesh) // edge.meta.itemsize
                copy_out = hidden.cost_model.ticks(gathered * copy_out_bytes / streaming) if gather else 0
                copy_in = hidden.cost_model.ticks(gradient * copy_in_bytes / streaming) if back else 0
                copies = copy_out * (1 + storage.regather + again) + copy_in
                if in_layer:
                    fwd = owner.forward_costs[j]
                    exposed_traffic = max(0, forward_pass - fwd) + max(0, backward_pass - (owner.costs[j] - fwd))
                else:  # FSDP2 runs the embedding and head too: nothing to hide under, its copies all the same
                    exposed_traffic = forward_pass + backward_pass
                assert on[i, j] == exposed_traffic + copies
                checked[in_layer] += gather > 0 and back > 0
    assert checked[True] > 0 and checked[False] > 0
    plan = torchtitan_choice(hidden)
    assert hidden.problem.cost(plan) < exposed.problem.cost(plan)


def test_selective_policy_keeps_attention_and_every_other_weight_matmul(graph) -> None:
    mp = _build(graph, memory_budget=2**30, recompute="selective")
    assert len(mp.blocks.last) == LAYERS
    for layer in range(LAYERS):
        ops = [n for n in mp.blocks.block_of if mp.blocks.block_of[n] == layer]
        linears = [n for n in sorted(ops, key=list(graph.nodes).index) if graph[n].op == "linear"]
        kept = {n for n in ops if n in mp.blocks.saved}
        modules = sorted(graph[n].module.rsplit(".", 1)[1] for n in kept if graph[n].op == "linear")
        assert len(linears) == 7 and modules == ["w1", "w2", "wq", "wv"]  # 1st, 3rd, 5th, 7th in forward order
        assert sum(graph[n].op == "scaled_dot_product_attention" for n in kept) == 1


def test_selective_sits_between_keeping_and_full_recomputation(graph) -> None:
    problems = {policy: _build(graph, memory_budget=2**30, recompute=policy) for policy in ("full", "selective")}
    figures = {}
    for policy, mp in problems.items():
        recomputing = torchtitan_choice(mp)
        keeping = mp.complete([c - len(mp.candidates[n].strategies) // 2
                               if mp.candidates[n].recompute is not None and mp.candidates[n].recompute[c] else c
                               for n, c in zip(mp.names, recomputing)])
        figures[policy] = [(mp.problem.cost(c), mp.problem.peak_usage(c)) for c in (keeping, recomputing)]
    (keep_cost, keep_peak), (full_cost, full_peak) = figures["full"]
    assert figures["selective"][0] == (keep_cost, keep_peak)  # keeping is the same plan under either policy
    selective_cost, selective_peak = figures["selective"][1]
    assert keep_cost < selective_cost < full_cost
    assert full_peak < selective_peak < keep_peak


def test_a_selectively_recomputing_plan_passes_the_executor_checks(graph) -> None:
    """The executor runs selective plans (tests/runtime/test_recompute.py): its checks accept them."""
    mp = _build(graph, memory_budget=2**30, recompute="selective")
    plan = make_plan(mp, torchtitan_choice(mp))
    assert plan.recompute and plan.recompute_kept
    check_layouts(plan, graph)


def test_an_unknown_policy_names_the_choices(graph) -> None:
    with pytest.raises(AutoshardError, match="full, selective, none"):
        _build(graph, memory_budget=2**30, recompute="some")
    assert not np.any([c.recompute is not None for c in _build(graph, memory_budget=2**30,
                                                                 recompute="none").candidates.values()])


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_the_problem_counts_the_blocks_that_recompute_for_the_solver_to_branch_on(graph, recompute) -> None:
    """One tally, one group per block: its ops, their parameters and the auxiliary memory nodes
    that mirror them, each marking exactly its recomputing strategies, with twins that flip only
    that choice (a parameter gathered again for backward recomputes as the one kept gathered)."""
    mp = _build(graph, memory_budget=2**30, recompute=recompute)
    (tally,) = mp.problem.tallies
    assert len(tally.groups) == LAYERS
    owner = {len(mp.names) + j: o for j, o in enumerate(mp.aux_owner)}
    for layer, group in enumerate(tally.groups):
        names = [mp.names[owner.get(node, node)] for node, _, _ in group]
        assert {mp.blocks.block_of[n] for n in names if n in mp.blocks.block_of} == {layer}
        assert any(mp.candidates[n].node.kind == NodeKind.PARAM for n in names) and owner.keys() & {n for n, _, _ in group}
        for name, (node, marked, twins) in zip(names, group):
            cand = mp.candidates[name]
            assert marked == tuple(s for s, flag in enumerate(cand.recompute) if flag)
            for s, t in enumerate(twins):
                if t < 0:
                    continue
                assert cand.recompute[t] != cand.recompute[s] and cand.strategies[t] == cand.strategies[s]
                if cand.storage is not None:
                    assert cand.storage[t].use == cand.storage[s].use and not cand.storage[t].regather or \
                        not cand.storage[s].regather
            assert all(t >= 0 for s, t in enumerate(twins) if cand.recompute[s])  # every recomputing one can stop
    assert _build(graph, memory_budget=2**30, recompute="none").problem.tallies == []  # nothing to count
