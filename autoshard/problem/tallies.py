"""The counts the solver branches on (``solver.problem.Tally``), read off the model's blocks.

Under a memory budget every node of a recomputable block offers each strategy twice, keeping
its activations and recomputing them, and the edges inside a block forbid its nodes to differ
(edges.py): how many blocks recompute is then a whole number in every plan, which the LP
relaxation splits across identical layers. A block's group holds its ops, the parameters they
own (which mirror their owner's choice) and the auxiliary memory nodes tied to either, each with
its twins: the same strategy with the choice flipped.
"""

from __future__ import annotations

from dataclasses import replace

from autoshard.cost.lifetimes import Lifetimes
from autoshard.cost.recompute import Blocks
from autoshard.problem.candidates import Candidate
from autoshard.solver.model.problem import Tally


def recompute_tally(names: list[str], candidates: dict[str, Candidate], blocks: Blocks, life: Lifetimes,
                    aux_owner: list[int]) -> list[Tally]:
    """One tally of the blocks that recompute (none with fewer than two blocks): problem node i
    is ``names[i]``, auxiliary node ``len(names) + j`` mirrors node ``aux_owner[j]``."""
    members: dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]] = {}  # node -> (block, marked, twins)
    # repeated layers' candidates share their strategy, storage and recompute lists (build.py), so
    # the marks and twins are worked out once per distinct triple of lists (405B: ~50 of 6,930 nodes)
    shared: dict[tuple[int, int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for i, name in enumerate(names):
        cand = candidates[name]
        block = blocks.block_of.get(name, blocks.block_of.get(life.first_reader.get(name, "")))
        if block is not None and cand.recompute and any(cand.recompute):
            key = (id(cand.strategies), id(cand.storage), id(cand.recompute))
            if key not in shared:
                shared[key] = (tuple(s for s, again in enumerate(cand.recompute) if again), twins(cand))
            members[i] = (block, *shared[key])
    for j, owner in enumerate(aux_owner):
        if owner in members:
            members[len(names) + j] = members[owner]
    groups: dict[int, list[tuple[int, tuple[int, ...], tuple[int, ...]]]] = {}
    for node, (block, marked, flipped) in members.items():
        groups.setdefault(block, []).append((node, marked, flipped))
    if len(groups) < 2:
        return []
    return [Tally("recomputing blocks", tuple(tuple(group) for _, group in sorted(groups.items())))]


def twins(cand: Candidate) -> tuple[int, ...]:
    """Each strategy's counterpart with the recompute choice flipped, -1 where there is none. A
    parameter gathered again for backward recomputes as the one kept gathered: recomputing
    gathers it again anyway (candidates.py offers only those)."""
    assert cand.recompute is not None
    storage = cand.storage or [None] * len(cand.strategies)
    index = {(cand.strategies[s], storage[s], cand.recompute[s]): s for s in range(len(cand.strategies))}

    def flipped(s: int) -> int:
        kept = storage[s] if storage[s] is None or not storage[s].regather else replace(storage[s], regather=False)
        return index.get((cand.strategies[s], kept, not cand.recompute[s]), -1)

    return tuple(flipped(s) for s in range(len(cand.strategies)))
