"""The plan's memory choices per repeated block, as PyTorch runs them: checkpoint_wrapper and fully_shard.

- A recomputed segment (``Plan.recompute``) is one block under ``checkpoint_wrapper``: full, or
  selective when the plan keeps some of its ops (``Plan.recompute_kept``: torchtitan's op policy,
  as ``cost/recompute.py`` prices it, fused attention and every other weight matmul saved).
- ``fully_shard(block, reshard_after_forward=...)``: ``False`` keeps the gathered parameters from
  forward to backward (the plan's default), ``True`` frees them after forward and gathers them
  again for backward (the plan's re-gathered parameters, ``EdgeReshard.regather``). A recomputed
  block gathers again in its recomputation, as the cost model charges it, so it is ``True``.
  When only some of a block's parameters are re-gathered, their modules get their own
  ``fully_shard(..., reshard_after_forward=True)`` inside the block's, which keeps the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoshard.frontend.graph import NodeKind, OpGraph
from autoshard.problem.plan import Plan
from autoshard.sharding.layers import find_repeated_layers

NONE, FULL, SELECTIVE = "none", "full", "selective"


@dataclass(frozen=True)
class Unit:
    """One ``fully_shard`` unit: a block (or the root, path ``""``), how it recomputes and whether it
    reshards after forward; ``regathered``: its submodules sharded apart to re-gather their parameters."""

    path: str
    recompute: str = NONE
    reshard: bool = False
    regathered: tuple[str, ...] = ()


@dataclass(frozen=True)
class Units:
    """The repeated blocks' container (None without repeated layers), one unit per block, and the root."""

    container: str | None
    blocks: tuple[Unit, ...]
    root: Unit


def _reshard(params: set[str], regathered: set[str]) -> tuple[bool, tuple[str, ...]]:
    """The unit's reshard_after_forward and the submodules to shard apart for a partial re-gather."""
    again = params & regathered
    if not again or again == params:
        return bool(again), ()
    return False, tuple(sorted({name.rpartition(".")[0] for name in again}))


def memory_units(plan: Plan, graph: OpGraph, sharded: set[str]) -> Units:
    """The units of ``plan``; ``sharded``: the parameters fully_shard manages (the others are left out)."""
    regathered = {graph[e.src].qualname for e in plan.edges if e.regather and graph[e.src].kind == NodeKind.PARAM}
    params = {n.qualname for n in graph if n.kind == NodeKind.PARAM} & sharded
    layers = find_repeated_layers(graph)
    if layers is None:
        reshard, apart = _reshard(params, regathered)
        return Units(None, (), Unit("", reshard=reshard, regathered=apart))
    kept = set(plan.recompute_kept)
    recomputed = [set(segment) for segment in plan.recompute]
    blocks = []
    for i, names in enumerate(layers.layers):
        path = f"{layers.container}.{i}"
        segment = next((s for s in recomputed if s & set(names)), None)
        mode = NONE if segment is None else SELECTIVE if segment & kept else FULL
        own = {p for p in params if p.startswith(path + ".")}
        params -= own
        reshard, apart = (True, ()) if mode != NONE else _reshard(own, regathered)
        blocks.append(Unit(path, mode, reshard, apart))
    reshard, apart = _reshard(params, regathered)
    return Units(layers.container, tuple(blocks), Unit("", reshard=reshard, regathered=apart))
