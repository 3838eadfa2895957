"""--async-tp edge matrices (problem/edges.py ``EdgePrices.async_matrices``): each activation edge's
reshards priced as torch's micro-pipelined collectives (cost/async_tp.py ``fused_exposed``) where
its pass fuses them, in full where it does not, on a small LLaMA on a 2x4 mesh."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autoshard.api import build_model_problem
from autoshard.cost.async_tp import fused_exposed, fuses
from autoshard.frontend.trace import trace
from autoshard.problem.build import ModelEdge, ModelProblem
from autoshard.sharding.reshard import ALL_GATHER, REDUCE_SCATTER, reshard_steps
from autoshard.sharding.spec import TensorSpec
from autoshard.solver.model.problem import FORBIDDEN
from benchmarks.titan_llama import Transformer


def _build(async_tp: bool) -> ModelProblem:
    with torch.device("meta"):
        model = Transformer(1, 2048, 16, 8, 5632, 2048, 2048).to(torch.bfloat16)
    model.cos, model.sin = model.cos.float(), model.sin.float()
    tokens = torch.zeros(8, 2048, dtype=torch.long, device="meta")
    return build_model_problem(trace(model, (tokens, tokens.clone())), "2x4", mode="training", device="h100",
                               async_tp=async_tp)


@pytest.fixture(scope="module")
def problems() -> tuple[ModelProblem, ModelProblem]:
    """(async TP, blocking) problems of one model."""
    return _build(True), _build(False)


BATCH_SEQ = TensorSpec(((0,), (1,), ()))  # batch over axis 0, sequence over axis 1 (sequence parallel)
BATCH = TensorSpec(((0,), (), ()))
COLUMN = TensorSpec(((0,), (), (1,)))  # a column-parallel linear's output
PARTIAL = TensorSpec(((0,), (), ()), frozenset({1}))  # a row-parallel linear's output


def _edge(mp: ModelProblem, module: str, other: str) -> ModelEdge:
    """The activation edge between the linear of ``module`` and an ``other`` op node: into the
    linear's operand 0, or out of it."""
    for edge in mp.edges:
        src, dst = mp.candidates[edge.src].node, mp.candidates[edge.dst].node
        if edge.index is None:
            continue
        if edge.operand == 0 and dst.op == "linear" and dst.module.endswith(module) and src.op == other:
            return edge
        if src.op == "linear" and src.module.endswith(module) and dst.op == other:
            return edge
    raise LookupError(f"no edge at {module} / {other}")


def _choice(mp: ModelProblem, edge: ModelEdge, out: TensorSpec, read: TensorSpec, dst_out: TensorSpec) -> list[int]:
    """A choice whose edge ends produce ``out`` and read it as ``read`` producing ``dst_out``."""
    src, dst = mp.candidates[edge.src], mp.candidates[edge.dst]
    choice = [0] * len(mp.problem.node_costs)
    a, b = mp.problem.edges[edge.index]
    choice[a] = next(i for i, s in enumerate(src.strategies) if s.out_spec == out)
    choice[b] = next(j for j, s in enumerate(dst.strategies) if s.in_specs[edge.operand] == read
                     and s.out_spec == dst_out)
    return choice


def _by_hand(fused: ModelProblem, blocking: ModelProblem, edge: ModelEdge, choice: list[int], forward_kind: str,
             at_dst: bool) -> tuple[int, int, int]:
    """(the async matrix's entry at ``choice``, forward + backward by ``fused_exposed`` with the
    linear at the dst (``at_dst``) or src end, the blocking entry)."""
    i, j = (choice[n] for n in fused.problem.edges[edge.index])
    src, dst = fused.candidates[edge.src], fused.candidates[edge.dst]
    shape, mesh, device = edge.meta.shape, fused.mesh.shape, fused.cost_model.device
    full = int(blocking.problem.edge_costs[edge.index][i, j])
    strategy = dst.strategies[j]
    out, read, grad = src.strategies[i].out_spec, strategy.in_specs[edge.operand], strategy.grad_specs[edge.operand]
    itemsize = edge.meta.itemsize
    forward = fused.cost_model.ticks(sum(fused.cost_model.step_cost(s, shape)
                                         for s in reshard_steps(out, read, shape, itemsize, mesh)))
    backward = full - forward
    linear, k = (dst, j) if at_dst else (src, i)
    backward_kind = REDUCE_SCATTER if forward_kind == ALL_GATHER else ALL_GATHER
    want = (fused_exposed(reshard_steps(out, read, shape, itemsize, mesh), shape, mesh, forward_kind, forward,
                          [(linear.flops[k][0], "bfloat16")], device, fused.cost_model.ticks_per_unit)
            + fused_exposed(reshard_steps(grad, out.without_partial(), shape, itemsize, mesh), shape, mesh,
                            backward_kind, backward, [(linear.flops[k][1] // 2, "bfloat16")], device,
                            fused.cost_model.ticks_per_unit))
    assert 0 < forward < full  # both directions move bytes
    return int(fused.problem.edge_costs[edge.index][i, j]), want, full


def test_column_input_gather_fused_with_its_product(problems: tuple[ModelProblem, ModelProblem]) -> None:
    """As torchtitan's plan runs it: the sequence-sharded norm output gathered into wq fuses with wq's product
    (all-gather + matmul), its gradient's reduce-scatter with wq's input-gradient product."""
    fused, blocking = problems
    edge = _edge(fused, "feed_forward.w1", "rms_norm")
    choice = _choice(fused, edge, BATCH_SEQ, BATCH, COLUMN)
    got, want, full = _by_hand(fused, blocking, edge, choice, ALL_GATHER, True)
    assert got == want < full


def test_row_output_scatter_fused_with_its_product(problems: tuple[ModelProblem, ModelProblem]) -> None:
    """As torchtitan's plan runs it: wo's partial output reduce-scattered over the sequence fuses with wo's
    product (matmul + reduce-scatter), its gradient's all-gather with wo's input-gradient product."""
    fused, blocking = problems
    edge = _edge(fused, "feed_forward.w2", "add")
    choice = _choice(fused, edge, PARTIAL, BATCH_SEQ, BATCH_SEQ)
    got, want, full = _by_hand(fused, blocking, edge, choice, REDUCE_SCATTER, False)
    assert got == want < full


def test_all_reduce_charged_in_full(problems: tuple[ModelProblem, ModelProblem]) -> None:
    """As Megatron's plan runs it: wo's partial output all-reduced, and wq's partial input gradient:
    torch fuses no all-reduce, so the edges cost what they cost blocking."""
    fused, blocking = problems
    for edge, specs in ((_edge(fused, "attention.wo", "add"), (PARTIAL, BATCH, BATCH)),
                        (_edge(fused, "attention.wq", "rms_norm"), (BATCH, BATCH, COLUMN))):
        choice = _choice(fused, edge, *specs)
        pair = tuple(choice[n] for n in fused.problem.edges[edge.index])
        assert int(fused.problem.edge_costs[edge.index][pair]) == int(blocking.problem.edge_costs[edge.index][pair]) > 0


def test_only_edges_at_a_fusing_product_change(problems: tuple[ModelProblem, ModelProblem]) -> None:
    """An edge with no bias-free linear at either end costs what it costs blocking, pair for pair;
    the forbidden pairs stay forbidden; edges at a linear get cheaper somewhere. (Not "never
    dearer": a fused pipeline's copies and chunked products can expose more than the blocking
    collective, e.g. the small k/v projections' gradient gathers here, and torch fuses them all
    the same.)"""
    fused, blocking = problems
    cheaper = 0
    for edge in fused.edges:
        if edge.index is None:
            continue
        on, off = fused.problem.edge_costs[edge.index], blocking.problem.edge_costs[edge.index]
        allowed = off < FORBIDDEN
        assert np.array_equal(on < FORBIDDEN, allowed)
        if not any(fuses(fused.candidates[n].node) for n in (edge.src, edge.dst)):
            assert np.array_equal(on, off)
        else:
            cheaper += bool((on[allowed] < off[allowed]).any())
    assert cheaper >= 7  # wq, wk, wv, wo, w1, w2, w3 and more
