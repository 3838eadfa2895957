"""``python -m autoshard.solve``: find, prove and print the cheapest sharding of a model (or IOPDDL problem).

For a model file: trace it (one line names the tracer, and why torch.fx fell back to
torch.export), print the graph when it is small or ``--graph`` asks, build the sharding
problem, run the z3 counterexample-guided loop (cost tables of the improving plans, a live
line with bound, best cost and time), then print the proved plan as Slapo schedule lines and
write it as JSON. Piped output is as wide as the tables need, so no column is cut.
For an IOPDDL problem file (.json / .json.gz): solve it and print the contest's solution list.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from typing import Any, Iterator, Sequence

from rich.console import Console
from rich.live import Live

from autoshard.cli import problem_file
from autoshard.cli.baseline import BASELINES, cost_text, print_baseline
from autoshard.cli.pipeline import add_arguments as add_pipeline_arguments, run_pipeline
from autoshard.cli.options import add_step_arguments, build_options, refuse_unused
from autoshard.cli.model_progress import SMALL_PLAN_ROWS, ModelProgress
from autoshard.cli.progress import HEARTBEAT, Heartbeat, LogLines
from autoshard.cost.communication import COST_MODELS
from autoshard.cost.devices import GENERIC, PRESETS
from autoshard.cost.memory import PRECISIONS
from autoshard.cost.recompute import RECOMPUTE_POLICIES
from autoshard.errors import AutoshardError
from autoshard.frontend.graph import NodeKind
from autoshard.sharding.layers import find_repeated_layers
from autoshard.sharding.mesh import parse_mesh
from autoshard.cost.units import format_bytes

GRAPH_TABLE_MAX_NODES = 40
"""Graphs of at most this many nodes print their table unasked; larger ones with --graph."""
OUTPUT_PER_NODE = 1e-3
"""Seconds per graph node kept from the solver's time limit for reading the plan back and printing
it (tables, schedule, PyTorch-native code): LLaMA-3 405B's 6,945 nodes took 6-7 s on a loaded
2-core machine, which ran a 60 s limit to 67 s."""
PIPED_WIDTH = 10_000
"""Console width when stdout is not a terminal: tables keep their natural width instead of rich's 80."""
ALL_REPLICATED = "all replicated: the model is too small to be worth sharding at these costs"
"""Said instead of anything that would read as a sharded plan's merit when the plan shards nothing."""


def build_parser() -> argparse.ArgumentParser:
    """Every flag of the CLI, documented."""
    p = argparse.ArgumentParser(
        prog="python -m autoshard.solve",
        description="Find the cheapest sharding of a PyTorch model on a device mesh, prove it optimal "
                    "with z3, and print it as a Slapo schedule and a JSON plan. Also solves IOPDDL "
                    "auto-sharding problem files (.json / .json.gz).",
    )
    p.add_argument("path", help="model file (defines `model` and `example_inputs`, or `build()` returning both), "
                                "or an IOPDDL problem file ending in .json or .json.gz")
    p.add_argument("--mesh", default="8", help="device mesh: a device count (8) or axis sizes (2x4, 2x2x2); default 8")
    p.add_argument("--bandwidth", help="bytes/s per device on each mesh axis, comma-separated (300e9,25e9); "
                                       "default: 300e9 for axes inside a node, 100e9 across nodes")
    p.add_argument("--latency", help="seconds per collective on each mesh axis (1e-6,5e-6); default 1e-6 inside "
                                     "a node, 5e-6 across")
    p.add_argument("--gpus-per-node", type=int, default=8,
                   help="devices per node, deciding which (innermost) axes get intra-node defaults; default 8")
    p.add_argument("--cost-model", choices=COST_MODELS, default="alpha-beta",
                   help="alpha-beta: seconds from bandwidth/latency and a compute roofline (default); "
                        "slapo: Slapo autoshard's element counts and search space")
    p.add_argument("--device", default=None, metavar="{" + ",".join(sorted(PRESETS)) + "}|FILE.toml",
                   help="device preset: peak flop/s per dtype, memory bandwidth and capacity (the default "
                        "--memory-budget), NVLink and network links (see README); or a TOML file of one preset in "
                        "the format of specs/devices.toml (specs/README.md); default: generic round figures")
    p.add_argument("--peak-flops", type=float, default=None,
                   help="device flop/s for compute costs, every dtype (overrides the preset); "
                        f"default {GENERIC.peak_flops['fp32']:.0e} without a preset")
    p.add_argument("--memory-bandwidth", type=float, default=None,
                   help=f"device memory bytes/s for compute costs; default {GENERIC.memory_bandwidth:.0e} without a preset")
    p.add_argument("--mode", choices=("inference", "training"), default="inference",
                   help="inference: forward only; training: forward + backward, gradients and optimizer state "
                        "(of the model with its loss when the model file defines loss(outputs, *targets))")
    p.add_argument("--precision", choices=PRECISIONS, default="as-is",
                   help="training bytes of parameters, gradients and AdamW moments: as-is (the model's dtypes, "
                        "default), bf16-mixed (fp32 masters, gradients and moments, bf16 compute copies), fp32")
    p.add_argument("--memory-budget", help="bytes per device the plan may use, e.g. 16GiB (default: the --device "
                                           "preset's capacity, else none)")
    p.add_argument("--pin", action="append", default=[], metavar="NAME=SPEC",
                   help="fix a tensor's layout, e.g. fc1.weight=SR or fc1.weight=S0R on 2-D meshes (repeatable)")
    p.add_argument("--baseline", choices=tuple(BASELINES), default=None,
                   help="also cost a hand-written plan in the same model and print it beside ours: "
                        "megatron = column- then row-parallel linears (heads split), batch on other mesh axes; "
                        "torchtitan = FSDP (re-gathered) on the first mesh axis, tensor parallelism by module role "
                        "with sequence-parallel norms on the last, experts parallel on the last, every repeated "
                        "layer recomputed under --recompute (when recomputation is offered: training under a "
                        "memory budget)")
    p.add_argument("--recompute", choices=RECOMPUTE_POLICIES, default="full",
                   help="what recomputing a repeated layer means (training under a memory budget): full (every op "
                        "again, default), selective (torchtitan's op policy: keeps attention and every other "
                        "matmul), none (never recompute)")
    p.add_argument("--no-overlap", action="store_true",
                   help="charge parameter gathers and gradient reductions in full, not only what the neighbouring "
                        "layer's compute leaves exposed (the presets overlap them as FSDP2 and DDP do)")
    p.add_argument("--capacity-factor", type=float, default=1.0,
                   help="mixture-of-experts layers: charge expert-sharded layouts this many times the balanced "
                        "routing share of tokens (their compute and all-to-alls); default 1.0")
    p.add_argument("--expert-parallel", type=int, default=None, metavar="AXIS",
                   help="mixture-of-experts layers: pin expert parallelism over this mesh axis (experts split over "
                        "it, tokens sent to them by all-to-all); the rest is optimised around it")
    add_step_arguments(p)
    add_pipeline_arguments(p)
    p.add_argument("--frontend", choices=("auto", "fx", "export"), default="auto",
                   help="tracer: torch.fx, torch.export, or auto (fx, falling back to export); default auto")
    p.add_argument("--out", help="write the plan as JSON to this file")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds for the whole process (tracing included); at the limit it returns the best plan, "
                        "its lower bound and gap")
    p.add_argument("--tables", choices=("auto", "all", "last", "none"), default="auto",
                   help="cost tables to print: one per improving plan (all), the final plan's (last), none, or "
                        f"auto (default): all for plans of up to {SMALL_PLAN_ROWS} rows, else one line per improving "
                        "plan and the final plan's reshards")
    p.add_argument("--graph", action="store_true",
                   help=f"print the traced graph's table (printed unasked for graphs of up to {GRAPH_TABLE_MAX_NODES} "
                        "nodes)")
    p.add_argument("--params", choices=("grouped", "all"), default="grouped",
                   help="parameter layouts and the Slapo comments on parameters: grouped (default) folds repeated "
                        "layers' parameters that share a layout into one row (model.layers.{0..31}.mlp.up_proj.weight); "
                        "all lists every parameter")
    p.add_argument("--quiet", action="store_true", help="no graph table (unless --graph), no live display")
    problem_file.add_solver_arguments(p)
    return p


def run_model(args: argparse.Namespace, console: Console) -> int:
    """Solve a model file end to end and print everything a user needs."""
    from autoshard.api import build_model_problem, default_solve_options, solve_model_problem
    from autoshard.problem.build import build_deadline
    from autoshard.frontend.load import load_model
    from autoshard.frontend.loss import check_loss_output
    from autoshard.frontend.table import graph_table
    from autoshard.frontend.replicate import trace_replicated
    from autoshard.pipeline.deadline import exit_reserve
    from autoshard.lower.dtensor import export_dtensor
    from autoshard.lower.slapo import schedule_lines
    from autoshard.cli.report import (device_line, expert_parallel_line, fit_line, iteration_table, layout_summary,
                                  memory_line)

    build = build_options(args)
    device = build["device"]
    mesh = parse_mesh(args.mesh, args.bandwidth, args.latency, args.gpus_per_node, device.intra, device.inter)
    clock = problem_file.Clock(args.timeout, problem_file.launch_time())
    with _working(console, f"loading and tracing {args.path}", args.quiet):
        loaded = load_model(args.path)
        with_loss = args.mode == "training" and loaded.loss is not None
        if with_loss:  # a training plan shards the model's loss too (model file convention)
            loaded = loaded.for_training()
        if args.pipeline is not None:
            traced = lambda x: trace_replicated(loaded.model, x, args.frontend)  # noqa: E731
            budget = clock.solver_budget()
            return run_pipeline(args, console, loaded, mesh, build, traced,
                                None if budget is None else max(0.1, budget - exit_reserve(args.timeout)))
        graph = trace_replicated(loaded.model, loaded.example_inputs, args.frontend)
    if with_loss:
        check_loss_output(graph, loaded.name)
    console.print(_frontend_line(graph), highlight=False, markup=False)
    if args.graph or not args.quiet and len(graph) <= GRAPH_TABLE_MAX_NODES:
        console.print(graph_table(graph))
    with _working(console, f"building the problem: strategies and costs on mesh {mesh.label}", args.quiet), \
            build_deadline(clock.hard_deadline()):
        mp = build_model_problem(graph, mesh, **build)
    links = mesh if args.bandwidth is not None or args.latency is not None else None
    console.print(device_line(mp.cost_model.device, args.device is None, args.peak_flops, args.memory_bandwidth,
                              links), highlight=False)
    budget = mp.problem.usage_limit
    if budget is not None and budget != mp.options.device_budget:
        budget_text = f"{format_bytes(mp.options.device_budget)} ({format_bytes(budget)} live)"
    else:
        budget_text = format_bytes(budget) if budget else ""
    p = mp.problem
    if args.write_problem:
        from autoshard.solver.model.iopddl import write_problem
        write_problem(p, args.write_problem)
    layers = find_repeated_layers(graph)
    if layers is not None:
        console.print(f"repeated layers: {layers.count} identical {layers.container}.* blocks of "
                      f"{len(layers.layers[0])} nodes; strategies computed for {mp.distinct_candidates} distinct "
                      f"nodes of {p.num_nodes}, cost matrices for {mp.distinct_matrices} distinct edges of "
                      f"{len(p.edges)}", highlight=False)
    for warning in mp.warnings:
        console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
    console.print(f"{loaded.name}: {len(graph)} graph nodes, {p.num_nodes} decision nodes, {len(p.edges)} edges, "
                  f"mesh {mesh.label}, {args.mode}, cost model {mp.cost_model.name}"
                  + (f", memory budget {budget_text}" if budget else ""))
    seconds = clock.solver_budget()
    if seconds is not None:  # the plan's read-back and printing take time in proportion to the graph
        seconds = max(0.1, seconds - OUTPUT_PER_NODE * len(graph))
    options = problem_file.solve_options(args, default_solve_options(mp, seconds))
    with Live(console=console, transient=True, refresh_per_second=2) if not args.quiet else contextlib.nullcontext() as live:
        progress = ModelProgress(mp, console, args.tables, live if not args.quiet else None)
        log_lines = LogLines(progress) if args.log else None
        try:
            result = solve_model_problem(mp, options, log_lines or progress, loaded.name)
        finally:
            progress.close()
            if log_lines is not None:
                log_lines.close()
    solution, plan = result.solution, result.plan
    fmt = mp.cost_model.format
    if args.tables == "last" or progress.tables == "lines":
        console.print(f"[bold]Best plan[/]: total {cost_text(mp, solution.cost)}", highlight=False)
        console.print(iteration_table(mp, list(solution.choice), None, compact=progress.tables == "lines"))
    if solution.status == "optimal":
        console.print(f"[green]proved optimal[/]: no plan costs less than {cost_text(mp, solution.cost)} "
                      f"({solution.proof or 'z3 UNSAT'}; {solution.iterations} z3 checks, {solution.elapsed:.2f}s)",
                      highlight=False)
    else:
        gap = "unknown" if solution.gap is None else f"{100 * solution.gap:.2f}%"
        lower = "none" if solution.lower_bound is None else fmt(solution.lower_bound)
        why = "time limit" if args.timeout is not None else "not proved (--no-prove)" if args.no_prove else "no proof"
        console.print(f"[yellow]{why}[/]: best {fmt(solution.cost)}, lower bound {lower}, gap {gap}")
    if result.start is not None:
        console.print(_start_line(mp, result.start, solution.cost), highlight=False, markup=False)
    replicated = _all_replicated(mp) if mesh.size > 1 and plan.shards_nothing() else ""
    if replicated:
        console.print(f"[yellow]{replicated}[/] ({_replicated_hint(args, replicated)})", highlight=False)
    if args.baseline is not None:
        print_baseline(mp, solution.cost, console, args.baseline, replicated)
    experts = expert_parallel_line(plan)
    if experts:
        console.print(experts, highlight=False)
    console.print(layout_summary(mp, list(solution.choice), every=args.params == "all"))
    console.print(memory_line(mp, list(solution.choice)), highlight=False)
    fit = fit_line(plan)
    if fit:
        console.print(fit, highlight=False)
    console.print("Schedule (Slapo):")
    for line in schedule_lines(plan, graph, every=args.params == "all"):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print("PyTorch-native (torchtitan style):")
    console.print(export_dtensor(plan, graph, loaded.model).source.rstrip(), highlight=False, markup=False,
                  soft_wrap=True)
    if args.out:
        plan.save(args.out)
        console.print(f"plan written to {args.out}")
    return 0


def _start_line(mp: Any, start: Any, ours: int) -> str:
    """The hand-written plan the solver started from, and whether the answer is it or cheaper."""
    head = (f"starting plan: {start.name}, {cost_text(mp, start.cost)}, peak {format_bytes(start.peak)} of "
            f"{format_bytes(mp.problem.usage_limit)} live")
    if ours >= start.cost:
        return f"{head}; the answer is that plan (the search found nothing cheaper)"
    return f"{head}; ours is {ours / start.cost:.3f}x of it"


def _all_replicated(mp: Any) -> str:
    """Why a plan shards nothing: the mesh divides no dim any op could shard, or sharding does not pay."""
    ops = [c for c in mp.candidates.values() if c.node.kind == NodeKind.OP]
    if ops and all(len(c.strategies) == 1 for c in ops):
        return f"all replicated: mesh {mp.mesh.label} cuts no shardable dim of this model (each is too small for it)"
    return ALL_REPLICATED


def _replicated_hint(args: argparse.Namespace, replicated: str) -> str:
    """What would make sharding pay, without suggesting flags already given."""
    if replicated != ALL_REPLICATED:
        return "choose a mesh whose axis sizes divide the batch, sequence or hidden sizes"
    if args.device is None and args.peak_flops is None and args.memory_bandwidth is None:
        return ("every device runs all of it; a slower device (--device, --peak-flops, --memory-bandwidth) or a "
                "larger batch makes sharding pay")
    return "every device runs all of it; a slower device or a larger batch makes sharding pay"


def _frontend_line(graph: Any) -> str:
    """``traced with torch.fx``, or ``traced with torch.export (torch.fx failed: ...)``."""
    note = f" ({graph.frontend_note})" if graph.frontend_note else ""
    return f"traced with torch.{graph.frontend}{note}"


def make_console() -> Console:
    """stdout's console: a terminal's width, or (piped, COLUMNS unset) as wide as the tables need, so no
    column is cut to rich's default 80."""
    console = Console(soft_wrap=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(soft_wrap=True, width=PIPED_WIDTH)
    return console


PROGRESS_LINE = re.compile(r"(loading and tracing|building the problem)\b.* \(\d+ s\)")
"""The lines :func:`_working` prints while piped: present or not depending on the machine's speed."""


@contextlib.contextmanager
def _working(console: Console, what: str, quiet: bool, every: float = HEARTBEAT) -> Iterator[None]:
    """Show that ``what`` is under way: a spinner on a terminal; piped, a line ``what (20 s)`` after
    every ``every`` seconds it takes (a large model traces for tens of seconds); nothing with --quiet."""
    if quiet:
        yield
    elif console.is_terminal:
        with console.status(what):
            yield
    else:
        began = time.monotonic()
        beat = Heartbeat(lambda: console.print(f"{what} ({time.monotonic() - began:.0f} s)", highlight=False,
                                               markup=False), every)
        try:
            yield
        finally:
            beat.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; user errors print one line and exit 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    console = make_console()
    try:
        refuse_unused(args, parser)
        if args.path.endswith((".json", ".json.gz")):
            return problem_file.run(args.path, args.timeout, console, quiet=args.quiet, options=problem_file.solve_options(args),
                                   log=args.log, write_to=args.write_problem)
        return run_model(args, console)
    except AutoshardError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130
