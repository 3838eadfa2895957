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

Bounding uses an idle second processor: a forked child bounds the pipelined options beside this process
(``bound_peer.py``; the whole-model option is bounded here, as bounding it may solve it), each
bound as it would be here, and is stopped while anything is solved.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Callable, Sequence

from autoshard.api import BudgetError
from autoshard.cost.units import format_seconds
from autoshard.errors import AutoshardError
from autoshard.pipeline.bound_peer import BoundingPeer
from autoshard.pipeline.options import NO_PIPELINE, PipelineOption
from autoshard.pipeline.results import PipelineResult, Searched
from autoshard.pipeline.search import PipelineSearch


def search(engine: PipelineSearch, options: Sequence[PipelineOption], seeds: Sequence[PipelineOption] = (),
           bounding_share: float = 0.4, processors: int | None = None) -> PipelineResult:
    """Take the incumbent plans of the ``seeds`` options (the recipe people run) as the first best;
    bound the options (within ``bounding_share`` of the time limit); then solve the options cheapest
    bound first until no bound is below the best. Options left without a bound are bounded once a
    best plan exists, before any further option is solved (ruled out, unsolved, where the bound
    reaches the best step); one still without a bound is solved after the bounded ones while time
    remains, and otherwise leaves the claim without one. With two ``processors`` (None: where one is
    idle) a forked child bounds pipelined options meanwhile, stopped while a solve runs
    (``bound_peer.py``)."""
    piped = [o for o in options if o.schedule != NO_PIPELINE]  # bounding the whole model may solve it: not forked
    with BoundingPeer(piped, processors) as peer:
        peer.start(lambda option, cutoff: engine.evaluate(option, bounded=False, cutoff=cutoff).bound)
        best = _seeded(engine, seeds, peer)
        peer.cutoff = best.step if best else math.inf
        bounds, unbounded, told = _bounding_phase(engine, options, piped, peer, best, bounding_share)
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
                pending = _late_bounds(engine, pending, best, piped, peer)
                left = sum(not e.bounded for e in pending)
            entry = pending.pop(0)
            if engine.limit.passed() or best is not None and entry.bounded and entry.bound >= best.step:
                if best is not None and entry.bounded and entry.bound >= best.step and entry.option not in told:
                    engine.progress(_ruled_out(entry, best))
                searched.append(entry)
                continue
            try:
                with peer.paused():
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


def _bounding_phase(engine: PipelineSearch, options: Sequence[PipelineOption], piped: list[PipelineOption],
                    peer: BoundingPeer, best: Searched | None,
                    share: float) -> tuple[list[Searched], list[Searched], set[PipelineOption]]:
    """Every option bounded at the best step (infinite without one) while the phase's ``share`` of
    the limit lasts (``_bound_shared``), each bound said as it is known. The bounded options in
    ``options``' order, those left without a bound, and those said to be ruled out by their bounds."""
    said: dict[PipelineOption, float | None] = {}
    told: set[PipelineOption] = set()
    limit = engine.limit

    def say_new(own: dict[PipelineOption, float | None]) -> None:
        for option, bound in _merged(own, piped, peer).items():
            if option in said:
                continue
            said[option] = bound
            if bound is None:
                engine.progress(f"not bounded in time: {option.label}")
            elif best is not None and bound >= best.step:
                engine.progress(_ruled_out(Searched(option, bound), best))
                told.add(option)
            else:
                engine.progress(f"bound {format_seconds(bound)}: {option.label}")

    def stop() -> bool:
        return limit.passed() or bool(said) and limit.timeout is not None and limit.elapsed() > share * limit.timeout

    rest = [o for o in options if o.schedule == NO_PIPELINE]
    own, stopped = _bound_shared(engine, piped, peer, best.step if best else math.inf, rest, stop, say_new)
    if stopped:
        engine.progress(f"no time to bound {peer.untaken() + len(rest)} more options")
    say_new(own)
    bounds = [Searched(o, said[o]) for o in options if said.get(o) is not None]
    unbounded = [Searched(o, 0.0, bounded=False) for o in options if said.get(o) is None]
    return bounds, unbounded, told


def _bound_shared(engine: PipelineSearch, piped: list[PipelineOption], peer: BoundingPeer, cutoff: float,
                  rest: list[PipelineOption], stop: Callable[[], bool],
                  heard: Callable[[dict[PipelineOption, float | None]], None] = lambda own: None,
                  ) -> tuple[dict[PipelineOption, float | None], bool]:
    """Options bounded here at ``cutoff`` while ``peer``'s child bounds others: the pipelined ones
    as ``peer`` hands them to this process, one the child took at a greater cutoff here too (it may
    take far longer there), then ``rest`` (taken from the list); until none is left and the child
    has answered, or ``stop()`` (checked, after ``heard(bounds so far)``, before each). The bounds
    found here (None: not in time) and whether ``stop()`` ended it."""
    own: dict[PipelineOption, float | None] = {}
    while True:
        heard(own)
        if stop():
            return own, True
        k = peer.take()
        if k is None:
            waiting = {j: at for j, at in peer.in_flight().items() if piped[j] not in own}
            k = next((j for j, at in waiting.items() if at > cutoff), None)
            if k is None and not rest:
                if not waiting:
                    return own, False
                time.sleep(0.05)  # the child's answer: it bounds a cheap option, or orders the solves
                continue
        option = piped[k] if k is not None else rest.pop(0)
        try:
            own[option] = engine.evaluate(option, bounded=False, cutoff=cutoff).bound
        except AutoshardError:  # its stages found no plan in their share of the time: no bound
            own[option] = None


def _merged(own: dict[PipelineOption, float | None], piped: list[PipelineOption],
            peer: BoundingPeer) -> dict[PipelineOption, float | None]:
    """The bounds found here and by ``peer``'s child, the greater where both bounded an option
    (None: tried and not bounded in time)."""
    found = dict(own)
    for k, bound in peer.found().items():
        mine = found.get(piped[k])
        found[piped[k]] = bound if mine is None else mine if bound is None else max(mine, bound)
    return found


def _late_bounds(engine: PipelineSearch, pending: list[Searched], best: Searched, piped: list[PipelineOption],
                 peer: BoundingPeer) -> list[Searched]:
    """``pending`` with the options the bounding phase left without a bound bounded now at the best
    step (ruled out, unsolved, where the bound reaches it): first those neither process took, with
    the child (``_bound_shared``), then any still without a bound here; the bounded ones cheapest
    first, then the rest."""
    peer.cutoff = best.step
    own, _ = _bound_shared(engine, piped, peer, best.step, [], engine.limit.passed)
    found = _merged(own, piped, peer)
    pending = [e if e.bounded else Searched(e.option, found[e.option]) if found.get(e.option) is not None
               else e if engine.limit.passed() else _late_bound(engine, e, best) for e in pending]
    return sorted(pending, key=lambda e: (not e.bounded, e.bound))


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


def _seeded(engine: PipelineSearch, seeds: Sequence[PipelineOption], peer: BoundingPeer) -> Searched | None:
    """The best of the seed options costed from the recipe, or None: a pipeline option's recipe
    plans are taken as they are (no solving); the unpipelined candidate (``axes.py``) is solved, from
    the recipes its solve starts with, with ``peer``'s child stopped. A seed whose costing fails
    (the time limit passed in its builds) is left out."""
    best = None
    for option in seeds if engine.incumbent is not None else ():
        solves = peer.paused() if option.schedule == NO_PIPELINE else contextlib.nullcontext()
        try:
            with solves:
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
