"""Options bounded by this process and a forked child (``pipeline/bound_peer.py``): every option
once, by microbatch count where it can, the child stopped while a solve runs, and the search's
bounds and claim the same as bounding alone."""

from __future__ import annotations

import os
import time

import pytest

from autoshard.errors import AutoshardError
from autoshard.pipeline import bound_peer
from autoshard.pipeline.bound_peer import BoundingPeer
from autoshard.pipeline.claim import search
from autoshard.pipeline.options import PipelineOption
from tests.pipeline.test_claim import Stub

WAIT = 60.0
"""Seconds a test waits for the child before it fails (never reached when the child works)."""


def _options(counts: list[int]) -> list[PipelineOption]:
    return [PipelineOption("1f1b", 2, m, 1, (k + 1, 3 - k)) for k, m in enumerate(counts)]


def _bound(option: PipelineOption, cutoff: float) -> float:
    """A bound known to both processes: a function of the option and the cutoff."""
    if option.counts == (3, 1):
        raise AutoshardError("no bound in time")
    return option.microbatches * 10 + option.counts[0] + min(cutoff, 0.5)


def _drain(peer: BoundingPeer) -> dict[int, float | None]:
    """Take and bound options here until none is free, then wait for the child; every answer by index."""
    own: dict[int, float | None] = {}
    deadline = time.monotonic() + WAIT
    while (k := peer.take()) is not None:
        try:
            own[k] = _bound(peer.options[k], peer.cutoff)
        except AutoshardError:
            own[k] = None
    while peer.in_flight():
        assert time.monotonic() < deadline, "the child never answered"
        time.sleep(0.01)
    child = peer.found()
    assert not set(own) & set(child), "an option was bounded twice"
    return own | child


def test_two_processes_bound_every_option_once_with_the_cutoff_of_the_moment() -> None:
    options = _options([4, 4, 2, 2, 1])
    with BoundingPeer(options, processors=2) as peer:
        peer.cutoff = 0.25
        peer.start(_bound)
        found = _drain(peer)
    assert sorted(found) == list(range(len(options)))
    for k, option in enumerate(options):
        expected = None if option.counts == (3, 1) else option.microbatches * 10 + option.counts[0] + 0.25
        assert found[k] == expected


def test_each_process_keeps_to_the_microbatch_counts_it_took_first() -> None:
    """This process takes two options of one count before the child is forked; the child then
    starts on a count nobody has taken, keeps to it, and takes the other count's last option last."""
    options = _options([8, 8, 2, 8, 2, 2])
    assert _child_order(options, here=2) == [2, 4, 5, 3]


def test_the_child_builds_every_count_nobody_has_taken_before_going_on_with_its_own() -> None:
    options = _options([8, 2, 2, 4, 4])
    assert _child_order(options, here=1) == [1, 3, 2, 4]


def _child_order(options: list[PipelineOption], here: int) -> list[int]:
    """The options the child takes, in its order, after this process took ``here`` of them
    (which must be the first ones, in order)."""
    with BoundingPeer(options, processors=2) as peer:
        assert [peer.take() for _ in range(here)] == list(range(here))  # the first, then its own count
        peer.start(lambda option, cutoff: time.monotonic())  # the child's answers in the order it took them
        deadline = time.monotonic() + WAIT
        while peer.in_flight() or peer.untaken():
            assert time.monotonic() < deadline, "the child never answered"
            time.sleep(0.01)
        found = peer.found()
    return sorted(found, key=found.get)


def test_a_paused_child_is_stopped_and_resumes_after() -> None:
    options = _options([4, 4])
    with BoundingPeer(options, processors=2) as peer:
        peer.start(lambda option, cutoff: time.sleep(WAIT) or 1.0)
        deadline = time.monotonic() + WAIT
        while not peer.in_flight():  # the child has taken its option
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with peer.paused():
            assert _state(peer.pid, "T", deadline) == "T"
        assert _state(peer.pid, "S", deadline) in "SR"


def _state(pid: int, wanted: str, deadline: float) -> str:
    """The process's state letter (/proc), polled until it is ``wanted`` or the deadline passes."""
    while True:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state in wanted or time.monotonic() > deadline:
            return state
        time.sleep(0.01)


def test_without_a_second_processor_nothing_is_forked() -> None:
    options = _options([4, 2])
    with BoundingPeer(options, processors=1) as peer:
        peer.start(_bound)
        assert peer.pid is None
        assert [peer.take(), peer.take(), peer.take()] == [0, 1, None]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the child needs a second processor")
def test_the_search_with_a_child_bounds_and_claims_as_alone() -> None:
    options = _options([8, 8, 4, 4, 2, 2])
    bounds = {o: 5.0 + k for k, o in enumerate(options)}
    steps = {o: 5.5 + k for k, o in enumerate(options)}
    alone = search(Stub(bounds, steps, seed=100.0), options, processors=1)
    both = search(Stub(bounds, steps, seed=100.0), options, processors=2)
    assert [(s.option, s.bound, s.step) for s in both.searched] == [(s.option, s.bound, s.step) for s in alone.searched]
    assert (both.best.option, both.lower_bound, both.unbounded) == (alone.best.option, alone.lower_bound, 0)


def test_the_cutoff_each_option_was_taken_at_is_known_while_the_child_bounds_it() -> None:
    """An option the child took before the best step fell is seen as in flight at the old cutoff
    (the search then bounds it here too, at the new one)."""
    options = _options([4, 2])
    with BoundingPeer(options, processors=2) as peer:
        peer.cutoff = 9.0
        assert peer.take() == 0
        peer.start(lambda option, cutoff: time.sleep(WAIT) or 1.0)
        deadline = time.monotonic() + WAIT
        while not peer.in_flight():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        peer.cutoff = 3.0
        assert peer.in_flight() == {1: 9.0}


@pytest.mark.parametrize("running, forks", [(1.0, True), (1.4, False), (3.0, False)])
def test_a_child_is_forked_only_where_a_processor_is_idle(monkeypatch, running: float, forks: bool) -> None:
    """On two processors: this process runs on one (it counts itself among those running), the
    child needs the other."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(bound_peer, "_running", lambda: running)
    assert BoundingPeer(_options([4, 2])).forks is forks
    assert BoundingPeer(_options([4, 2]), processors=2).forks  # told: forks whatever runs


def test_the_runnable_count_is_read_and_counts_the_reader() -> None:
    assert bound_peer._running() >= 1.0
