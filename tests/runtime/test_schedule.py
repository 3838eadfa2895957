"""Slapo schedule text, executed as pasted, against the unsharded model on forked gloo ranks."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.distributed as dist
from torch import nn

from autoshard.errors import AutoshardError
from autoshard.sharding.mesh import Mesh, default_links
from autoshard.runtime.collectives import BACKWARD, FORWARD, CommLog
from autoshard.runtime.groups import MeshGroups
from autoshard.runtime.schedule import create_schedule

from .dist import run_ranks
from .plans import _example_module

MEGATRON = """
sch["fc1"].shard("weight", axis=0)
sch["fc1"].shard("bias", axis=0)
sch["fc1"].sync(mode="bwd_post", sync_op_or_fn="all_reduce")
sch["fc2"].shard("weight", axis=1)
sch["fc2"].sync(mode="fwd_post", sync_op_or_fn="all_reduce")
"""
SEQUENCE_DATA = """
sch["fc1"].sync(mode="fwd_pre", sync_op_or_fn="RR->SR")
sch["fc2"].sync(mode="fwd_post", sync_op_or_fn="SR->RR")
"""
# Slapo's "case 4": Megatron with the all-reduce split into reduce-scatter / all-gather on the sequence.
SEQUENCE_MEGATRON = """
sch["fc1"].shard("weight", axis=0)
sch["fc1"].shard("bias", axis=0)
sch["fc1"].sync(mode="fwd_pre", sync_op_or_fn="all_gather", axis=1)
sch["fc2"].shard("weight", axis=1)
sch["fc2"].sync(mode="fwd_post", sync_op_or_fn="reduce_scatter", axis=1)
"""
BATCH, SEQ, HIDDEN, FFN = 2, 8, 16, 32
MLP = functools.partial(_example_module("mlp").MLP, HIDDEN, FFN)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


def _run_mlp(rank: int, world: int, text: str, seq_sharded_io: bool, sum_replicated_grads: bool,
             mesh_axis: int | None = None) -> dict:
    """Reference and scheduled MLP on the same data: relative errors of output, input grad and param grads.

    With ``mesh_axis`` the world is a 2x2 mesh and the schedule shards over that axis's group only.
    """
    group = None if mesh_axis is None else MeshGroups.create(Mesh((2, 2), *default_links((2, 2)))).groups[mesh_axis]
    torch.manual_seed(0)
    ref = MLP()
    x = torch.randn(BATCH, SEQ, HIDDEN)
    w = torch.randn(BATCH, SEQ, HIDDEN)
    xr = x.clone().requires_grad_()
    yr = ref(xr)
    (yr * w).sum().backward()

    log = CommLog()
    sch = create_schedule(copy.deepcopy(ref), group=group, log=log)
    exec(text, {"sch": sch})
    model = sch.module
    world, rank = sch.world_size, sch.rank

    def local(t: torch.Tensor) -> torch.Tensor:  # this rank's sequence slice when inputs/outputs are sharded
        return t.chunk(world, dim=1)[rank] if seq_sharded_io else t

    xs = local(x).clone().requires_grad_()
    y = model(xs)
    (y * local(w)).sum().backward()
    errors = {"output": rel_err(y, local(yr)), "input grad": rel_err(xs.grad, local(xr.grad))}
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        want = ref_params[name].grad
        if name in sch.sharded_tensors:
            want = want.chunk(world, dim=sch.sharded_tensors[name])[rank]
        elif sum_replicated_grads:  # data parallel: ranks saw different tokens; DDP would sum these
            dist.all_reduce(p.grad, group=sch.group)
        errors[name] = rel_err(p.grad, want)
    comm = {phase: [r.kind for r in log.records if r.phase == phase] for phase in (FORWARD, BACKWARD)}
    return {"errors": errors, "comm": comm, "features": (model.fc1.out_features, model.fc2.in_features)}


CASES = {
    "megatron": (MEGATRON, False, False, {FORWARD: ["all_reduce"], BACKWARD: ["all_reduce"]}),
    "sequence-data": (SEQUENCE_DATA, False, True, {FORWARD: ["all_gather"], BACKWARD: ["all_gather"]}),
    "sequence-megatron": (SEQUENCE_MEGATRON, True, False,
                          {FORWARD: ["all_gather", "reduce_scatter"], BACKWARD: ["all_gather", "reduce_scatter"]}),
}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_schedule_text_matches_unsharded_model(case: str, world: int) -> None:
    text, seq_io, sum_grads, comm = CASES[case]
    for rank, out in enumerate(run_ranks(world, _run_mlp, text, seq_io, sum_grads, timeout=30)):
        bad = {k: v for k, v in out["errors"].items() if not v <= 1e-5}
        assert not bad, f"rank {rank}: relative errors {bad}"
        assert out["comm"] == comm
        if "shard" in text:
            assert out["features"] == (FFN // world, FFN // world)


@pytest.mark.parametrize("mesh_axis", [0, 1])
def test_schedule_over_a_subgroup(mesh_axis: int) -> None:
    """On a 2x2 mesh, each axis group runs its own Megatron schedule: sharded over 2, not the world."""
    for out in run_ranks(4, _run_mlp, MEGATRON, False, False, mesh_axis, timeout=30):
        assert max(out["errors"].values()) <= 1e-5, out["errors"]
        assert out["features"] == (FFN // 2, FFN // 2)


def _layout(full: torch.Tensor, kind: str, dim: int, rank: int, world: int, seed: int) -> torch.Tensor:
    """This rank's tensor for a 1-D layout: R full, S chunk along dim, P a term of a sum equal to full."""
    if kind == "R":
        return full.clone()
    if kind == "S":
        return full.chunk(world, dim=dim)[rank].clone()
    gen = torch.Generator().manual_seed(seed)
    terms = [torch.randint(-3, 4, full.shape, generator=gen).float() for _ in range(world - 1)]
    return full - sum(terms) if rank == 0 else terms[rank - 1]


# (mode, op, kwargs, input layout, output layout, output-grad layout, input-grad layout); dim 1 unless said.
OPS = [
    ("fwd_post", "all_reduce", {}, "P", "R", "R", "R"),
    ("fwd_pre", "all_reduce", {}, "P", "R", "R", "R"),
    ("bwd_post", "all_reduce", {}, "R", "R", "P", "R"),
    ("fwd_post", "all_gather", {"axis": 1}, "S", "R", "P", "S"),
    ("fwd_pre", "all_gather", {"axis": -1, "tensor_parallel_output_grad": False}, "S", "R", "R", "S"),
    ("fwd_post", "reduce_scatter", {"axis": 1}, "P", "S", "S", "R"),
    ("fwd_post", "scatter", {"axis": 1}, "R", "S", "S", "R"),
    ("fwd_pre", "RR->RS", {}, "R", "S", "S", "R"),
    ("fwd_post", "RS->RR", {}, "S", "R", "R", "S"),
]


def _run_ops(rank: int, world: int) -> list[str]:
    """Each sync op on an nn.Identity: forward value and backward gradient layouts, exactly."""
    failures = []
    for i, (mode, op, kwargs, x_in, y_out, g_out, g_in) in enumerate(OPS):
        gen = torch.Generator().manual_seed(i)
        full = torch.randint(-5, 6, (4, 8), generator=gen).float()
        gfull = torch.randint(-5, 6, (4, 8), generator=gen).float()
        sch = create_schedule(nn.Sequential(nn.Identity()))
        sch["0"].sync(mode=mode, sync_op_or_fn=op, **kwargs)
        x = _layout(full, x_in, 1, rank, world, seed=100 + i).requires_grad_()
        y = sch.module(x)
        y.backward(_layout(gfull, g_out, 1, rank, world, seed=200 + i))
        if not torch.equal(y.detach(), _layout(full, y_out, 1, rank, world, 0)):
            failures.append(f"{mode} {op}: forward")
        if not torch.equal(x.grad, _layout(gfull, g_in, 1, rank, world, 0)):
            failures.append(f"{mode} {op}: backward")
    return failures


def test_sync_op_semantics() -> None:
    for failures in run_ranks(2, _run_ops, timeout=30):
        assert not failures


def _errors_on_two_ranks(rank: int, world: int) -> dict[str, str]:
    """Messages of the errors that need a real group: indivisible shard, wrong-rank string at run time."""
    out = {}
    sch = create_schedule(nn.Sequential(nn.Linear(4, 3)))
    for name, action in {
        "indivisible": lambda: sch["0"].shard("weight", axis=0),
        "wrong world": lambda: create_schedule(nn.Linear(2, 2), world_size=3),
    }.items():
        try:
            action()
        except AutoshardError as exc:
            out[name] = str(exc)
    sch["0"].sync(mode="fwd_pre", sync_op_or_fn="RRRR->SRRR")
    try:
        sch.module(torch.randn(5, 4))
    except AutoshardError as exc:
        out["letters"] = str(exc)
    sch2 = create_schedule(nn.Sequential(nn.Identity()))
    sch2["0"].sync(mode="fwd_pre", sync_op_or_fn="RS->RR")
    sch3 = create_schedule(nn.Sequential(nn.Identity()))
    sch3["0"].sync(mode="fwd_post", sync_op_or_fn="RR->RS")
    try:
        sch3.module(torch.randn(4, 5))
    except AutoshardError as exc:
        out["indivisible dim"] = str(exc)
    return out


def test_errors_needing_a_group_are_one_line() -> None:
    out = run_ranks(2, _errors_on_two_ranks, timeout=30)[0]
    assert set(out) == {"indivisible", "wrong world", "letters", "indivisible dim"}
    assert all("\n" not in m for m in out.values())
    assert "0.weight" in out["indivisible"] and "size 3" in out["indivisible"] and "world size 2" in out["indivisible"]
    assert "Linear" in out["indivisible"]
    assert "4 letters" in out["letters"]
    assert "size 5" in out["indivisible dim"]


@pytest.mark.parametrize(
    "line, fragment",
    [
        ('sch["fc3"].shard("weight", axis=0)', "no submodule 'fc3'"),
        ('sch["fc1.x"].shard("weight", axis=0)', "fc1 has no submodule 'x'"),
        ('sch["fc1"].shard("wieght", axis=0)', "no parameter or buffer 'wieght'"),
        ('sch["fc1"].shard("weight", axis=2)', "out of range"),
        ('sch["fc1"].sync(mode="bwd_pre", sync_op_or_fn="all_reduce")', "unknown mode"),
        ('sch["fc1"].sync(mode="fwd_post", sync_op_or_fn="broadcast")', "not a sync op"),
        ('sch["fc1"].sync(mode="fwd_pre", sync_op_or_fn="RR->S")', "2 letters before"),
        ('sch["fc1"].sync(mode="fwd_pre", sync_op_or_fn="RX->SR")', "not a sync op"),
        ('sch["fc1"].sync(mode="fwd_pre", sync_op_or_fn="RR-SR")', "not a sync op"),
        ('sch["fc1"].sync(mode="fwd_pre", sync_op_or_fn="SS->RR")', "at most one S"),
        ('sch["fc1"].sync(mode="bwd_post", sync_op_or_fn="RR->SR")', "only sync_op_or_fn=\"all_reduce\""),
        ('sch["fc1"].sync(mode="fwd_post", sync_op_or_fn="all_gather")', "needs axis"),
        ('sch["fc1"].sync(mode="fwd_post", sync_op_or_fn="all_reduce", axis=1)', "takes no axis"),
        ('sch["fc1"].sync(mode="fwd_post", sync_op_or_fn=3)', "must be an op name"),
    ],
)
def test_bad_lines_raise_one_line_errors(line: str, fragment: str) -> None:
    sch = create_schedule(MLP())
    with pytest.raises(AutoshardError) as info:
        exec(line, {"sch": sch})
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_double_shard_and_no_distributed() -> None:
    sch = create_schedule(MLP())
    sch["fc1"].shard("weight", axis=0)
    with pytest.raises(AutoshardError, match="already sharded along axis 0"):
        sch["fc1"].shard("weight", axis=1)
    with pytest.raises(AutoshardError, match="not initialized"):
        create_schedule(MLP(), world_size=2)


def test_single_device_schedule_is_the_model() -> None:
    """Without torch.distributed a schedule runs on one device: every sync is local and exact."""
    torch.manual_seed(0)
    ref = MLP()
    sch = create_schedule(copy.deepcopy(ref), world_size=1, rank=0)
    assert (sch.world_size, sch.rank, sch.group) == (1, 0, None)
    exec(MEGATRON + SEQUENCE_DATA, {"sch": sch})
    x = torch.randn(BATCH, SEQ, HIDDEN)
    torch.testing.assert_close(sch.module(x), ref(x), rtol=0, atol=0)
