"""``autoshard.solve --pipeline AXIS|auto``: search pipeline options with each stage's sharding, print
the options, the claim, and the chosen plan per device of the pipeline (``auto``: over every axis
and without a pipeline too, ``pipeline/axes.py``, and why the chosen one beats the others)."""

from __future__ import annotations

import argparse
import functools
from dataclasses import replace
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from autoshard.cli.problem_file import solve_options
from autoshard.cost.units import format_seconds
from autoshard.errors import AutoshardError
from autoshard.frontend.graph import OpGraph
from autoshard.pipeline.plans import PipelinePlan
from autoshard.pipeline.schedules import SCHEDULES
from autoshard.pipeline.baseline import torchtitan_options, torchtitan_pipeline
from autoshard.pipeline.axes import AxesSearch, auto_seeds, in_turn, pipeline_axes, why
from autoshard.pipeline.options import NO_PIPELINE, microbatch_counts, options_for, stage_label
from autoshard.pipeline.claim import search
from autoshard.pipeline.deadline import SearchTimeout
from autoshard.pipeline.results import PipelineResult
from autoshard.pipeline.search import PipelineSearch, kept_gathered
from autoshard.sharding.layers import find_repeated_layers


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The pipeline flags of ``autoshard.solve``."""
    p.add_argument("--pipeline", type=pipeline_axis, default=None, metavar="AXIS|auto",
                   help="pipeline the repeated layers over this mesh axis (its size is the number of stages; "
                        "the other axes shard each stage): schedule, microbatches and cuts are searched; auto: "
                        "whether to pipeline and over which axis are searched too")
    p.add_argument("--schedule", choices=("auto",) + SCHEDULES, default="auto",
                   help="pipeline schedule (default: search all)")
    p.add_argument("--microbatches", default=None, metavar="N[,N]",
                   help="microbatch counts to search (default: divisors of the batch from the pipeline degree "
                        "to 4 times it)")
    p.add_argument("--virtual-stages", type=int, default=2, metavar="V",
                   help="stages per device of interleaved-1f1b (default 2)")


def pipeline_axis(text: str) -> int | str:
    """``--pipeline``'s value: a mesh axis number, or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a mesh axis number or auto") from None


def microbatch_inputs(inputs: tuple[Any, ...], count: int) -> tuple[Any, ...]:
    """The first ``1/count`` of every input whose first dim is the batch (the first input's)."""
    batch = batch_size(inputs)
    return tuple(x.narrow(0, 0, batch // count) if isinstance(x, torch.Tensor) and x.ndim and x.shape[0] == batch
                 else x for x in inputs)


def batch_size(inputs: tuple[Any, ...]) -> int:
    """The batch: the first dim of the first tensor input."""
    first = next((x for x in inputs if isinstance(x, torch.Tensor) and x.ndim), None)
    if first is None:
        raise AutoshardError("--pipeline splits the batch into microbatches along the first dim of the inputs, "
                             "and the example inputs have no tensor with one: give batched example inputs")
    return int(first.shape[0])


def run_pipeline(args: argparse.Namespace, console: Console, loaded: Any, mesh: Any, build: dict[str, Any],
                 trace_inputs: Any, timeout: float | None) -> int:
    """Search and print a pipelined plan (``trace_inputs(inputs)`` traces the model on inputs)
    within ``timeout`` seconds."""
    batch = batch_size(loaded.example_inputs)
    counts = None if args.microbatches is None else [int(x) for x in str(args.microbatches).split(",")]
    schedules = SCHEDULES if args.schedule == "auto" else (args.schedule,)

    say = (lambda line: None) if args.quiet else lambda line: console.print(line, highlight=False, markup=False)

    @functools.cache
    def graph_for(m: int) -> OpGraph:
        """The model traced at ``m`` microbatches, once for every axis's engine."""
        say(f"tracing a microbatch of {batch // m} ({m} microbatches)")
        return trace_inputs(microbatch_inputs(loaded.example_inputs, m))

    if args.baseline not in (None, "torchtitan"):
        raise AutoshardError(f"--baseline {args.baseline} is not costed with --pipeline: use --baseline torchtitan")
    solver = lambda options: solve_options(args, options)  # noqa: E731
    auto = args.pipeline == "auto"
    axes = pipeline_axes(mesh) if auto else [args.pipeline]
    engines = {a: PipelineSearch(graph_for, mesh, a, build, timeout, say, solver=solver) for a in axes}
    found = {a: microbatch_counts(mesh.shape[a], batch, counts) for a in axes}
    layers = find_repeated_layers(engines[axes[0]].graph(found[axes[0]][0]) if axes else graph_for(1))
    if layers is None:
        raise AutoshardError("--pipeline cuts a model between its repeated layers (a ModuleList of identical "
                             "blocks), and this model has none: plan it without --pipeline")
    per_axis, seeds = [], []
    for a in axes:
        named = a if auto else None
        per_axis.append(options_for(layers.count, mesh.shape[a], found[a], schedules, (args.virtual_stages,), named))
        seeds += [replace(o, axis=named) for o in torchtitan_options(layers.count, mesh.shape[a], batch)
                  if o.microbatches in found[a] and o.schedule in schedules]
    options = in_turn(per_axis, layers.count) if auto else per_axis[0]
    if auto:
        seeds = auto_seeds(layers.count, seeds)
        engine = AxesSearch(engines, lambda: graph_for(1), mesh, build, timeout, say, solver)
    else:
        engine = engines[args.pipeline]
    result = search(engine, options, seeds)
    print_result(result, console, every=args.params == "all")
    if args.pipeline == "auto":
        console.print("Why this degree: " + "; ".join(why(result)), highlight=False)
    if args.baseline == "torchtitan":
        for axis_engine in engines.values():
            print_torchtitan(axis_engine, result, layers.count, batch, console)
    if args.out:
        write_plan(result, engine, args.out)
        console.print(f"plan written to {args.out}")
    return 0


def print_result(result: PipelineResult, console: Console, every: bool = False) -> None:
    """The options table, the claim, and per device group its layers, step share and peak (``every``:
    each parameter's layout on its own row)."""
    from autoshard.cli.report import layout_summary, memory_line

    table = Table(title="Pipeline options", title_justify="left")
    for column in ("Option", "Bound", "Step", "Claim"):
        table.add_column(column)
    best = result.best
    for s in sorted(result.searched, key=lambda s: (s.step is None, not s.bounded, s.step or s.bound)):
        if s.step is not None:
            claim = "proved" if s.proved else "layouts differ" if s.mismatches else \
                f"gap {100 * (s.step - s.bound) / s.step:.2f}%"
        else:
            claim = "not bounded in time" if not s.bounded else "no plan found in time" \
                if s.origin == "no plan" else "pruned: bound >= best" if s.bound >= best.step else "not solved in time"
        table.add_row(s.option.label, format_seconds(s.bound) if s.bounded else "-",
                      "-" if s.step is None else format_seconds(s.step), claim)
    if best.origin == "baseline":
        table.add_row(f"{best.option.label} (torchtitan's plan)", format_seconds(best.bound),
                      format_seconds(best.step), "incumbent, not improved on")
    console.print(table)
    if result.unbounded:
        console.print(f"[yellow]best[/] step {format_seconds(best.step)}, {best.option.label}; "
                      f"{result.unbounded} of the {len(result.searched)} options were not bounded in time, so there "
                      f"is no bound over all "
                      f"({result.elapsed:.1f}s)", highlight=False)
    elif result.gap <= 1e-9 and best.proved:
        console.print(f"[green]proved optimal[/] over the {len(result.searched)} pipeline options: step "
                      f"{format_seconds(best.step)}, {best.option.label} ({result.elapsed:.1f}s)", highlight=False)
    else:
        console.print(f"[yellow]best[/] step {format_seconds(best.step)}, lower bound "
                      f"{format_seconds(result.lower_bound)} over the "
                      f"{len(result.searched)} options, gap {100 * result.gap:.2f}% ({best.option.label})",
                      highlight=False)
    for line in best.mismatches:
        console.print(f"[yellow]warning:[/] {line}: the step does not include resharding it", highlight=False)
    if best.option.schedule == NO_PIPELINE:
        solved = best.solutions[()]
        mp, choice = solved.model_problem, list(solved.solution.choice)
        console.print(f"[bold]Whole model[/] (no pipeline, mesh {mp.mesh.label}): "
                      f"{mp.cost_model.format(solved.solution.cost)} per step", highlight=False)
        console.print(layout_summary(mp, choice, every=every))
        console.print(memory_line(mp, choice), highlight=False)
        return
    for signature, devices in best.groups.items():
        solved = best.solutions[signature]
        mp, choice = solved.model_problem, list(solved.solution.choice)
        policy = "parameters kept gathered over the step" if kept_gathered(solved) else \
            "parameters gathered per microbatch"
        console.print(f"[bold]Pipeline devices {','.join(map(str, devices))}[/] ({stage_label(signature)}, "
                      f"mesh {mp.mesh.label}, {policy}): "
                      f"{mp.cost_model.format(solved.solution.cost)} per microbatch", highlight=False)
        if len(devices) > 1:
            console.print("(the layouts are shown on the layers the plan was solved for; each of these devices "
                          "lays out its own layers alike)", highlight=False)
        console.print(layout_summary(mp, choice, every=every))
        console.print(memory_line(mp, choice), highlight=False)


def print_torchtitan(engine: PipelineSearch, result: PipelineResult, layers: int, batch: int, console: Console) -> None:
    """torchtitan's pipelined plans beside ours, in the same model (a recipe the search did not
    cost before its time limit says so: costing it now would pass the limit)."""
    from autoshard.cost.units import format_bytes

    for option in torchtitan_options(layers, engine.mesh.shape[engine.axis], batch):
        try:
            base = torchtitan_pipeline(engine, option)
        except SearchTimeout:
            console.print(f"Baseline torchtitan ({option.label}; FSDP x TP per stage): not costed within the time "
                          f"limit (raise --timeout to see it)", highlight=False)
            continue
        fits = "fits" if base.fits else "[red]exceeds the budget[/]"
        console.print(f"Baseline torchtitan ({option.label}; FSDP x TP per stage): step {format_seconds(base.step)}, "
                      f"peak {format_bytes(base.peak)} live ({fits}); ours/torchtitan = "
                      f"{result.best.step / base.step:.3f}", highlight=False)


def write_plan(result: PipelineResult, engine: PipelineSearch | AxesSearch, path: str) -> None:
    """The chosen option and each device group's plan as JSON (``pipeline/plans.py``), or, when
    the chosen candidate does not pipeline, the whole model's plan (``problem/plan.py``)."""
    best = result.best
    if best.option.schedule == NO_PIPELINE:
        best.solutions[()].plan.save(path)
        return
    if isinstance(engine, AxesSearch):
        engine = engine.engines[best.option.axis]
    groups = engine.group_plans(best)
    PipelinePlan(engine.mesh, engine.axis, best.option.schedule, best.option.microbatches, best.option.virtual,
                 best.option.counts, best.step, result.lower_bound, best.proved and result.gap <= 1e-9,
                 groups).save(path)
