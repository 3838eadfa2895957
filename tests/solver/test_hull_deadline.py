"""The hull's time (column_generation.py, run/workers.py "hull"): a pricing step cut short at the
deadline still gives the bound at its messages, and the hull engine works to the run's deadline,
which the engine pool hands it."""

from __future__ import annotations

import numpy as np

import autoshard.solver.bounds.column_generation as column_generation
import autoshard.solver.bounds.trws as trws
import autoshard.solver.run.workers as workers
from autoshard.solver.api import SolveOptions
from autoshard.solver.bounds.column_generation import ColumnGeneration
from autoshard.solver.run.workers import Engine
from tests.solver.test_column_generation import _FakeClock, hull_value, with_random_tally
from tests.solver.test_hull_engine import _portfolio_on, run_hull
from tests.solver.test_branching import layers_that_must_partly_recompute
from tests.solver.test_milp import cores, fitting_plans


def test_a_step_cut_short_at_the_deadline_gives_a_bound_that_holds_and_prices_no_column(monkeypatch) -> None:
    """The deadline passes between the search's check and the first sweep's: the step's bound is
    TRW-S's at the messages as they stand (valid for any messages), below the exact dual and the
    optimum, and no column joins the pool."""
    clock = _FakeClock()  # each reading a millisecond after the last
    monkeypatch.setattr(column_generation, "time", clock)
    monkeypatch.setattr(trws, "time", clock)
    rng = np.random.default_rng(17)
    for comp, best in cores(8):
        counted = with_random_tally(comp, rng)
        generation = ColumnGeneration(counted, rng, lambda x: None)
        generation.add(np.array(fitting_plans(counted)[0]))
        result = generation.search([], clock.now + 1.5e-3)  # the loop's reading passes, the sweep's does not
        assert result.bound is not None and len(generation.costs) == 1
        assert result.bound <= hull_value(counted, []) + 1e-6 * abs(best) and result.bound <= best


def test_the_hull_engine_with_no_time_left_ends_without_pricing() -> None:
    """Told the run has no time left, the engine prices nothing (its reserve for the last bound
    is more than the time left) and ends; told nothing, it bounds the same core."""
    comp, _ = cores(1)[0]
    counted = with_random_tally(comp, np.random.default_rng(19))
    start = fitting_plans(counted)[0]
    timed = run_hull(counted, counted.cost(start), start, seconds=workers.HULL_RESERVE / 2)
    assert not [e for e in timed if e.kind in ("bound", "plan")]
    untimed = run_hull(counted, counted.cost(start), start)
    assert [e for e in untimed if e.kind == "bound"]


def test_the_engine_pool_tells_each_engine_the_time_the_run_leaves(monkeypatch) -> None:
    """The hull (here one that ends at once) is started with the seconds left to the run's
    deadline, read on the run's clock."""
    monkeypatch.setitem(workers.ENGINES, "hull", Engine("hull", "ends at once", lambda worker, report: None,
                                                        source="hull", bounds=True))
    pool = _portfolio_on(layers_that_must_partly_recompute(8), SolveOptions(timeout=50.0)).pool
    state = pool.state
    try:
        before = state.left()
        pool.start(["hull"], "the hull engine")
        after = state.left()
    finally:
        pool.stop()
    seconds = pool.engines[0].seconds
    assert seconds is not None and after <= seconds <= before <= 50.0
