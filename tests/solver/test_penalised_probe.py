"""toulbar2 on the Lagrangian subproblem (penalised_probe.PenalisedProbe) on random small cores, against
brute force: its plans fit, no single-node move improves them, and with no penalty the
unconstrained optimum comes back whenever it fits."""

from __future__ import annotations

import itertools

import numpy as np

from autoshard.solver.search.penalised_probe import CFN_EVERY, CFN_MAX_SECONDS, CFN_SECONDS, PenalisedProbe
from autoshard.solver.engines.toulbar import can_take
from tests.solver.helpers import FakeClock, core_of, optimum




def direct(call, seconds):
    """The child's runner: toulbar2 called in this process."""
    return call()


def single_moves(comp, x):
    """Every plan one node's strategy away from x."""
    for i, c in enumerate(comp.costs):
        for s in range(len(c)):
            if s != x[i]:
                y = list(x)
                y[i] = s
                yield y


def test_the_probes_plan_fits_and_is_a_local_minimum_and_the_free_optimum_when_that_fits():
    checked = free_fits = 0
    for seed in range(80):
        comp = core_of(seed)
        if comp is None or comp.n < 2 or not comp.has_memory or not can_take(comp, rows=False):
            continue
        plans = list(itertools.product(*[range(len(c)) for c in comp.costs]))
        free = min(comp.cost(list(x)) for x in plans)
        rng = np.random.default_rng(seed)
        for penalty in (np.zeros(sum(len(c) for c in comp.costs)),
                        np.concatenate([rng.integers(0, 50, len(c)).astype(np.float64) for c in comp.costs])):
            search = PenalisedProbe(comp, rng, seed).plan(penalty, CFN_EVERY, None, float("inf"), direct)
            if search is None:
                continue
            x = search.x.tolist()
            assert comp.is_feasible(x) and search.total == comp.cost(x) >= optimum(comp)
            assert all(comp.cost(y) >= search.total for y in single_moves(comp, x) if comp.is_feasible(y))
        search = PenalisedProbe(comp, rng, seed).plan(np.zeros(sum(len(c) for c in comp.costs)), CFN_EVERY, None,
                                                      float("inf"), direct)
        if any(comp.cost(list(x)) == free and comp.is_feasible(list(x)) for x in plans):
            free_fits += 1
            assert search is not None and search.total == free
        checked += 1
    assert checked >= 10 and free_fits >= 3


def recorder():
    """A runner that finds nothing, and the wall-clock limits it was given."""
    asked = []

    def nothing(call, seconds):
        asked.append(seconds)
        return None

    return asked, nothing


def fast_steps() -> FakeClock:
    """A clock 10 s further on at each reading: the steps between calls always outlast a call."""
    return FakeClock(step=10.0)


def test_the_probe_doubles_its_time_after_a_call_that_found_nothing_and_is_due_every_few_steps():
    comp = next(c for c in map(core_of, range(40)) if c is not None and c.n >= 2 and c.has_memory)
    probe = PenalisedProbe(comp, np.random.default_rng(0), 0, clock=fast_steps())
    asked, nothing = recorder()
    steps = [s for s in range(1, 6 * CFN_EVERY + 1) if probe.due(s)
             and probe.plan(np.zeros(sum(len(c) for c in comp.costs)), s, None, float("inf"), nothing) is None]
    assert steps == [CFN_EVERY * k for k in range(1, 7)]
    assert asked == [2 * min(CFN_SECONDS * 2**k, CFN_MAX_SECONDS) + 1 for k in range(6)]


def test_backing_off_the_probe_waits_twice_as_long_after_each_call_that_did_not_pay():
    """The main process's probe: calls whose plan is not below ``best`` (or that found none) put
    the next one off by twice the steps, always with the same time; one that pays resets."""
    def planned(comp):
        zero = np.zeros(sum(len(c) for c in comp.costs))
        return PenalisedProbe(comp, np.random.default_rng(0), 0, clock=fast_steps()).plan(
            zero, 1, None, float("inf"), direct) is not None

    comp = next(c for c in map(core_of, range(40)) if c is not None and c.n >= 2 and c.has_memory and planned(c))
    probe = PenalisedProbe(comp, np.random.default_rng(0), 0, back_off=True, clock=fast_steps())
    asked, nothing = recorder()
    zero = np.zeros(sum(len(c) for c in comp.costs))
    steps = [s for s in range(1, 16 * CFN_EVERY + 1) if probe.due(s) and probe.plan(zero, s, None, float("inf"), nothing) is None]
    assert steps == [CFN_EVERY, 3 * CFN_EVERY, 7 * CFN_EVERY, 15 * CFN_EVERY]
    assert asked == [2 * CFN_SECONDS + 1] * 4
    search = probe.plan(zero, 100, None, float("inf"), direct)  # no best yet: any plan pays
    assert search is not None and probe.next == 100 + CFN_EVERY
    probe.plan(zero, 105, search.total, float("inf"), direct)  # the same optimum again: no gain
    assert probe.next == 105 + 2 * CFN_EVERY



def test_a_call_waits_for_as_much_time_of_steps_as_the_last_call_took():
    """The calls take at most half of the time: after a call of t seconds the next is not due,
    whatever the steps, until t seconds have passed."""
    clock = FakeClock()
    comp = next(c for c in map(core_of, range(40)) if c is not None and c.n >= 2 and c.has_memory)
    probe = PenalisedProbe(comp, np.random.default_rng(0), 0, clock=clock)

    def slow(call, seconds):
        clock.now += 3.0
        return None

    zero = np.zeros(sum(len(c) for c in comp.costs))
    assert probe.due(CFN_EVERY)
    probe.plan(zero, CFN_EVERY, None, float("inf"), slow)
    assert not probe.due(100 * CFN_EVERY)
    clock.now += 2.9
    assert not probe.due(100 * CFN_EVERY)
    clock.now += 0.2
    assert probe.due(2 * CFN_EVERY)
