"""A lower bound on a pipeline device's time per microbatch under its memory budget, from the parts
``layer_bound.py`` splits a device into, by a Lagrangian relaxation of two memory rows.

Formulation. The device's problem, holding ``1 + e`` microbatches in flight, budget ``M`` bytes:

    min_s C(s)   subject to   U_t(s) = sum_{i live at t} u_i(s_i) <= M   for every slot t,

with C as in ``layer_bound.py`` (node costs c_i >= 0, edge prices M_uv >= 0). Three relaxations,
each of which can only lower the minimum:

1. Keep only the rows of two slots (:data:`SLOTS`, :func:`slot_rows`): the horizon T (the first
   backward slot: what is saved for the backward, the other microbatches' activations, the
   parameters, their gradients and optimizer state are all held) and the optimizer step E (the
   last slot: the parameters, their optimizer state and its step's buffer, the gradients, those
   accumulated in a gathered layout over the step included, and the other microbatches' copies):
   ``U_t(s) = sum_i r_ti(s_i)``, r_ti the bytes node i holds at t. Fewer constraints, more plans.
2. Weak duality, for any lam = (lam_T, lam_E) >= 0:
   ``min_{U_T, U_E <= M} C >= min_s [C(s) + sum_t lam_t (U_t(s) - M)]`` (every plan that fits adds
   a nonpositive term).
3. The penalised problem has node costs ``c_i + sum_t lam_t r_ti >= 0`` and the same edges, so
   dropping every edge between two groups (the nodes outside the layers; each layer) drops
   nonnegative terms and splits it into one problem per group:

       >= min P_out(lam) + sum_{l sampled} min P_l(lam) + (n - sampled) min_{l in F} P_l(lam) - |lam| M,

   where |lam| = lam_T + lam_E and, as in ``layer_bound.py``, the groups are read off the device
   of the option shortened to two layers per stage, and every further layer of the full device (a
   middle layer of a stage) is, problem for problem and bytes at T and E included, the first
   sampled layer of a stage (F: those layers, ``layer_bound.first_layers``; a stage's last layer
   hands its output off the stage and holds less at T, so pricing the further layers as it would
   undercount their bytes; ``tests/pipeline/test_budget_bound.py``).

Each part is minimised exactly by variable elimination (``penalised.py``: the steps no penalty
reaches are run once, at the first multipliers) in float64, less a relative margin of 1e-9 for
rounding; a part too wide for elimination is bounded by its own floor without penalty plus lam
times its fewest bytes in each row (still a lower bound of a concave function). The right side
is concave in lam and is maximised by ``multipliers.best_multipliers``; every lam gives a valid
bound, so stopping early only weakens it. Where even the fewest bytes every part holds in one
row exceed M, no plan fits and the bound is infinite. Without memory pressure (the unpenalised
minimisers fit in both rows) the bound is the memory-free one of the split parts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from autoshard.cost.devices import Device, get_device
from autoshard.cost.memory import held_across, microbatched_items, other_microbatches_bytes
from autoshard.frontend.graph import NodeKind
from autoshard.pipeline.penalised import PenalisedElimination
from autoshard.problem.build import ModelProblem
from autoshard.solver.core.reduced import Core
from autoshard.solver.engines.elimination import EliminationPlan
from autoshard.solver.model.problem import ShardingProblem

SLOTS = ("horizon", "optimizer step")
"""The slots whose memory rows the relaxation keeps (module formulation, step 1), in row order."""

MARGIN = 1e-9
"""Relative margin taken off every float64 minimum (elimination sums a few thousand terms)."""


def slot_rows(mp: ModelProblem, extra: Fraction) -> list[np.ndarray]:
    """Per node of ``mp`` (built with one microbatch in flight), the bytes it holds at each slot of
    :data:`SLOTS` (one row per slot: an array of shape (2, strategies)) when the stage holds
    ``1 + extra`` microbatches: its owner's memory items as ``cost/memory.microbatched_items`` holds
    them, on the owner's node (its repeating nodes, which take its strategy, get 0), and an edge's
    copies on its copies' first node. The copies for the other microbatches are counted by
    ``microbatched_items``'s own rule (``held_across``, ``other_microbatches_bytes``: held the whole
    step), over whole arrays (``tests/pipeline/test_budget_bound.py`` pins the rows to the in-flight
    problem's usage at both slots)."""
    if mp.options.in_flight != 1:
        raise ValueError(f"{mp.problem.name} holds {mp.options.in_flight} microbatches in flight: give its "
                         f"problem built with one")
    slots = (mp.life.horizon, mp.life.end - 1)
    rows = [np.zeros((len(slots), len(c)), dtype=np.int64) for c in mp.problem.node_costs]

    def add(node: int, items, stored: bool) -> None:
        for item in microbatched_items(items, mp.life, Fraction(0), stored):
            for k, at in enumerate(slots):
                if item.interval[0] <= at < item.interval[1]:
                    rows[node][k] += np.asarray(item.usage, dtype=np.int64)
        for item in items if extra and not stored else ():
            if held_across(item, mp.life.horizon):
                rows[node] += other_microbatches_bytes(np.asarray(item.usage, dtype=np.int64), extra)

    for i, name in enumerate(mp.names):
        cand = mp.candidates[name]
        add(i, cand.items, cand.node.kind in (NodeKind.PARAM, NodeKind.BUFFER))
    node = len(mp.names) + len(mp.aux_owner)
    for copies in mp.reshards:
        add(node, copies.items, False)
        node += len(copies.intervals)
    return rows


def live_budget(build: Mapping[str, Any]) -> int | None:
    """The live bytes a device's plan may hold under ``build``'s memory budget, derived as
    ``build_model_problem`` derives its problem's limit; None without a budget."""
    device = build.get("device")
    chosen = device if isinstance(device, Device) else get_device(device)
    budget = build["memory_budget"] if build.get("memory_budget") is not None else chosen.memory
    return None if budget is None else chosen.live_limit(budget)


@dataclass(frozen=True)
class Point:
    """A part's penalised minimum at one pair of multipliers and the bytes its minimiser holds in each row."""

    value: float
    bytes: np.ndarray


class Part:
    """One group's problem (no memory limit) with its bytes in each row, minimised under penalties
    ``lam`` per byte (module formulation, step 3); ``floor`` bounds it where elimination cannot."""

    def __init__(self, problem: ShardingProblem, rows: Sequence[np.ndarray],
                 floor: Callable[[ShardingProblem], int]) -> None:
        self.rows = [np.atleast_2d(np.asarray(r, dtype=np.float64)) for r in rows]
        self.fewest = sum((r.min(axis=1) for r in self.rows), np.zeros(len(self.rows[0]) if self.rows else 1))
        comp = Core(problem).freeze()
        plan = EliminationPlan(comp)
        self.free = None if plan.feasible else floor(problem)
        self.penalised = PenalisedElimination(comp, plan, self.rows) if plan.feasible else None
        self.seen: dict[tuple[float, ...], Point] = {}

    def at(self, lam: tuple[float, ...]) -> Point:
        """The part's minimum of cost + ``lam`` . bytes (a lower bound of it, when too wide)."""
        if lam not in self.seen:
            if self.penalised is None:
                self.seen[lam] = Point(self.free + float(np.dot(lam, self.fewest)), self.fewest)
            else:
                x, value = self.penalised.solve(lam)
                held = sum((r[:, s] for r, s in zip(self.rows, x)), np.zeros(len(self.fewest)))
                self.seen[lam] = Point(value - MARGIN * abs(value), held)
        return self.seen[lam]


def digest(problem: ShardingProblem, rows: Sequence[np.ndarray], matrices: dict[int, bytes] | None = None) -> str:
    """Equal for parts with equal costs, edges and bytes in each row (names aside). ``matrices`` memoises
    each edge matrix's own digest by object (problems share pooled matrices): give one dict only
    to parts of one problem, and only while that problem is alive (an object's id is then its own)."""
    matrices = {} if matrices is None else matrices
    h = hashlib.sha1()
    for costs, usage in zip(problem.node_costs, rows):
        h.update(np.ascontiguousarray(costs).tobytes() + b"/" + np.ascontiguousarray(usage).tobytes() + b"|")
    for (u, v), matrix in zip(problem.edges, problem.edge_costs):
        if id(matrix) not in matrices:
            matrices[id(matrix)] = hashlib.sha1(np.ascontiguousarray(matrix).tobytes()).digest()
        h.update(f"{u},{v},{matrix.shape},{matrix.dtype}".encode() + matrices[id(matrix)])
    return h.hexdigest()


@dataclass(frozen=True)
class DeviceParts:
    """A device's parts: those counted once (outside the layers, each sampled layer) and the
    layers one of which every further layer is (F); ``check`` runs before each evaluation."""

    once: tuple[Part, ...]
    layers: tuple[Part, ...]
    check: Callable[[], None] = lambda: None

    def at(self, lam: tuple[float, ...], further: int, limit: int) -> tuple[float, np.ndarray]:
        """The relaxation's value at ``lam`` (module formulation) and its subgradient, one entry per
        row; ``check`` runs first (the search's time limit raises there)."""
        self.check()
        once = [p.at(lam) for p in self.once]
        layer = min((p.at(lam) for p in self.layers), key=lambda point: point.value)
        value = sum(p.value for p in once) + further * layer.value - sum(lam) * limit
        return value, sum(p.bytes for p in once) + further * layer.bytes - limit

    def fewest(self, further: int) -> np.ndarray:
        """At most the bytes every plan holds in each row."""
        return sum(p.fewest for p in self.once) + further * np.min([p.fewest for p in self.layers], axis=0)
