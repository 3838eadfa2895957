"""What a reshard allocates, priced by ``cost/reshard_memory.py``, against PyTorch's MemTracker on the
runtime's own reshard (``runtime.collectives.reshard``, forward) on fake tensors and a fake process group."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

from autoshard.cost.reshard_memory import reshard_buffers
from autoshard.runtime.collectives import reshard
from autoshard.runtime.groups import MeshGroups
from autoshard.sharding.mesh import parse_mesh
from autoshard.sharding.reshard import reshard_steps
from autoshard.sharding.spec import TensorSpec

SHAPE = (8, 8, 16)
SPECS = ["RRR", "S0RR", "RS0R", "RRS1", "S0RS1", "RS01R", "S1RS0", "RRRP0", "RRRP1", "RRRP01", "S0RRP1", "RS1RP0"]


def _pairs() -> list[tuple[str, str]]:
    """Every pair of layouts with a reshard between them (a reshard adds no partial sums)."""
    pairs = []
    for a, b in itertools.product(SPECS, SPECS):
        src, dst = TensorSpec.parse(a, 3, 2), TensorSpec.parse(b, 3, 2)
        if a != b and dst.partial <= src.partial:
            pairs.append((a, b))
    return pairs


def _peak(steps, local: tuple[int, ...], groups: MeshGroups) -> tuple[int, int]:
    """MemTracker's peak and final bytes beyond the input, running the reshard forward on a fresh input."""
    with FakeTensorMode():
        tracker = MemTracker()
        with tracker:
            x = torch.empty(local)
            y = reshard(x, steps, (), groups)
            peak = next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"]
            del x
            final = next(iter(tracker.get_tracker_snapshot("current").values()))["Total"]
        del y
    return peak - 4 * torch.Size(local).numel(), final


@pytest.fixture(scope="module")
def groups():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    yield MeshGroups.create(parse_mesh("2x2"))
    dist.destroy_process_group()


def test_every_reshard_allocates_what_the_model_charges(groups) -> None:
    mesh = parse_mesh("2x2")
    checked = 0
    for a, b in _pairs():
        src, dst = TensorSpec.parse(a, 3, 2), TensorSpec.parse(b, 3, 2)
        steps = reshard_steps(src, dst, SHAPE, 4, mesh.shape)
        local = src.local_shape(SHAPE, mesh.shape)
        measured = _peak(steps, local, groups)
        assert reshard_buffers(steps, 4 * torch.Size(local).numel(), mesh.shape) == measured, (a, b, steps)
        checked += 1
    assert checked > 80


def test_no_steps_allocate_nothing() -> None:
    assert reshard_buffers((), 4096, (2, 2)) == (0, 0)
