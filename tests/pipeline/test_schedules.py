"""Pipeline schedules against their closed forms (uniform stages) and their dependency rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from autoshard.errors import AutoshardError
from autoshard.pipeline.options import PipelineOption, options_for, schedule_overhead
from autoshard.pipeline.schedules import SCHEDULES, device_orders, timing


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12), f=st.floats(0.5, 3.0), ratio=st.floats(1.0, 3.0),
       schedule=st.sampled_from(["gpipe", "1f1b"]))
def test_one_stage_per_device_takes_m_plus_p_minus_1_slots(p: int, m: int, f: float, ratio: float,
                                                            schedule: str) -> None:
    """Uniform stages: GPipe and 1F1B both take (m + p - 1)(f + b), the textbook bubble."""
    b = f * ratio
    orders = device_orders(schedule, p, m)
    t = timing(orders, [f] * p, [b] * p)
    assert t.step == pytest.approx((m + p - 1) * (f + b))
    expected = [m] * p if schedule == "gpipe" else [min(m, p - d) for d in range(p)]
    assert list(t.in_flight) == expected


@settings(max_examples=30, deadline=None)
@given(p=st.integers(2, 5), groups=st.integers(1, 3), v=st.integers(2, 3))
def test_interleaving_divides_the_bubble_by_the_virtual_stages(p: int, groups: int, v: int) -> None:
    """Uniform chunks of f, b (a device's work split in v): step = m(f + b)v + (p - 1)(f + b), i.e.
    the 1F1B bubble over v (Narayanan et al. 2021), and every action runs exactly once."""
    m, f, b = groups * p, 1.0, 2.0
    orders = device_orders("interleaved-1f1b", p, m, v)
    assert sorted((a.kind, a.stage, a.microbatch) for o in orders for a in o) == sorted(
        {(k, s, i) for k in "FB" for s in range(p * v) for i in range(m)})
    t = timing(orders, [f] * (p * v), [b] * (p * v))
    assert t.step == pytest.approx(m * v * (f + b) + (p - 1) * (f + b))
    assert t.in_flight[0] > t.in_flight[-1]


def test_transfers_and_a_slow_stage_lie_on_the_critical_path() -> None:
    """Two stages, two microbatches, the second stage twice as slow: worked by hand."""
    orders = device_orders("1f1b", 2, 2)
    t = timing(orders, [1.0, 2.0], [2.0, 4.0], transfer=0.5)
    # F0(0) 0-1 | send 1.5 | F1(0) 1.5-3.5, B1(0) 3.5-7.5 ... F1(1) needs F0(1) (1-2)+0.5: runs 7.5-9.5,
    # B1(1) 9.5-13.5, send 14, B0(1) 14-16 (B0(0) ran 8-10 after 7.5 + 0.5).
    assert t.step == pytest.approx(16.0)


def test_bad_schedules_are_one_line_errors() -> None:
    with pytest.raises(AutoshardError, match="multiple of 4"):
        device_orders("interleaved-1f1b", 4, 6, 2)
    with pytest.raises(AutoshardError, match="unknown"):
        device_orders("zero-bubble", 4, 8)
    assert set(SCHEDULES) == {"gpipe", "1f1b", "interleaved-1f1b"}


@pytest.mark.parametrize("schedule, devices, microbatches, virtual", [
    ("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 8, 32, 1), ("interleaved-1f1b", 4, 8, 2),
    ("interleaved-1f1b", 8, 16, 2)])
def test_schedule_overhead_of_even_stages_is_the_textbook_bubble(schedule, devices, microbatches, virtual):
    """Equal stages: the step over the work spread evenly is 1 + (p - 1) / (v m) (Narayanan et al. 2021)."""
    option = PipelineOption(schedule, devices, microbatches, virtual, (2,) * (devices * virtual))
    assert schedule_overhead(option) == pytest.approx(1 + (devices - 1) / (virtual * microbatches))


def test_options_come_in_order_of_their_schedule_overhead():
    options = options_for(126, 8, [8, 16, 32])
    overheads = [schedule_overhead(o) for o in options]
    assert overheads == sorted(overheads) and len(options) == 18
    assert options[0].schedule == "interleaved-1f1b" and options[0].microbatches == 32
