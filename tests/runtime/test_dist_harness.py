"""The fork harness reports the rank that failed on its own before peers that only saw it leave, and
runs a group whose rank a signal killed once more, reporting what the killed rank last printed."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from .dist import RankError, run_ranks


def _rank_one_fails(rank: int, world: int) -> int:
    store = dist.distributed_c10d._get_default_store()
    if rank == 2:  # reports a peer leaving before rank 1 reports its own failure (rank 0 serves the store)
        store.set("zero reported", "1")
        raise RuntimeError("Read error: Connection reset by peer")
    if rank == 1:
        store.wait(["zero reported"])
        raise ValueError("rank one's own failure")
    dist.all_reduce(torch.ones(1))  # waits on ranks that have left
    return rank


def _all_reduce(rank: int, world: int) -> float:
    x = torch.tensor([float(rank)])
    dist.all_reduce(x)
    return float(x)


def test_the_own_failure_leads_the_report() -> None:
    with pytest.raises(RankError) as caught:
        run_ranks(3, _rank_one_fails, timeout=30)
    report = str(caught.value)
    assert report.startswith("rank 1 failed:"), report[:200]
    assert "rank one's own failure" in report


def test_ranks_share_one_group_through_the_parents_store() -> None:
    assert run_ranks(3, _all_reduce) == [3.0, 3.0, 3.0]


def _abort_on_the_first_run(rank: int, world: int, marker: str) -> int:
    if rank == 1 and not os.path.exists(marker):
        Path(marker).touch()
        print("last words before the abort", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGABRT)
    dist.barrier()
    return rank


def _abort_always(rank: int, world: int) -> int:
    if rank == 0:
        print("last words before the abort", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGABRT)
    return rank


def test_a_group_whose_rank_a_signal_killed_runs_once_more(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="(?s)rank 1 died with exit code -6.*last words before the abort"):
        assert run_ranks(2, _abort_on_the_first_run, str(tmp_path / "aborted once"), timeout=30) == [0, 1]


def test_a_rank_killed_on_every_run_fails_with_its_last_words() -> None:
    with pytest.warns(UserWarning), pytest.raises(RankError) as caught:
        run_ranks(2, _abort_always, timeout=30, connect=False)
    assert caught.value.killed
    report = str(caught.value)
    assert "rank 0 died with exit code -6; its stderr:\nlast words before the abort" in report
    assert "Fatal Python error: Aborted" in report  # faulthandler's stacks of the killed rank


def _compile_pool_answers(rank: int, world: int) -> int:
    from torch._inductor.async_compile import AsyncCompile

    return AsyncCompile.pool().submit(lambda: rank + 1).result(timeout=20)


def test_ranks_compile_on_a_pool_of_their_own_where_the_parent_had_one() -> None:
    """torch resets inductor's process pool after a fork but not its thread pool: a rank given the
    parent's pool (threads that did not survive the fork) would wait forever on its first kernel."""
    import torch._inductor.config as inductor_config
    from torch._inductor.async_compile import AsyncCompile

    AsyncCompile.pool.cache_clear()
    with inductor_config.patch(compile_threads=2):  # the config's own patching: restored on exit
        try:
            assert AsyncCompile.pool().submit(lambda: 0).result(timeout=20) == 0  # the parent's threads run
            assert run_ranks(2, _compile_pool_answers, timeout=60, connect=False) == [1, 2]
        finally:
            AsyncCompile.pool().shutdown(wait=False)
            AsyncCompile.pool.cache_clear()
