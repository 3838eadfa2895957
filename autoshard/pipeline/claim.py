"""The search over pipeline options and the claim it makes (the order is ``search.py``'s "Search").

Every option is bounded first (within a share of the time limit); the recipe's plans seed the
best; options are then solved cheapest bound first until no remaining bound is below the best
step. The claim is the optimum over the options when the best step meets every bound, else the
best step, the least bound and the gap. ``engine`` is a :class:`~autoshard.pipeline.search.PipelineSearch`
or anything with its interface (``pipeline/axes.py`` drives several axes as one).
"""

from __future__ import annotations

import time
from typing import Mapping, Sequence

from autoshard.api import BudgetError
from autoshard.cost.units import format_seconds
from autoshard.errors import AutoshardError
from autoshard.pipeline.options import PipelineOption
from autoshard.pipeline.search import PipelineResult, PipelineSearch, Searched


def search(engine: PipelineSearch, options: Sequence[PipelineOption], seeds: Sequence[PipelineOption] = (),
           bounding_share: float = 0.4) -> PipelineResult:
    """Bound the options (within ``bounding_share`` of the time limit); take the incumbent plans of
    the ``seeds`` options (the recipe people run) as the first best; then solve the options cheapest
    bound first until no bound is below the best. Options left without a bound are solved after the
    bounded ones while time remains, and leave the claim without a bound."""
    bounds: list[Searched] = []
    unbounded: list[Searched] = []
    for k, option in enumerate(options):
        if bounds and engine.timeout is not None and time.monotonic() - engine.start > bounding_share * engine.timeout:
            engine.progress(f"no time to bound {len(options) - k} more options")
            unbounded += [Searched(o, 0.0, bounded=False) for o in options[k:]]
            break
        try:
            bounds.append(engine.evaluate(option, bounded=False))
        except AutoshardError:  # its stages found no plan in their share of the time: no bound
            engine.progress(f"not bounded in time: {option.label}")
            unbounded.append(Searched(option, 0.0, bounded=False))
            continue
        engine.progress(f"bound {format_seconds(bounds[-1].bound)}: {option.label}")
    best = _seeded(engine, seeds, {b.option: b.bound for b in bounds})
    searched: list[Searched] = []
    for entry in sorted(bounds, key=lambda b: b.bound) + unbounded:
        left = engine.remaining()
        if best is not None and (entry.bounded and entry.bound >= best.step or left is not None and left <= 1.0):
            searched.append(entry)
            continue
        try:
            solved = engine.evaluate(entry.option, bounded=True)
        except BudgetError as exc:  # proved: no plan of this option fits
            engine.progress(f"does not fit: {entry.option.label} ({exc})")
            continue
        except AutoshardError as exc:  # none found in time: its bound stays in the claim
            engine.progress(f"no plan found: {entry.option.label} ({exc})")
            entry.origin = "no plan"
            searched.append(entry)
            continue
        solved.bound = max(solved.bound, entry.bound)
        proved = " (proved)" if solved.proved else ""
        engine.progress(f"step {format_seconds(solved.step)}{proved}: {entry.option.label}")
        searched.append(solved)
        if best is None or solved.step < best.step:
            best = solved
    if best is None:
        raise AutoshardError("no pipeline option fits the memory budget: raise --memory-budget, use more "
                             "microbatches, or a larger mesh")
    lower = 0.0 if unbounded else min(s.step if s.proved else s.bound for s in searched)
    return PipelineResult(best, searched, min(lower, best.step), time.monotonic() - engine.start, len(unbounded))


def _seeded(engine: PipelineSearch, seeds: Sequence[PipelineOption], bounds: Mapping[PipelineOption, float]
            ) -> Searched | None:
    """The best of the seed options under the incumbent plans alone (no solving), or None."""
    best = None
    for option in seeds if engine.incumbent is not None else ():
        seeded = engine.evaluate(option, bounded=True, recipe=engine.incumbent)
        if not seeded.fits:
            engine.progress(f"the baseline plan does not fit the budget: {option.label}")
            continue
        seeded.bound, seeded.origin = bounds.get(option, 0.0), "baseline"
        engine.progress(f"baseline step {format_seconds(seeded.step)}: {option.label}")
        if best is None or seeded.step < best.step:
            best = seeded
    return best
