"""A numpy model of a device mesh: every device's local piece, and the reshard steps applied to them.

Used to check reshard step lists against the definition of a layout, without torch.distributed.
"""

from __future__ import annotations

import itertools

import numpy as np

from autoshard.sharding.reshard import Step
from autoshard.sharding.spec import TensorSpec


def all_coords(mesh_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every device's mesh coordinates."""
    return list(itertools.product(*[range(n) for n in mesh_shape]))


def piece(full: np.ndarray, spec: TensorSpec, coords: tuple[int, ...], mesh_shape: tuple[int, ...]) -> np.ndarray:
    """The piece of ``full`` the device at ``coords`` holds under ``spec`` (partial ignored)."""
    out = full
    for d in range(spec.ndim):
        k = spec.shard_factor(d, mesh_shape)
        out = np.split(out, k, axis=d)[spec.chunk_index(d, coords, mesh_shape)]
    return out


def place(full: np.ndarray, spec: TensorSpec, mesh_shape: tuple[int, ...], rng: np.random.Generator) -> dict:
    """Local values of every device; partial axes hold random addends that sum to ``full``."""
    partial = sorted(spec.partial)
    groups = list(itertools.product(*[range(mesh_shape[a]) for a in partial]))
    addends = {g: rng.standard_normal(full.shape) for g in groups[:-1]}
    addends[groups[-1]] = full - sum(addends.values(), np.zeros_like(full))
    return {c: piece(addends[tuple(c[a] for a in partial)], spec, c, mesh_shape) for c in all_coords(mesh_shape)}


def _group(c: tuple[int, ...], axis: int, n: int) -> list[tuple[int, ...]]:
    return [c[:axis] + (i,) + c[axis + 1:] for i in range(n)]


def apply_step(local: dict, step: Step, mesh_shape: tuple[int, ...]) -> dict:
    """Apply one step to every device's local value, by the step semantics in reshard.py."""
    a, n = step.axis, mesh_shape[step.axis]
    out = {}
    for c, x in local.items():
        group = [local[g] for g in _group(c, a, n)]
        if step.kind == "slice":
            out[c] = np.split(x, n, axis=step.dim)[c[a]]
        elif step.kind == "all_gather":
            out[c] = np.concatenate(group, axis=step.dim)
        elif step.kind == "all_reduce":
            out[c] = sum(group)
        elif step.kind == "reduce_scatter":
            out[c] = np.split(sum(group), n, axis=step.dim)[c[a]]
        elif step.kind == "all_to_all":
            out[c] = np.concatenate([np.split(g, n, axis=step.to_dim)[c[a]] for g in group], axis=step.dim)
        else:
            raise ValueError(step.kind)
    return out


def reduce_partial(local: dict, spec: TensorSpec, mesh_shape: tuple[int, ...]) -> dict:
    """Sum each device's value over the spec's partial axes (what the layout stands for)."""
    out = {}
    for c in local:
        groups = [c]
        for a in sorted(spec.partial):
            groups = [g2 for g in groups for g2 in _group(g, a, mesh_shape[a])]
        out[c] = sum(local[g] for g in groups)
    return out
