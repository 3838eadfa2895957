"""The flags of ``autoshard.solve`` turned into what they control, in one place for every branch.

A model file is solved whole or, with ``--pipeline``, as pipeline stages; both branches take
their build options from :func:`build_options` and their solver options from
``problem_file.solve_options``, so a flag cannot reach one branch and not the other. Every flag
of the parser belongs to exactly one of the classes below (``tests/cli/test_options.py`` checks
that each has its effect in both branches); a flag one branch has no use for is refused there in
one line rather than ignored.
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from autoshard.cost.devices import get_device
from autoshard.cost.float8 import RECIPES as FLOAT8_RECIPES
from autoshard.cost.fusion import COMPILE_SCOPES
from autoshard.cost.units import parse_bytes
from autoshard.errors import AutoshardError

BUILD_FLAGS: dict[str, str] = {
    "cost_model": "cost_model", "mode": "mode", "memory_budget": "memory_budget", "pin": "pins",
    "device": "device", "peak_flops": "peak_flops", "memory_bandwidth": "memory_bandwidth",
    "precision": "precision", "capacity_factor": "capacity_factor", "expert_parallel": "expert_parallel",
    "recompute": "recompute", "no_overlap": "overlap", "compile": "compile", "float8": "float8",
    "async_tp": "async_tp",
}
"""Flag (argparse dest) -> the :func:`autoshard.api.build_model_problem` keyword it sets."""

SOLVER_FLAGS = frozenset({"no_reduce", "no_warm_start", "no_prove", "seed", "gap"})
"""Flags of the solver's options (``problem_file.solve_options``), for the whole model and each stage."""

MESH_FLAGS = frozenset({"mesh", "bandwidth", "latency", "gpus_per_node"})
"""Flags that make the mesh (``sharding.mesh.parse_mesh``)."""

RUN_FLAGS = frozenset({"path", "frontend", "timeout", "out", "baseline", "quiet", "params"})
"""Flags both branches read where they load, trace, time, print and write."""

PIPELINE_FLAGS = frozenset({"pipeline", "schedule", "microbatches", "virtual_stages"})
"""Flags of the pipeline search (``cli/pipeline.py``); given without ``--pipeline`` they are refused."""

WHOLE_MODEL_FLAGS: dict[str, str] = {
    "tables": "the options table and each device group's layouts are printed instead",
    "graph": "each stage traces its own graph at the microbatch size",
    "log": "the search prints one line per stage problem already",
    "write_problem": "a pipelined plan solves one problem per device group, not one",
}
"""Flags only the whole-model branch uses, and why ``--pipeline`` has no use for them."""


def add_step_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that price the step as it runs: torch.compile, Float8 linears, async TP."""
    p.add_argument("--compile", nargs="?", const="model", choices=COMPILE_SCOPES, default=None,
                   help="price the step under torch.compile (fused memory-bound ops): the whole model (default, "
                        "as autoshard.train --compile runs it) or each repeated layer alone (layers: torchtitan's "
                        "apply_compile)")
    p.add_argument("--float8", choices=FLOAT8_RECIPES, default=None,
                   help="price torchao's Float8 training of the linears with this scaling recipe (GEMMs at the "
                        "fp8 rate, cast kernels, tensorwise weights all-gathered in float8 as torchtitan gathers "
                        "them; autoshard.train --float8 gathers them in bf16); needs float8 tensor cores "
                        "(--device h100, h200, b200)")
    p.add_argument("--async-tp", action="store_true",
                   help="price tensor parallelism's collectives overlapped with the one matmul torch fuses each "
                        "with (torch's async TP, which runs under torch.compile)")


def parse_pins(items: Sequence[str]) -> dict[str, str]:
    """``--pin NAME=SPEC`` items as a mapping (one-line error for a malformed item)."""
    pins = {}
    for item in items:
        name, sep, spec = item.partition("=")
        if not sep or not name or not spec:
            raise AutoshardError(f"--pin {item!r} is not NAME=SPEC, e.g. --pin fc1.weight=SR")
        pins[name.strip()] = spec.strip()
    return pins


def build_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords of ``build_model_problem`` that the flags set (every one of :data:`BUILD_FLAGS`)."""
    return {
        "cost_model": args.cost_model,
        "mode": args.mode,
        "memory_budget": parse_bytes(args.memory_budget) if args.memory_budget else None,
        "pins": parse_pins(args.pin),
        "device": get_device(args.device),
        "peak_flops": args.peak_flops,
        "memory_bandwidth": args.memory_bandwidth,
        "precision": args.precision,
        "capacity_factor": args.capacity_factor,
        "expert_parallel": args.expert_parallel,
        "recompute": args.recompute,
        "overlap": False if args.no_overlap else None,
        "compile": args.compile,
        "float8": args.float8,
        "async_tp": args.async_tp,
    }


def refuse_unused(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """One line for a flag the chosen branch would ignore: the pipeline flags without ``--pipeline``,
    the whole-model flags with it."""
    given = [d for d in PIPELINE_FLAGS - {"pipeline"} if getattr(args, d) != parser.get_default(d)]
    if args.pipeline is None and given:
        raise AutoshardError(f"--{given[0].replace('_', '-')} sets up a pipeline search: add --pipeline AXIS or "
                             f"drop it")
    if args.pipeline is not None:
        for dest, why in WHOLE_MODEL_FLAGS.items():
            if getattr(args, dest) != parser.get_default(dest):
                raise AutoshardError(f"--{dest.replace('_', '-')} is not used with --pipeline ({why}): drop it")
