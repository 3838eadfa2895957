"""A device's bound under its memory budget (budget_bound.py) against exact methods: the bytes at
the horizon against the in-flight problem's, the relaxation against brute force, and the device's
bound against the exact optimum of its whole budgeted problem."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from autoshard.cost.devices import get_device
from autoshard.pipeline.budget_bound import DeviceParts, Part, digest, slot_rows
from autoshard.pipeline.multipliers import Grid, best_multipliers
from autoshard.pipeline.layer_bound import OUTSIDE, first_layers, node_groups, subproblem
from autoshard.pipeline.options import options_for
from autoshard.pipeline.schedules import device_orders, peak_in_flight
from autoshard.pipeline.search import PipelineSearch
from autoshard.sharding.layers import find_repeated_layers
from autoshard.sharding.mesh import parse_mesh
from autoshard.solver import SolveOptions, solve
from autoshard.solver.model.problem import ShardingProblem
from tests.pipeline.models import tiny_llama_graph

LAYERS, BATCH = 6, 8
DEVICE = get_device("h100")
BUDGET = DEVICE.runtime_bytes + (6 << 20)
"""Between the least peak of the first device's plans (1.4 MB live) and its free optimum's (5.6 MB)."""


@pytest.fixture(scope="module")
def engine() -> PipelineSearch:
    mesh = parse_mesh("2x2", None, None, 8, DEVICE.intra, DEVICE.inter)
    build = dict(mode="training", device=DEVICE, precision="bf16-mixed", recompute="full", memory_budget=BUDGET)
    return PipelineSearch(lambda m: tiny_llama_graph(LAYERS, BATCH // m), mesh, 0, build, None)


def _even_option():
    """The 2-stage 1F1B option with its layers cut evenly (3 + 3)."""
    return next(o for o in options_for(LAYERS, 2, [2], ("1f1b",)) if o.counts == (3, 3))


def _at(problem: ShardingProblem, slot: int, choice: list[int]) -> int:
    return sum(int(u[s]) for u, (a, b), s in zip(problem.node_usages, problem.intervals, choice) if a <= slot < b)


def test_bytes_at_the_horizon_are_the_in_flight_problems(engine) -> None:
    """On random plans: the bytes ``slot_rows`` gives the one-in-flight problem's nodes add up to
    the in-flight problem's usage at the horizon and at the optimizer step, and both problems price
    the plan alike."""
    interleaved = options_for(LAYERS, 2, [2], ("interleaved-1f1b",), virtual=(3,))[0]
    rng = np.random.default_rng(0)
    for option, held in ((_even_option(), 1), (_even_option(), 2), (interleaved, 4)):  # 4/3: a third more
        stage = engine.stages(option)[0]
        one = engine.stage_problem(option, stage, option.virtual, bounded=False)
        many = engine.stage_problem(option, stage, held, bounded=True)
        rows = slot_rows(one, Fraction(held, option.virtual) - 1)
        for _ in range(20):
            head = [int(rng.integers(len(one.candidates[n].strategies))) for n in one.names]
            x, y = one.complete(head), many.complete(head)
            for k, slot in enumerate((many.life.horizon, many.life.end - 1)):
                assert sum(int(r[k, s]) for r, s in zip(rows, x)) == _at(many.problem, slot, y)
            assert one.problem.cost(x) == many.problem.cost(y)
    with pytest.raises(ValueError, match="one"):
        even = _even_option()
        slot_rows(engine.stage_problem(even, engine.stages(even)[0], 2, bounded=True), Fraction(0))


@pytest.mark.parametrize("layers, schedule", [(LAYERS, "1f1b"), (12, "interleaved-1f1b")])
def test_the_whole_devices_layers_hold_the_shortened_devices_bytes(engine, layers, schedule) -> None:
    """What the bound assumes, with the bytes at the horizon: the nodes outside the layers of a full
    device are the shortened device's, every layer one of its layers, and every middle layer of a
    stage one of the shortened device's first layers of a stage (``first_layers``)."""
    if layers != LAYERS:
        mesh = parse_mesh("2x2", None, None, 8, DEVICE.intra, DEVICE.inter)
        engine = PipelineSearch(lambda m: tiny_llama_graph(layers, BATCH // m), mesh, 0, dict(engine.build), None)
    graph = engine.graph(2)
    layer_of = {n: i for i, layer in enumerate(find_repeated_layers(graph).layers) for n in layer}
    checked = 0
    for option in options_for(layers, 2, [2], (schedule,)):  # 1F1B (4, 2) first: its last device is alike a
        for device, stage in enumerate(engine.stages(option)):  # shortened one, and shares its problem
            whole = engine.stage_problem(option, stage, option.virtual, bounded=False)
            engine.floors.seconds(option, stage, True, 2)
            short, short_groups = engine.floors.devices[(option.microbatches, 2, option.virtual, device, True)]
            assert short_groups == node_groups(short, layer_of)
            assert len(set(short_groups) - {OUTSIDE}) == 2 * option.virtual  # two layers per stage
            mine = _contents(whole, node_groups(whole, layer_of))
            theirs = _contents(short, short_groups)
            assert mine[OUTSIDE] == theirs[OUTSIDE]
            assert {v for g, v in mine.items() if g != OUTSIDE} <= {v for g, v in theirs.items() if g != OUTSIDE}
            own = sorted(set(node_groups(whole, layer_of)) - {OUTSIDE})
            starts = [sum(stage.counts[:k]) for k in range(len(stage.counts) + 1)]
            middle = [own[i] for a, b in zip(starts, starts[1:]) for i in range(a + 1, b - 1)]
            firsts = {theirs[g] for g in first_layers(short_groups)}
            assert all(mine[g] in firsts for g in middle)
            checked += len(middle)
    assert checked


def _contents(mp, groups) -> dict[int, tuple]:
    row = slot_rows(mp, Fraction(1))
    members: dict[int, list[int]] = {}
    for node, group in enumerate(groups):
        members.setdefault(group, []).append(node)
    out = {}
    for group, nodes in members.items():
        part = subproblem(mp.problem, nodes)
        out[group] = (tuple(tuple(c) for c in part.node_costs), tuple(tuple(row[n].ravel()) for n in nodes),
                      tuple((u, v, m.tobytes()) for (u, v), m in zip(part.edges, part.edge_costs)))
    return out


def test_the_relaxation_is_at_most_its_brute_force_optimum() -> None:
    """Outside and two kinds of layer, two strategies each: cheap and large, or dear and small. The
    bound is at most the least cost of the parts whose bytes fit (brute force), at least the free
    minimum, above it where the cheap plan does not fit, and infinite where nothing fits."""
    def part(costs, usage):
        problem = ShardingProblem([np.array(costs)], [np.zeros(2, dtype=np.int64)], [(0, 0)], [], [])
        return Part(problem, [np.array(usage)], lambda p: 0)

    outside, first, layer = part([5, 9], [40, 10]), part([10, 16], [30, 12]), part([10, 13], [30, 20])
    parts = DeviceParts((outside, first), (first, layer))
    further = 3
    for limit in (60, 100, 130, 200):
        exact = min(outside_c + first_c + sum(c for c, _ in rest)
                    for outside_c, outside_u in zip([5, 9], [40, 10]) for first_c, first_u in zip([10, 16], [30, 12])
                    for rest in itertools.product([(10, 30), (13, 20), (16, 12)], repeat=further)
                    if outside_u + first_u + sum(u for _, u in rest) <= limit)
        bound = best_multipliers(parts, further, limit)
        assert (5 + 10 + 3 * 10) * (1 - 1e-8) <= bound <= exact
        shared = Grid()  # a walk from where another device's search ended finds the same maximum
        best_multipliers(DeviceParts((outside,), (layer,)), 1, 75, shared)
        assert best_multipliers(parts, further, limit, shared) == pytest.approx(bound, rel=1e-9)
        if 40 + 30 + 3 * 30 > limit:
            assert bound > 5 + 10 + 3 * 10
    assert best_multipliers(parts, further, 10 + 12 + 3 * 12 - 1) == float("inf")
    fresh = [part([5, 9], [40, 10]), part([10, 16], [30, 12]), part([10, 13], [30, 20])]
    enough = best_multipliers(DeviceParts((fresh[0], fresh[1]), (fresh[1], fresh[2])), further, 130, enough=40)
    assert enough == pytest.approx(45) and all(set(p.seen) == {(0.0,)} for p in fresh)  # no search past ``enough``


def test_the_budgeted_bound_is_at_most_the_exact_budgeted_optimum(engine) -> None:
    """Every device of a 2-stage 1F1B option, each parameter policy: the bound under the budget is
    at most the exact optimum of the whole budgeted device problem, at least the bound that prices
    the further layers as any sampled layer (above it on the first device), and above the free
    bound on the first device, whose free optimum does not fit."""
    option = _even_option()
    orders = device_orders(option.schedule, option.devices, option.microbatches, option.virtual)
    for device, stage in enumerate(engine.stages(option)):
        held = peak_in_flight(orders[device])
        for kept in (True, False):
            free = engine.floors.seconds(option, stage, kept)
            bound = engine.floors.seconds(option, stage, kept, held)
            mp = engine.stage_problem(option, stage, held, bounded=True, kept=kept)
            found = solve(mp.problem, SolveOptions(timeout=120))
            assert found.status == "optimal"
            exact = found.cost / mp.cost_model.ticks_per_unit
            assert 0 < bound <= exact * (1 + 1e-9)
            weaker = _any_layer_bound(engine, option, stage, device, kept, held)
            assert bound >= weaker * (1 - 1e-9)
            if device == 0:  # its middle layers hold more at the horizon than its stage's last
                assert bound > weaker * (1 + 1e-3)
            if device == 0 and kept:
                assert bound > free * (1 + 1e-4)


def _any_layer_bound(engine, option, stage, device, kept, held) -> float:
    """The device's bound with every further layer priced as any sampled layer (a stage's last
    included): the weaker relaxation that ``first_layers`` tightens."""
    mp, groups = engine.floors.devices[(option.microbatches, option.devices, option.virtual, device, kept)]
    row = slot_rows(mp, Fraction(held, option.virtual) - 1)
    members: dict[int, list[int]] = {}
    for node, group in enumerate(groups):
        members.setdefault(group, []).append(node)
    parts = {g: Part(subproblem(mp.problem, nodes), [row[n] for n in nodes], lambda p: 0) for g, nodes in members.items()}
    relaxed = DeviceParts(tuple(parts.values()), tuple(p for g, p in parts.items() if g != OUTSIDE))
    further = sum(stage.counts) - (len(parts) - 1)
    return best_multipliers(relaxed, further, engine.floors.limit) / mp.cost_model.ticks_per_unit


def test_bounding_under_the_budget_keeps_the_search_time_limit(monkeypatch) -> None:
    """The limit passes while the first device's parts are minimised at the first multiplier (fake
    clock): no further multiplier is tried, and the option is left without a bound."""
    import autoshard.pipeline.budget_bound as budget_bound
    from autoshard.errors import AutoshardError
    from tests.solver.helpers import FakeClock

    clock = FakeClock()
    mesh = parse_mesh("2x2", None, None, 8, DEVICE.intra, DEVICE.inter)
    build = dict(mode="training", device=DEVICE, precision="bf16-mixed", recompute="full", memory_budget=BUDGET)
    engine = PipelineSearch(lambda m: tiny_llama_graph(4, BATCH // m), mesh, 0, build, 100.0, clock=clock)
    calls = []
    minimise = budget_bound.Part.at

    def late(part, lam):
        calls.append(lam)
        clock.now += 200.0
        return minimise(part, lam)

    monkeypatch.setattr(budget_bound.Part, "at", late)
    with pytest.raises(AutoshardError, match="no bound in time"):
        engine.evaluate(options_for(4, 2, [2], ("1f1b",))[0], bounded=False)
    assert calls and set(calls) == {(0.0, 0.0)}


def test_parts_digest_alike_by_content_with_or_without_the_matrix_memo() -> None:
    """Two edges sharing one matrix object: the digest is the same with a memo shared over the
    parts of one problem as without, and differs once a matrix entry or a byte differs."""
    shared = np.array([[0, 3], [2, 0]], dtype=np.int64)

    def part(matrix):
        costs = [np.array([1, 2], dtype=np.int64) for _ in range(3)]
        return ShardingProblem(costs, [np.zeros(2, dtype=np.int64)] * 3, [(0, 0)] * 3, [(0, 1), (1, 2)],
                               [shared, matrix])

    row = [np.array([4, 2])] * 3
    memo: dict[int, bytes] = {}
    assert digest(part(shared), row, memo) == digest(part(shared), row) == digest(part(shared.copy()), row, memo)
    changed = shared.copy()
    changed[0, 1] = 4
    assert digest(part(changed), row, memo) != digest(part(shared), row)
    assert digest(part(shared), [np.array([4, 3])] * 3) != digest(part(shared), row)


def test_two_rows_bound_no_more_than_brute_force_and_more_than_either_row() -> None:
    """Outside and one kind of layer, three strategies each with bytes at the horizon (first row)
    and at the optimizer step (second): the two-row bound is at most the least cost of the parts
    whose bytes fit both rows (brute force), and above the bound of either row alone where each
    row rules out a different cheap plan."""
    def part(costs, rows):
        problem = ShardingProblem([np.array(costs)], [np.zeros(3, dtype=np.int64)], [(0, 0)], [], [])
        return Part(problem, [np.array(rows)], lambda p: 0)

    costs = {"outside": [5, 7, 12], "layer": [10, 10, 15]}
    rows = {"outside": [[40, 10, 10], [10, 40, 10]], "layer": [[30, 8, 8], [8, 30, 8]]}
    further = 3

    def bound(kept: tuple[int, ...]) -> float:  # from the rows ``kept``
        outside = part(costs["outside"], [rows["outside"][k] for k in kept])
        layer = part(costs["layer"], [rows["layer"][k] for k in kept])
        return best_multipliers(DeviceParts((outside, layer), (layer,)), further, limit)

    for limit in (60, 70, 90, 110):
        plans = itertools.product(range(3), repeat=2 + further)
        exact = min(sum(costs["outside" if k == 0 else "layer"][s] for k, s in enumerate(x)) for x in plans
                    if all(sum(rows["outside" if k == 0 else "layer"][r][s] for k, s in enumerate(x)) <= limit
                           for r in (0, 1)))
        both, first, second = bound((0, 1)), bound((0,)), bound((1,))
        assert max(first, second) * (1 - 1e-9) <= both <= exact * (1 + 1e-9)
        if limit < 100:  # the cheap layers of each row overfill the other
            assert both > max(first, second) * (1 + 1e-2)
