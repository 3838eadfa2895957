"""The search over pipeline options and the claim it makes (the order is ``search.py``'s "Search").

The recipe's plans are costed first (no solving; the unpipelined candidate of ``--pipeline auto``
is solved, from the recipes its solve starts with) and seed the best, so that a plan exists early;
every option is then bounded (within a share of the time limit; an option's bounding stops once its
devices bounded so far reach the best step); options are then solved cheapest bound first until no
remaining bound is below the best step. Every option left unsolved because its bound reaches the
best step is named in a progress line with that bound and the best step. The claim is the optimum over the options when the best step meets every bound, else the
best step, the least bound and the gap.

At the time limit (``engine.limit``, which every build and solve of the engine keeps) the search
ends with the best plan found so far: options not solved keep the bound they were given, and the
options the bounding phase left without a bound are bounded as soon as there is a best plan, before
any further option is solved (their bounding may stop at the best step; a claim needs every
option's bound, while another solve can only lower the best step); one whose bound fails in time
is counted in ``PipelineResult.unbounded`` and, unless solved in time (then its solve's bound
stands), bounds nothing: the claim's bound is then 0. The recipe's seed plans are costed within the limit like any build;
one not costed by then is left out (a progress line names it), and the search goes on without it. With no plan at all by the limit,
the search raises one line saying how far it got and to raise --timeout. ``engine`` is a :class:`~autoshard.pipeline.search.PipelineSearch`
or anything with its interface (``pipeline/axes.py`` drives several axes as one).
"""

from __future__ import annotations

from typing import Sequence

from autoshard.api import BudgetError
from autoshard.cost.units import format_seconds
from autoshard.errors import AutoshardError
from autoshard.pipeline.options import PipelineOption
from autoshard.pipeline.search import PipelineResult, PipelineSearch, Searched


def search(engine: PipelineSearch, options: Sequence[PipelineOption], seeds: Sequence[PipelineOption] = (),
           bounding_share: float = 0.4) -> PipelineResult:
    """Take the incumbent plans of the ``seeds`` options (the recipe people run) as the first best;
    bound the options (within ``bounding_share`` of the time limit); then solve the options cheapest
    bound first until no bound is below the best. Options left without a bound are bounded once a
    best plan exists, before any further option is solved (ruled out, unsolved, where the bound
    reaches the best step); one still without a bound is solved after the bounded ones while time
    remains, and otherwise leaves the claim without one."""
    best = _seeded(engine, seeds)
    bounds: list[Searched] = []
    unbounded: list[Searched] = []
    told: set[PipelineOption] = set()  # the options said to be ruled out by their bounds
    for k, option in enumerate(options):
        limit = engine.limit
        if limit.passed() or bounds and limit.timeout is not None and limit.elapsed() > bounding_share * limit.timeout:
            engine.progress(f"no time to bound {len(options) - k} more options")
            unbounded += [Searched(o, 0.0, bounded=False) for o in options[k:]]
            break
        try:
            bounds.append(engine.evaluate(option, bounded=False, cutoff=best.step if best else float("inf")))
        except AutoshardError:  # its stages found no plan in their share of the time: no bound
            engine.progress(f"not bounded in time: {option.label}")
            unbounded.append(Searched(option, 0.0, bounded=False))
            continue
        if best is not None and bounds[-1].bound >= best.step:
            engine.progress(_ruled_out(bounds[-1], best))
            told.add(option)
        else:
            engine.progress(f"bound {format_seconds(bounds[-1].bound)}: {option.label}")
    if best is not None:
        best.bound = next((b.bound for b in bounds if b.option == best.option), 0.0)
    searched: list[Searched] = []
    pending = sorted(bounds, key=lambda b: b.bound) + unbounded
    left = len(unbounded)  # options that end without a bound (a solve's plan without one bounds nothing)
    late = False  # whether the options without a bound have been bounded late
    while pending:
        if best is not None and not late:
            # with a plan, the options without a bound are bounded (once) before any other is solved:
            # a claim needs every option's bound, and another solve can only lower the best step
            late = True
            pending = [e if e.bounded or engine.limit.passed() else _late_bound(engine, e, best) for e in pending]
            pending.sort(key=lambda e: (not e.bounded, e.bound))
            left = sum(not e.bounded for e in pending)
        entry = pending.pop(0)
        if engine.limit.passed() or best is not None and entry.bounded and entry.bound >= best.step:
            if best is not None and entry.bounded and entry.bound >= best.step and entry.option not in told:
                engine.progress(_ruled_out(entry, best))
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
    if best is None and (engine.limit.passed() or any(s.origin == "no plan" for s in searched)):
        raise AutoshardError(f"no pipeline option has a plan within the time limit ({len(bounds)} of {len(options)} "
                             f"options bounded, {len(searched)} left unsolved or without a plan): raise --timeout")
    if best is None:
        raise AutoshardError("no pipeline option fits the memory budget: raise --memory-budget, use more "
                             "microbatches, or a larger mesh")
    lower = min(((s.step if s.proved else s.bound) if s.bounded else 0.0 for s in searched), default=best.step)
    return PipelineResult(best, searched, min(lower, best.step), engine.limit.elapsed(), left)


def _late_bound(engine: PipelineSearch, entry: Searched, best: Searched) -> Searched:
    """An option the bounding phase left without a bound, bounded now (its bounding may stop at
    the best step: then it is ruled out unsolved); ``entry`` as it is where that fails in time."""
    try:
        return engine.evaluate(entry.option, bounded=False, cutoff=best.step)
    except AutoshardError:
        return entry


def _ruled_out(entry: Searched, best: Searched) -> str:
    """The progress line of an option whose bound reaches the best step: left unsolved."""
    return (f"ruled out by its bound {format_seconds(entry.bound)} >= the best step {format_seconds(best.step)} "
            f"({best.option.label}): {entry.option.label}")


def _seeded(engine: PipelineSearch, seeds: Sequence[PipelineOption]) -> Searched | None:
    """The best of the seed options costed from the recipe, or None: a pipeline option's recipe
    plans are taken as they are (no solving); the unpipelined candidate (``axes.py``) is solved, from
    the recipes its solve starts with. A seed whose costing fails (the time limit passed in its
    builds) is left out."""
    best = None
    for option in seeds if engine.incumbent is not None else ():
        try:
            seeded = engine.evaluate(option, bounded=True, recipe=engine.incumbent)
        except AutoshardError as exc:  # its builds did not end by the time limit
            engine.progress(f"the baseline plan was not costed: {option.label} ({exc})")
            continue
        if not seeded.fits:
            engine.progress(f"the baseline plan does not fit the budget: {option.label}")
            continue
        kind = "baseline step" if seeded.origin == "baseline" else "step"
        engine.progress(f"{kind} {format_seconds(seeded.step)}: {option.label}")
        if best is None or seeded.step < best.step:
            best = seeded
    return best
