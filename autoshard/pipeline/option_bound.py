"""An option's lower bound: its schedule's critical path over a lower bound on each device's
seconds per microbatch, each device searched no further than ruling the option out needs.

Formulation. The step ``S(T_1, ..., T_p)`` (``stages.critical_path``: the longest path of the
schedule's actions, each lasting its device's share of ``T_d``) is non-decreasing in every
``T_d`` and positively homogeneous, ``S(a T) = a S(T)`` for ``a >= 0`` (every duration scales, so
does every path). Let ``f_d <= T_d`` be each device's bound at no memory penalty (lam = 0 in
``budget_bound.py``: one evaluation of its parts) and ``S_0 = S(f)``. Given the best step ``c``
found so far, take the targets ``t_d = f_d c / S_0``: any bounds ``b_d >= t_d`` give
``S(b) >= S(t) = c``. So each device's multiplier search may stop once its bound reaches ``t_d``
(its ``enough``); the option's bound is ``S`` over the bounds found, and where a device's search
ended below its target, the devices stopped at theirs are searched on without a target.
Without a best step (``c`` infinite) every device's search runs to its end.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

from autoshard.errors import AutoshardError
from autoshard.pipeline.stages import Stage, critical_path

Floor = Callable[[Stage, int, bool, float], "float | None"]
"""A device's lower bound in seconds per microbatch: (its stage, microbatches it holds in flight,
parameters kept gathered, ``enough``: its search may stop once the bound reaches this) -> the
bound, or None where none was found in time (``PipelineSearch.device_floor``)."""


def option_bound(floor: Floor, label: str, stages: Sequence[Stage], stage_count: int, orders: list,
                 groups: Mapping[tuple, list[int]], held: Mapping[tuple, int], cutoff: float = math.inf) -> float:
    """The option's bound (module formulation): ``groups`` its alike devices by signature,
    ``held`` their microbatches in flight; the fullest devices are searched first, and the search
    stops once the critical path over the devices bounded so far (the others at 0) reaches
    ``cutoff``. Raises ``AutoshardError`` where a device gets no bound in time (``label`` names
    the option)."""
    def device(sig: tuple, kept: bool, enough: float) -> float:
        found = floor(stages[groups[sig][0]], held[sig], kept, enough)
        if found is None:
            raise AutoshardError(f"no bound in time: {label}")
        return found

    def path(floors: Mapping[tuple, float]) -> float:
        return critical_path(stage_count, stages, orders, [floors.get(st.signature, 0.0) for st in stages])

    order = sorted(groups, key=lambda g: -held[g] * sum(g[0]))
    if cutoff == math.inf:
        return _searched(device, path, order, dict.fromkeys(order, math.inf), cutoff)
    free = {sig: min(device(sig, True, 0.0), device(sig, False, 0.0)) for sig in order}
    start = path(free)
    if start >= cutoff:
        return start
    targets = {sig: free[sig] * cutoff / start if start > 0 else math.inf for sig in order}
    return _searched(device, path, order, targets, cutoff)


def _searched(device: Callable[[tuple, bool, float], float], path: Callable[[Mapping[tuple, float]], float],
              order: list[tuple], targets: Mapping[tuple, float], cutoff: float,
              known: Mapping[tuple, float] | None = None) -> float:
    """``path`` over each device's lesser bound of its two parameter policies (``known``: those
    already searched to their end), each searched to its target (past the kept policy's bound
    the other's need not be searched); where that ends below ``cutoff``, the devices that reached
    their targets are searched again without one."""
    floors = dict(known or {})
    bound = path(floors)
    for sig in order:
        if sig in floors:
            continue
        gathered = device(sig, True, targets[sig])
        floors[sig] = min(gathered, device(sig, False, min(gathered, targets[sig])))
        bound = path(floors)
        if bound >= cutoff:
            return bound
    short = {sig: floors[sig] for sig in order if not floors[sig] >= targets[sig]}
    if len(short) == len(order):
        return bound
    return _searched(device, path, order, dict.fromkeys(order, math.inf), cutoff, short)
