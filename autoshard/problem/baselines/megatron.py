"""Hand-written reference plans, costed in the same model as ours (``--baseline megatron``).

Megatron-LM / torchtitan tensor parallelism: linears whose input is not sharded on its feature
dim are column-parallel (weight split on its output features), linears that consume such a
sharded feature dim are row-parallel (weight split on its input features, output all-reduced),
so attention heads and MLP hidden units end up split. On meshes with more than one axis the
last (intra-node) axis is the tensor-parallel one and the others shard the batch (data
parallelism). Every other op takes the strategy that is cheapest given its producers; every
parameter is stored in the layout its first consumer reads. The result is one point of our
search space, so a proved optimum can never cost more.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoshard.problem.build import ModelProblem
from autoshard.frontend.graph import NodeKind
from autoshard.sharding.spec import TensorSpec
from autoshard.solver.model.problem import FORBIDDEN


class Producers:
    """Each problem node's incoming edges, indexed once: (producer's position, edge index) per
    node name, so costing a strategy against the producers decided so far reads only its own edges."""

    def __init__(self, mp: ModelProblem) -> None:
        self.mp = mp
        self.index = {n: i for i, n in enumerate(mp.names)}
        self.into: dict[str, list[tuple[int, int]]] = {}
        self.first_reader: dict[str, tuple[str, int]] = {}  # node -> (first consumer, operand) over priced edges
        for e in mp.edges:
            if e.index is None:
                continue
            self.into.setdefault(e.dst, []).append((self.index[e.src], e.index))
            self.first_reader.setdefault(e.src, (e.dst, e.operand))

    def cheapest(self, name: str, options: Sequence[int], choice: list[int | None]) -> int:
        """The first of ``options`` (strategies of ``name``) of least own cost plus edges from the
        producers already decided; sums saturate at FORBIDDEN, where strategies are alike forbidden."""
        picks = np.asarray(options, dtype=np.intp)
        total = np.minimum(np.asarray(self.mp.candidates[name].costs, dtype=np.int64)[picks], FORBIDDEN)
        for src, edge in self.into.get(name, ()):
            if choice[src] is not None:
                total = np.minimum(total + self.mp.problem.edge_costs[edge][choice[src], picks], FORBIDDEN)
        return int(picks[int(np.argmin(total))])

    def wanted_spec(self, name: str, choice: list[int | None]) -> TensorSpec | None:
        """The layout ``name``'s first consumer reads it in under ``choice`` (None: no priced consumer)."""
        first = self.first_reader.get(name)
        if first is None:
            return None
        dst, operand = first
        return self.mp.candidates[dst].strategies[choice[self.index[dst]]].in_specs[operand]


def _megatron_assignment(mp: ModelProblem, name: str, choice: list[int | None],
                         index: dict[str, int]) -> dict[str, tuple[int, ...]] | None:
    """Column- or row-parallel index assignment for a linear-like op with a parameter weight, else None."""
    cand = mp.candidates[name]
    inst = cand.instance
    if inst is None or not inst.contracted:
        return None
    node = cand.node
    weights = [k for k, src in enumerate(node.inputs)
               if mp.graph[src].kind == NodeKind.PARAM and inst.operands[k] is not None and len(inst.operands[k]) == 2]
    if not weights:
        return None
    weight = inst.operands[weights[0]]
    activation = next((k for k in range(len(node.inputs)) if k not in weights and inst.operands[k]), None)
    if activation is None:
        return None
    tp = mp.mesh.ndim - 1
    row_index = next((l for l in weight if l in inst.contracted), None)
    col_index = next((l for l in weight if l in inst.output), None)
    src = node.inputs[activation]
    src_choice = choice[index[src]]
    feature_sharded = False
    if src_choice is not None:
        spec = mp.candidates[src].strategies[src_choice].out_spec
        feature_sharded = bool(spec.dims) and tp in spec.dims[-1]
    assign: dict[str, tuple[int, ...]] = {}
    target = row_index if feature_sharded else col_index
    if target is not None:
        assign[target] = (tp,)
    batch = [l for l in inst.output if l and l.startswith("b")]
    if tp > 0 and batch:
        assign[batch[0]] = tuple(range(tp))
    return assign


def megatron_choice(mp: ModelProblem) -> list[int]:
    """The Megatron-style plan as a strategy index per problem node."""
    choice: list[int | None] = [None] * len(mp.names)
    producers = Producers(mp)
    for i, name in enumerate(mp.names):
        cand = mp.candidates[name]
        if cand.node.kind not in (NodeKind.OP, NodeKind.OUTPUT):
            continue
        options = range(len(cand.strategies))
        wanted = _megatron_assignment(mp, name, choice, producers.index)
        if wanted is not None:
            matching = [j for j in options if dict(cand.strategies[j].assignment) == wanted]
            if not matching:  # e.g. the batch does not divide: keep only the tensor-parallel part
                tp_only = {k: v for k, v in wanted.items() if v == (mp.mesh.ndim - 1,)}
                matching = [j for j in options if dict(cand.strategies[j].assignment) == tp_only]
            options = matching or options
        choice[i] = producers.cheapest(name, options, choice)
    for i, name in enumerate(mp.names):
        if choice[i] is not None:
            continue
        cand = mp.candidates[name]
        wanted_spec = producers.wanted_spec(name, choice)
        matches = [j for j, s in enumerate(cand.strategies) if wanted_spec is not None and s.out_spec == wanted_spec]
        usage = lambda j: sum(item.usage[j] for item in cand.items)  # noqa: E731 (the matches' only, not cand.usages')
        choice[i] = min(matches, key=usage) if matches else 0
    return mp.with_storage_of_users([int(c) for c in choice])

