"""The solver's starting plan: the cheapest hand-written plan that fits the memory budget.

Under a budget the solver's own first plan (a minimum-memory start repaired to fit) can fail on
large problems where the plans people run fit with room to spare (LLaMA-3 405B on 8x8x8 at
80 GiB: torchtitan's FSDP over the data axes, tensor parallelism on the last, every layer
recomputed). Each recipe below is costed in the same model; the cheapest one that fits is handed
to the solver as its first best (``SolveOptions.start``), so the answer is that plan or a cheaper
one, never none. Costing one recipe is a pass over the nodes and their incoming edges
(``Producers``): seconds on 405B's 31k decision nodes, so the recipes stop at ``deadline``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from autoshard.problem.baselines.megatron import megatron_choice
from autoshard.problem.baselines.torchtitan import torchtitan_choice
from autoshard.problem.build import ModelProblem
from autoshard.solver.model.problem import FORBIDDEN

Clock = Callable[[], float]


@dataclass(frozen=True)
class Start:
    """A hand-written plan that fits: its name, a strategy per problem node, its exact cost and peak."""

    name: str
    choice: tuple[int, ...]
    cost: int
    peak: int


def recipes(mp: ModelProblem) -> list[tuple[str, Callable[[ModelProblem], list[int]]]]:
    """The hand-written plans tried, in order: torchtitan's FSDP over every data axis (all but the
    tensor-parallel last; its ``dp_shard`` on a 3-D mesh), FSDP over the first axis alone, Megatron."""
    ndim = mp.mesh.ndim
    tried: list[tuple[str, Callable[[ModelProblem], list[int]]]] = []
    if ndim > 2:
        data = tuple(range(ndim - 1))
        tried.append((f"torchtitan (FSDP over mesh axes {','.join(map(str, data))}, TP on axis {ndim - 1})",
                      lambda m: torchtitan_choice(m, data)))
    tried.append(("torchtitan (FSDP over mesh axis 0" + (f", TP on axis {ndim - 1})" if ndim > 1 else ")"),
                  torchtitan_choice))
    tried.append(("Megatron", megatron_choice))
    return tried


def starting_plan(mp: ModelProblem, deadline: float | None = None, clock: Clock = time.monotonic) -> Start | None:
    """The cheapest recipe (``recipes``) that fits ``mp``'s memory limit and avoids forbidden costs,
    or None (none fits, or there is no limit: then the solver's own first plan fits anyway). No
    recipe starts once ``clock()`` has reached ``deadline``."""
    p = mp.problem
    if p.usage_limit is None:
        return None
    best: Start | None = None
    for name, choose in recipes(mp):
        if deadline is not None and clock() >= deadline:
            break
        choice = choose(mp)
        peak = p.peak_usage(choice)
        cost = p.cost(choice)
        if peak <= p.usage_limit and cost < FORBIDDEN and (best is None or cost < best.cost):
            best = Start(name, tuple(choice), cost, peak)
    return best
