"""A lower bound on a pipeline device's time per microbatch under its memory budget, from the parts
``layer_bound.py`` splits a device into, by a Lagrangian relaxation of one memory row.

Formulation. The device's problem, holding ``1 + e`` microbatches in flight, budget ``M`` bytes:

    min_s C(s)   subject to   U_t(s) = sum_{i live at t} u_i(s_i) <= M   for every slot t,

with C as in ``layer_bound.py`` (node costs c_i >= 0, edge prices M_uv >= 0). Three relaxations,
each of which can only lower the minimum:

1. Keep only the row of the horizon slot T (the first backward slot: what is saved for the
   backward, the other microbatches' activations, the parameters, their gradients and optimizer
   state are all held): ``U_T(s) = sum_i r_i(s_i)``, r_i the bytes node i holds at T
   (:func:`horizon_row`). Fewer constraints, more plans.
2. Weak duality, for any lam >= 0: ``min_{U_T <= M} C >= min_s [C(s) + lam (U_T(s) - M)]``
   (every plan that fits adds a nonpositive term).
3. The penalised problem has node costs ``c_i + lam r_i >= 0`` and the same edges, so dropping
   every edge between two groups (the nodes outside the layers; each layer) drops nonnegative
   terms and splits it into one problem per group:

       >= min P_out(lam) + sum_{l sampled} min P_l(lam) + (n - sampled) min_{l in F} P_l(lam) - lam M,

   where, as in ``layer_bound.py``, the groups are read off the device of the option shortened to
   two layers per stage, and every further layer of the full device (a middle layer of a stage)
   is, problem for problem and bytes at T included, the first sampled layer of a stage (F: those
   layers, ``layer_bound.first_layers``; a stage's last layer hands its output off the stage and
   holds less at T, so pricing the further layers as it would undercount their bytes;
   ``tests/pipeline/test_budget_bound.py``).

Each part is minimised exactly by variable elimination (``penalised.py``: the steps no penalty
reaches are run once, at the first multiplier) in float64, less a relative margin of 1e-9 for
rounding; a part too wide for elimination is bounded
by its own floor without penalty plus lam times its fewest bytes at T (still a lower bound of a
concave function). The right side is concave in lam and is maximised by cutting planes on its
subgradient, the minimisers' bytes at T less M (:func:`best_multiplier`); every lam gives a
valid bound, so stopping early only weakens it. Where even the fewest bytes every part holds at T
exceed M, no plan fits and the bound is infinite. Without memory pressure (the unpenalised
minimisers fit at T) the bound is the memory-free one of the split parts.
"""

from __future__ import annotations

import hashlib
import math
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

MARGIN = 1e-9
"""Relative margin taken off every float64 minimum (elimination sums a few thousand terms)."""
STEPS = 12
"""Most evaluations of the penalised parts per device bound after the first."""


def horizon_row(mp: ModelProblem, extra: Fraction) -> list[np.ndarray]:
    """Per node of ``mp`` (built with one microbatch in flight), the bytes it holds at the horizon
    slot when the stage holds ``1 + extra`` microbatches: its owner's memory items as
    ``cost/memory.microbatched_items`` holds them, on the owner's node (its repeating nodes,
    which take its strategy, get 0), and an edge's copies on its copies' first node. The copies
    for the other microbatches are counted by ``microbatched_items``'s own rule (``held_across``,
    ``other_microbatches_bytes``), over whole arrays (``tests/pipeline/test_budget_bound.py`` pins
    the two alike)."""
    if mp.options.in_flight != 1:
        raise ValueError(f"{mp.problem.name} holds {mp.options.in_flight} microbatches in flight: give its "
                         f"problem built with one")
    at = mp.life.horizon
    row = [np.zeros(len(c), dtype=np.int64) for c in mp.problem.node_costs]

    def add(node: int, items, stored: bool) -> None:
        for item in microbatched_items(items, mp.life, Fraction(0), stored):
            if item.interval[0] <= at < item.interval[1]:
                row[node] += np.asarray(item.usage, dtype=np.int64)
        for item in items if extra and not stored else ():
            if held_across(item, at):
                row[node] += other_microbatches_bytes(np.asarray(item.usage, dtype=np.int64), extra)

    for i, name in enumerate(mp.names):
        cand = mp.candidates[name]
        add(i, cand.items, cand.node.kind in (NodeKind.PARAM, NodeKind.BUFFER))
    node = len(mp.names) + len(mp.aux_owner)
    for copies in mp.reshards:
        add(node, copies.items, False)
        node += len(copies.intervals)
    return row


def live_budget(build: Mapping[str, Any]) -> int | None:
    """The live bytes a device's plan may hold under ``build``'s memory budget, derived as
    ``build_model_problem`` derives its problem's limit; None without a budget."""
    device = build.get("device")
    chosen = device if isinstance(device, Device) else get_device(device)
    budget = build["memory_budget"] if build.get("memory_budget") is not None else chosen.memory
    return None if budget is None else chosen.live_limit(budget)


@dataclass(frozen=True)
class Point:
    """A part's penalised minimum at one multiplier and the bytes at T of its minimiser."""

    value: float
    bytes: float


class Part:
    """One group's problem (no memory limit) with its bytes at T, minimised under penalties
    ``lam`` per byte (module formulation, step 3); ``floor`` bounds it where elimination cannot."""

    def __init__(self, problem: ShardingProblem, row: Sequence[np.ndarray],
                 floor: Callable[[ShardingProblem], int]) -> None:
        self.row = [np.asarray(r, dtype=np.float64) for r in row]
        self.fewest = float(sum(r.min() for r in self.row))
        comp = Core(problem).freeze()
        plan = EliminationPlan(comp)
        self.free = None if plan.feasible else floor(problem)
        self.penalised = PenalisedElimination(comp, plan, self.row) if plan.feasible else None
        self.seen: dict[float, Point] = {}

    def at(self, lam: float) -> Point:
        """The part's minimum of cost + ``lam`` x bytes at T (a lower bound of it, when too wide)."""
        if lam not in self.seen:
            if self.penalised is None:
                self.seen[lam] = Point(self.free + lam * self.fewest, self.fewest)
            else:
                x, value = self.penalised.solve(lam)
                self.seen[lam] = Point(value - MARGIN * abs(value), float(sum(r[s] for r, s in zip(self.row, x))))
        return self.seen[lam]


def digest(problem: ShardingProblem, row: Sequence[np.ndarray], matrices: dict[int, bytes] | None = None) -> str:
    """Equal for parts with equal costs, edges and bytes at T (names aside). ``matrices`` memoises
    each edge matrix's own digest by object (problems share pooled matrices): give one dict only
    to parts of one problem, and only while that problem is alive (an object's id is then its own)."""
    matrices = {} if matrices is None else matrices
    h = hashlib.sha1()
    for costs, usage in zip(problem.node_costs, row):
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

    def at(self, lam: float, further: int, limit: int) -> tuple[float, float]:
        """The relaxation's value at ``lam`` (module formulation) and its subgradient; ``check``
        runs first (the search's time limit raises there)."""
        self.check()
        once = [p.at(lam) for p in self.once]
        layer = min((p.at(lam) for p in self.layers), key=lambda point: point.value)
        value = sum(p.value for p in once) + further * layer.value - lam * limit
        return value, sum(p.bytes for p in once) + further * layer.bytes - limit

    def fewest(self, further: int) -> float:
        """At most the bytes at T of every plan."""
        return sum(p.fewest for p in self.once) + further * min(p.fewest for p in self.layers)


class Grid:
    """The multipliers every device's search tries first, shared so that parts common to several
    devices (the same layer under the same microbatches in flight) are minimised once per
    multiplier: ``base * 2 ** (j / 2)`` for whole j, ``base`` set from the first device searched
    (a sixteenth of its free minimum per byte of the limit); ``start`` is where the last search
    ended, where the next begins."""

    def __init__(self) -> None:
        self.base: float | None = None
        self.start = 0

    def at(self, j: int) -> float:
        """The j-th multiplier."""
        return self.base * 2 ** (j / 2)


LOWEST = -40
"""The least grid index a search walks down to (a multiplier 2**-20 of the base)."""


def best_multiplier(parts: DeviceParts, further: int, limit: int, grid: Grid | None = None,
                    enough: float = math.inf) -> float:
    """The largest value found of the concave relaxation over lam >= 0 (module formulation), in
    ticks: lam = 0; then a walk on ``grid`` from its ``start`` to two neighbouring multipliers
    whose subgradients have opposite signs (or lam = 0 and the lowest); then cutting planes between
    them, at most :data:`STEPS` evaluations after the first in all, none once the value found
    reaches ``enough`` (a caller that takes the least of it and ``enough`` needs no more).
    Infinite where no plan holds at most ``limit`` bytes at T."""
    if parts.fewest(further) > limit:
        return math.inf
    f_lo, g_lo = parts.at(0.0, further, limit)
    best = f_lo
    if g_lo <= 0 or best >= enough:
        return best
    grid = grid or Grid()
    if grid.base is None:
        grid.base = f_lo / limit / 16 if f_lo > 0 and limit > 0 else 1.0
    lo, hi = (None, 0.0, f_lo, g_lo), None  # (grid index or None, lam, value, subgradient)
    j, steps = grid.start, 0
    while steps < STEPS and best < enough:
        lam = grid.at(j)
        f, g = parts.at(lam, further, limit)
        steps, best = steps + 1, max(best, f)
        if g > 0:
            lo = (j, lam, f, g)
            if hi is not None and hi[0] == j + 1:
                break
            j += 1
        else:
            hi = (j, lam, f, g)
            if lo[0] == j - 1 or j <= LOWEST:
                break
            j -= 1
    if lo[0] is not None:
        grid.start = lo[0]
    while hi is not None and steps < STEPS and hi[3] < 0 and best < enough:
        (_, a, f_a, g_a), (_, b, f_b, g_b) = lo, hi
        mid = (f_b - f_a + g_a * a - g_b * b) / (g_a - g_b)  # where the two cutting planes meet
        if not a < mid < b or f_a + g_a * (mid - a) - best <= MARGIN * abs(best):
            break
        f, g = parts.at(mid, further, limit)
        steps, best = steps + 1, max(best, f)
        if g > 0:
            lo = (None, mid, f, g)
        else:
            hi = (None, mid, f, g)
    return best
