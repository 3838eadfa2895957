"""Executed reshards against the global tensor: values, gradients and bytes, for every spec pair.

Each mesh gets one forked run that checks all (src, dst) pairs of specs of an (8, 4, 8) tensor
that fit the mesh (every axis unused, partial, or sharding one dim, in every order). Values are
small integers, so sums are exact and pieces are compared with ``torch.equal``. Workers return
a list of mismatches instead of asserting, so one run reports every failing pair.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from autoshard.sharding.mesh import Mesh, default_links
from autoshard.sharding.reshard import SLICE, reshard_steps
from autoshard.runtime.collectives import BACKWARD, FORWARD, CommLog, charged_bytes, mask_to_first, reshard, run_steps
from autoshard.runtime.groups import MeshGroups
from autoshard.sharding.spec import TensorSpec

from .dist import run_ranks

SHAPE = (8, 4, 8)
ITEMSIZE = 4  # float32


def make_mesh(shape: tuple[int, ...]) -> Mesh:
    return Mesh(shape, *default_links(shape))


def all_specs(mesh_shape: tuple[int, ...], shape: tuple[int, ...]) -> list[TensorSpec]:
    """Every spec of a tensor of ``shape`` that fits the mesh: each axis unused, partial, or on a dim."""
    specs = []
    for choice in itertools.product([None, "P", *range(len(shape))], repeat=len(mesh_shape)):
        partial = frozenset(a for a, c in enumerate(choice) if c == "P")
        per_dim = [[a for a, c in enumerate(choice) if c == d] for d in range(len(shape))]
        for orders in itertools.product(*(itertools.permutations(axes) for axes in per_dim)):
            spec = TensorSpec(tuple(orders), partial)
            if spec.fits(shape, mesh_shape):
                specs.append(spec)
    return specs


def piece(full: torch.Tensor, spec: TensorSpec, coords: tuple[int, ...], mesh_shape: tuple[int, ...]) -> torch.Tensor:
    """The device's piece of ``full`` under the sharded dims of ``spec`` (partial axes ignored)."""
    for d, n in enumerate(full.shape):
        k = n // spec.shard_factor(d, mesh_shape)
        full = full.narrow(d, spec.chunk_index(d, coords, mesh_shape) * k, k)
    return full


def partial_terms(full: torch.Tensor, axes: list[int], mesh_shape: tuple[int, ...], seed: int) -> dict:
    """Random integer terms, one per coordinate combination on ``axes``, that sum to ``full``."""
    combos = list(itertools.product(*(range(mesh_shape[a]) for a in axes)))
    gen = torch.Generator().manual_seed(seed)
    terms = {c: torch.randint(-4, 5, full.shape, generator=gen).float() for c in combos[1:]}
    terms[combos[0]] = full - sum(terms.values(), torch.zeros_like(full))
    return terms


def local_value(full: torch.Tensor, spec: TensorSpec, coords: tuple[int, ...], mesh_shape: tuple[int, ...],
                terms_axes: list[int], terms: dict) -> torch.Tensor:
    """This device's local tensor under ``spec`` when ``full`` is split into ``terms`` over ``terms_axes``.

    Axes of ``terms_axes`` still partial in ``spec`` select this device's term; the others are summed.
    """
    total = torch.zeros_like(full)
    for c, term in terms.items():
        if all(c[i] == coords[a] for i, a in enumerate(terms_axes) if a in spec.partial):
            total += term
    return piece(total, spec, coords, mesh_shape)


def _check_pairs(rank: int, world: int, mesh_shape: tuple[int, ...]) -> tuple[int, list[str]]:
    """Every spec pair on this mesh: reshard's value, gradient, and collectives and bytes per pass."""
    mesh = make_mesh(mesh_shape)
    groups = MeshGroups.create(mesh)
    coords = groups.coords
    specs = all_specs(mesh_shape, SHAPE)
    errors: list[str] = []
    checked = 0
    for case, (src, dst) in enumerate(itertools.product(specs, specs)):
        if not dst.partial <= src.partial:
            continue
        checked += 1
        name = f"{src.format(mesh.ndim)}->{dst.format(mesh.ndim)}"
        gen = torch.Generator().manual_seed(case)
        full = torch.randint(-8, 9, SHAPE, generator=gen).float()
        axes = sorted(src.partial)
        terms = partial_terms(full, axes, mesh_shape, seed=10_000 + case)
        steps = reshard_steps(src, dst, SHAPE, ITEMSIZE, mesh_shape)
        x = local_value(full, src, coords, mesh_shape, axes, terms)

        # Gradient: arrives laid out as dst (partial terms included), leaves as src without partials.
        grad_src = src.without_partial()
        bwd_steps = reshard_steps(dst, grad_src, SHAPE, ITEMSIZE, mesh_shape)
        gfull = torch.randint(-8, 9, SHAPE, generator=gen).float()
        gaxes = sorted(dst.partial)
        gterms = partial_terms(gfull, gaxes, mesh_shape, seed=20_000 + case)

        log = CommLog()
        x.requires_grad_()
        y = reshard(x, steps, bwd_steps, groups, log)  # forward is run_steps(x, steps)
        y.backward(local_value(gfull, dst, coords, mesh_shape, gaxes, gterms))
        if not torch.equal(y.detach(), local_value(full, dst, coords, mesh_shape, axes, terms)):
            errors.append(f"{name}: value")
        if not torch.equal(x.grad, piece(gfull, grad_src, coords, mesh_shape)):
            errors.append(f"{name}: gradient")
        for phase, planned in ((FORWARD, steps), (BACKWARD, bwd_steps)):
            logged = [(r.kind, r.axis) for r in log.records if r.phase == phase]
            if logged != [(s.kind, s.axis) for s in planned if s.kind != SLICE]:
                errors.append(f"{name}: {phase} collectives {logged} differ from the steps")
            if log.total_bytes(phase) != charged_bytes(planned, mesh_shape):
                errors.append(f"{name}: {phase} sent {log.total_bytes(phase)} bytes, "
                              f"plan charged {charged_bytes(planned, mesh_shape)}")
    return checked, errors


@pytest.mark.parametrize("mesh_shape", [(2,), (4,), (8,), (2, 2), (2, 4)], ids=lambda s: "x".join(map(str, s)))
def test_every_spec_pair(mesh_shape: tuple[int, ...]) -> None:
    results = run_ranks(math.prod(mesh_shape), _check_pairs, mesh_shape, timeout=80)
    checked = {c for c, _ in results}
    assert len(checked) == 1 and checked.pop() > 0
    errors = sorted({e for _, errs in results for e in errs})
    assert not errors, f"{len(errors)} failures, e.g. {errors[:10]}"


def test_spec_enumeration_covers_orders_and_partials() -> None:
    specs = all_specs((2, 2), SHAPE)
    texts = {s.format(2) for s in specs}
    assert {"S01RR", "S10RR", "RRRP01", "S0RS1", "RS1RP0", "RRR"} <= texts
    assert len(specs) == len(texts) == 28


def _megatron_pair_and_masks(rank: int, world: int) -> dict:
    """Megatron's f and g as step lists, a no-grad producer, and mask_to_first in both gradient modes."""
    mesh = make_mesh((2, 2))
    groups = MeshGroups.create(mesh)
    shape = (4, 6)
    rep, part = TensorSpec.replicated(2), TensorSpec(((), ()), frozenset({1}))
    all_reduce = reshard_steps(part, rep, shape, ITEMSIZE, mesh.shape)
    out: dict = {}

    x = torch.full(shape, float(rank + 1))
    y = run_steps(x, all_reduce, groups)  # plain tensors: a new result, the input untouched
    out["run_steps"] = (y[0, 0].item(), x[0, 0].item(), y.requires_grad)

    x = torch.full(shape, float(rank + 1), requires_grad=True)
    log = CommLog()
    y = reshard(x, (), all_reduce, groups, log)  # f: identity forward, all-reduce backward
    y.backward(torch.full(shape, float(10 * (rank + 1))))
    out["f"] = (torch.equal(y, x), x.grad[0, 0].item(), log.total_bytes(FORWARD), log.total_bytes(BACKWARD))

    x = torch.full(shape, float(rank + 1), requires_grad=True)
    y = reshard(x, all_reduce, (), groups)  # g: all-reduce forward, identity backward
    y.backward(torch.ones(shape))
    out["g"] = (y[0, 0].item(), x.grad[0, 0].item())
    y.add_(1)  # outputs are not views of the input: in-place use downstream is allowed

    log = CommLog()
    y = reshard(torch.ones(shape), all_reduce, all_reduce, groups, log)
    out["no_grad"] = (y.requires_grad, y.grad_fn is None, len(log.records))

    for axes in [(0,), (1,), (0, 1)]:
        for mask_grad in (True, False):
            b = torch.arange(6.0, requires_grad=True)
            m = mask_to_first(b, axes, groups, mask_grad)
            (m * torch.arange(6.0)).sum().backward()
            out[axes, mask_grad] = (m.detach().tolist(), b.grad.tolist())
    out["coords"] = groups.coords
    return out


def test_megatron_pair_no_grad_and_masks() -> None:
    results = run_ranks(4, _megatron_pair_and_masks, timeout=30)
    for rank, out in enumerate(results):
        coords = out["coords"]
        assert coords == (rank // 2, rank % 2)
        partner = rank ^ 1  # same axis-0 coordinate, other axis-1 coordinate
        # f: forward identity, backward sums the partial gradient over axis 1 (24 elements x 4 B, n=2).
        assert out["f"] == (True, 10.0 * (rank + 1 + partner + 1), 0, 2 * 1 * 96 // 2)
        assert out["run_steps"] == (float(rank + 1 + partner + 1), float(rank + 1), False)
        # g: forward sums over axis 1, backward identity.
        assert out["g"] == (float(rank + 1 + partner + 1), 1.0)
        assert out["no_grad"] == (False, True, 1)
        for axes in [(0,), (1,), (0, 1)]:
            keep = all(coords[a] == 0 for a in axes)
            ones = [float(i) for i in range(6)]
            zeros = [0.0] * 6
            assert out[axes, True] == ((ones if keep else zeros), (ones if keep else zeros))
            assert out[axes, False] == ((ones if keep else zeros), ones)
