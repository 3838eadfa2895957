"""Edges and reshard copies built once per kind of edge and shared by the twins of identical layers
equal a build that computes every edge from scratch: every edge cost matrix, every copies' node
(keys, ties, items) and every memory row, on a multi-layer LLaMA."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.api import build_model_problem
from autoshard.cost.memory import MemoryItem, local_bytes
from autoshard.cost.recompute import value_windows
from autoshard.frontend.graph import NodeKind
from autoshard.problem import reshard_copies
from autoshard.problem.edges import EdgePrices
from autoshard.problem.reshard_copies import CopiesBuilder, ReshardCopies
from autoshard.sharding.spec import TensorSpec
from tests.pipeline.models import tiny_llama_graph


def _windows(key, reader, root, saves, reruns, handed, view_end, meta, times) -> dict:
    """Bytes per (what, window) of one key of one edge, walked key by key (the module's formulation,
    written out independently of its slots)."""
    if key is None:
        return {}
    life, base, blocks = times.life, times.base, times.blocks
    a, peak, kept, recomputed = key
    forward, back = life.forward_window(reader), life.backward(reader) + 1
    out: dict = {}

    def add(window, used, what="reshard copy") -> None:
        if used and window[0] < window[1]:
            out[what, window] = out.get((what, window), 0) + used

    again = blocks.recompute_start(life, reader) if recomputed else None
    if view_end is not None:
        add(forward, peak - kept)
        add((forward[0], view_end), kept)
    elif recomputed and reruns:
        add(forward, peak)
        add((again, again + 1), peak - (kept if saves else 0))
        if saves:
            add((again, back), kept)
    else:
        add(forward, peak - (kept if saves else 0))
        if saves:
            add((forward[0], back), kept)
    if handed and peak == 0:
        if recomputed and blocks.reruns(root):
            ends = [w[1] for w in value_windows(root, base, blocks)] + [again]
        elif recomputed:
            ends = [base.value[root][1], blocks.recompute_start(life, root) + 1]
        else:
            ends = [base.value[root][1]]
        add((max(ends), back), local_bytes(a, meta, times.mesh), "activation")
    return out


def _from_scratch(self: CopiesBuilder, src, dst, operand, meta) -> ReshardCopies | None:
    """One edge's copies' node computed alone: fresh ties, every key's windows walked."""
    times, reader = self.times, dst.node
    if src.node.kind not in (NodeKind.OP, NodeKind.INPUT, NodeKind.PARAM):
        return None
    view = reader.work is not None and reader.work.alias_of == operand
    saves = times.training and reader.requires_grad and reader.work is not None \
        and operand in reader.work.saved_operands
    root = times.life.base[src.node.name]
    outs = [s.out_spec if isinstance(s.out_spec, TensorSpec) else None for s in src.strategies]
    charged = {o for o in outs if o is not None and (saves or view or o.partial) and meta.nbytes >= times.least}
    if not charged:
        return None
    ins = tuple(s.in_specs[operand] for s in dst.strategies)
    flags = tuple(dst.recompute or [False] * len(ins))
    keys, to_src, to_dst = reshard_copies._ties(outs, ins, flags, charged, meta, times.mesh)
    view_end = times.spans.get(reader.name, times.life.order[reader.name] + 1) if view else None
    held = [_windows(k, reader.name, root, saves, times.blocks.reruns(reader.name),
                     times.handed.get(root) == (reader.name, operand), view_end, meta, times) for k in keys]
    windows = sorted({w for h in held for w in h})
    items = tuple(MemoryItem(reader.name, what, w, tuple(h.get((what, w), 0) for h in held)) for what, w in windows)
    if not items:
        return None
    return ReshardCopies(src.node.name, reader.name, operand, keys, to_src, to_dst, items)


def _unshared_matrix(first):
    def matrix(self: EdgePrices, *args, **kwargs) -> np.ndarray:
        self.matrices.clear()  # every edge priced on its own
        self.grids.clear()
        return first(self, *args, **kwargs)
    return matrix


@pytest.mark.parametrize("device, recompute", [(None, "full"), ("h100", "full"), ("h100", "selective")])
def test_shared_edges_and_copies_equal_those_built_edge_by_edge(monkeypatch, device, recompute) -> None:
    """6-layer LLaMA training on 2x2: on the generic device without a budget, and under h100's
    budget with recomputable blocks (fully: reruns and handed savers; selectively: kept producers)."""
    graph = tiny_llama_graph(6, 4)
    options = dict(mode="training", device=device, precision="bf16-mixed", recompute=recompute)
    kinds: list[int] = []
    first_copies = CopiesBuilder.copies

    def counting(self, *args):
        found = first_copies(self, *args)
        kinds[:] = [len(self.kinds)]
        return found

    monkeypatch.setattr(CopiesBuilder, "copies", counting)
    shared = build_model_problem(graph, "2x2", **options)
    monkeypatch.setattr(CopiesBuilder, "copies", _from_scratch)
    monkeypatch.setattr(EdgePrices, "matrix", _unshared_matrix(EdgePrices.matrix))
    alone = build_model_problem(graph, "2x2", **options)

    assert len(shared.reshards) > 6 * 5 and kinds[0] < len(shared.reshards) / 2  # twins did share
    assert [(c.src, c.dst, c.operand, c.keys, c.items) for c in shared.reshards] == \
        [(c.src, c.dst, c.operand, c.keys, c.items) for c in alone.reshards]
    for a, b in zip(shared.reshards, alone.reshards):
        assert np.array_equal(a.to_src, b.to_src) and np.array_equal(a.to_dst, b.to_dst)
    p, q = shared.problem, alone.problem
    assert p.edges == q.edges and len(p.edge_costs) == len(q.edge_costs)
    assert all(np.array_equal(a, b) for a, b in zip(p.edge_costs, q.edge_costs))
    assert all(np.array_equal(a, b) for a, b in zip(p.node_costs, q.node_costs))
    assert p.intervals == q.intervals
    assert all(np.array_equal(a, b) for a, b in zip(p.node_usages, q.node_usages))
    recomputed = any(k is not None and k[3] for c in shared.reshards for k in c.keys)
    assert recomputed == (device is not None)  # the windows that depend on recomputation were exercised
    assert {i.what for c in shared.reshards for i in c.items} == {"activation", "reshard copy"}
