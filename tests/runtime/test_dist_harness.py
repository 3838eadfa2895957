"""The fork harness reports the rank that failed on its own before peers that only saw it leave."""

from __future__ import annotations

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
