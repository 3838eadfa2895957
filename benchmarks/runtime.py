"""The runtime on CPU: per-step overhead against the plain model, and how much hidden communication hides.

    .venv/bin/python benchmarks/runtime.py [--steps 10] [--no-compile] [--no-overlap-rows] [--train-compile]

Overhead (world size 1, gloo, one CPU thread): each model's training step (forward, a mean-square
loss of its first floating output, backward) as the plain module and as the
:class:`~autoshard.runtime.executor.ParallelModule` running its plan on a mesh of one device
(no collective: what is left is the runtime's own cost), eager and under ``torch.compile``
(inductor: the plain module compiled whole, the parallel module's lowered program compiled by
``ParallelModule.compile``). Models: the small examples and a 2-layer LLaMA (hidden 512,
2 x 256 tokens). Median of ``--steps`` samples after warm-up (a sample: as many consecutive
steps as last 10 ms), the variants taking turns; each ratio is the median of the per-turn
ratios (``paired_ratio``), which a passing load on the shared cores moves less than it moves
the medians. The samples are the process's CPU seconds (``time.process_time``): on one rank
everything the step runs, runs on this process's threads, and what other processes take of
the shared cores is not counted.

Overlap (2 and 4 forked gloo ranks, one thread each, on however many cores the machine has): a
4-layer LLaMA (hidden 512, 2 x 128 tokens per rank) under torchtitan's plan on a 1-D mesh (FSDP:
parameters stored split, gathered before use, gradients reduce-scattered), priced with overlap
on, so every layer's parameter traffic is a hidden edge (``cost/overlap.py``). Per rank, median
step of: the plan as priced (hidden collectives issued ahead, ``runtime/overlap.py``); the same
plan blocking (every ``hidden`` flag cleared); compute alone (the hidden collectives replaced
by local copies of their results); communication alone (the hidden collectives alone, blocking,
in the step's order). Hidden = (compute + communication - overlapped step) / communication: the
share of the hideable communication that the overlapped step did not pay; and the time the
overlapped step saves over the blocking one.

Train compile (``--train-compile``, the check ``autoshard.train --compile`` is held to, too slow
for the test suite on two cores): the LLaMA example's Megatron plan on 4 forked gloo ranks (mesh
2x2), 5 steps of ``autoshard.train`` eager and with ``--compile``; every step's loss, their
largest relative difference (at most 1e-4), dynamo's graphs and breaks, and the first and last
step's seconds.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch.utils import _pytree as pytree

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoshard.api import build_model_problem  # noqa: E402
from autoshard.frontend.graph import OpGraph  # noqa: E402
from autoshard.frontend.load import load_model  # noqa: E402
from autoshard.frontend.trace import trace  # noqa: E402
from autoshard.problem.baselines.torchtitan import torchtitan_choice  # noqa: E402
from autoshard.problem.plan import Plan  # noqa: E402
from autoshard.problem.readback import make_plan  # noqa: E402
from autoshard.runtime import overlap as overlap_module  # noqa: E402
from autoshard.runtime.collectives import Op, run_steps  # noqa: E402
from autoshard.runtime.executor import ParallelModule, parallelize  # noqa: E402
from autoshard.runtime.groups import MeshGroups, destroy_gloo, init_gloo  # noqa: E402
from autoshard.sharding.reshard import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, SLICE  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
OVERHEAD_MODELS = ("attention", "cnn", "gpt2", "llama", "llama-2L")
"""The default overhead rows (``--models mlp`` adds the seed MLP: seconds per step on one thread)."""
OVERLAP_WORLDS = (2, 4)


class WithLoss(torch.nn.Module):
    """The model's first floating output, squared and averaged: a step that ends in a scalar."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        first = next(t for t in pytree.tree_leaves(self.model(*inputs))
                     if isinstance(t, torch.Tensor) and t.is_floating_point())
        return first.float().pow(2).mean()


def llama(layers: int, hidden: int, batch: int, seq: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A Hugging Face LLaMA from a config (fused attention), wrapped with its loss, and its tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=8, num_key_value_heads=8,
                         intermediate_size=hidden * 8 // 3, vocab_size=1024, max_position_embeddings=seq,
                         use_cache=False, attn_implementation="sdpa")
    return WithLoss(LlamaForCausalLM(config).eval()), (torch.randint(0, 1024, (batch, seq)),)


def model_of(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """An overhead row's model and inputs."""
    if name == "llama-2L":
        return llama(2, 512, 2, 256)
    loaded = load_model(str(EXAMPLES / f"{name}.py"))
    return WithLoss(loaded.model), tuple(loaded.example_inputs)


Variant = tuple[Callable[..., torch.Tensor], Callable[[], None], Callable[[], Any]]
"""A way to run the step: the module, how to drop its gradients, and a context to run it in."""


SAMPLE_SECONDS = 0.01
"""The least time one sample of a step takes: a step shorter than this is timed over as many
consecutive steps as reach it (a small model's step is a millisecond, which one time slice that
another process takes on the shared cores would double)."""


def _timed(variant: Variant, inputs: tuple[torch.Tensor, ...], repeats: int, clock: Callable[[], float]) -> float:
    """Seconds on ``clock`` of one training step (forward, backward, dropping the gradients),
    averaged over ``repeats``."""
    module, zero, context = variant
    with context():
        start = clock()
        for _ in range(repeats):
            module(*inputs).backward()
            zero()
        return (clock() - start) / repeats


def step_samples(variants: dict[str, Variant], inputs: tuple[torch.Tensor, ...], steps: int,
                 clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """``steps`` samples of each variant's training step (forward, backward) on ``clock``, after
    two warm-up steps; a sample averages as many consecutive steps as last ``SAMPLE_SECONDS``. The
    variants take turns sample by sample, each adjacent pair (first and second, third and fourth)
    swapped every other turn, so a load that comes and goes on the machine (other processes on its
    cores) and what the variant before leaves in the caches weigh on the two of a pair alike;
    sample ``k`` of every variant comes from the same turn."""
    order = list(variants.items())
    swapped = [order[k ^ 1] if k ^ 1 < len(order) else order[k] for k in range(len(order))]
    warm = min(min(_timed(variant, inputs, 1, clock) for _, variant in order) for _ in range(2))
    repeats = max(1, math.ceil(SAMPLE_SECONDS / max(warm, 1e-6)))
    times: dict[str, list[float]] = {name: [] for name in variants}
    for k in range(steps):
        for name, variant in (order if k % 2 else swapped):
            times[name].append(_timed(variant, inputs, repeats, clock))
    return times


def step_times(variants: dict[str, Variant], inputs: tuple[torch.Tensor, ...], steps: int) -> dict[str, float]:
    """Median seconds of one training step of each variant (``step_samples``)."""
    return {name: statistics.median(t) for name, t in step_samples(variants, inputs, steps).items()}


def paired_ratio(samples: dict[str, list[float]], over: str, base: str) -> float:
    """The median over turns of ``over``'s step / ``base``'s step in the same turn: a load that
    slows one turn slows both of its steps, so it cancels in the ratio as it does not between medians."""
    return statistics.median(a / b for a, b in zip(samples[over], samples[base]))


def _forked(world: int, fn: Callable[[int, int], Any]) -> list[Any]:
    """``fn(rank, world)`` on ``world`` forked gloo ranks (one thread each); results by rank."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    queue = ctx.Queue()

    def run(rank: int) -> None:
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
        init_gloo(rank, world, port)
        try:
            queue.put((rank, fn(rank, world)))
        finally:
            destroy_gloo()

    procs = [ctx.Process(target=run, args=(r,)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join()
    return [results[r] for r in range(world)]


def overhead_row(name: str, steps: int, compile_too: bool) -> dict[str, list[float]]:
    """Plain and parallel step samples of one model on a mesh of one device (``step_samples``)."""
    model, inputs = model_of(name)
    graph = trace(model, inputs)
    mp_ = build_model_problem(graph, "1", mode="training")
    plan = make_plan(mp_, mp_.complete([0] * len(mp_.names)))

    def measure(rank: int, world: int) -> dict[str, float]:
        groups = MeshGroups.create(plan.mesh)
        parallel = parallelize(model, plan, groups, graph=graph)
        variants = {"plain": (model, model.zero_grad, nullcontext), "parallel": (parallel, parallel.zero_grad, nullcontext)}
        if compile_too:
            compiled = parallelize(model, plan, groups, graph=graph)
            compiled.compile()
            variants["plain compiled"] = (torch.compile(model), model.zero_grad, nullcontext)
            variants["parallel compiled"] = (compiled, compiled.zero_grad, nullcontext)
        return step_samples(variants, inputs, steps, time.process_time)

    return _forked(1, measure)[0]


def _local_steps(piece: torch.Tensor, ops: tuple[Op, ...], *_: Any, **__: Any) -> torch.Tensor:
    """A hidden edge's steps computed locally (no communication), in the form ``collectives.arrive``
    takes: gathers copy the piece, reductions slice it; the last gather stacked on dim 0 as it arrives."""
    x = piece.detach()
    for k, op in enumerate(ops):
        n, dim = op.size, op.step.dim
        if op.step.kind == ALL_GATHER:
            x = torch.cat([x] * n, dim=0 if k == len(ops) - 1 and op.communicates else dim)
        elif op.step.kind in (REDUCE_SCATTER, SLICE):
            x = x.chunk(n, dim=dim)[op.coord].clone()
        elif op.step.kind == ALL_REDUCE:
            x = x.clone()
    return x


@contextmanager
def _communication_free() -> Iterator[None]:
    """The hidden edges' collectives replaced by local copies of their results (compute alone)."""
    issue = overlap_module.issue_ahead
    overlap_module.issue_ahead = _local_steps
    try:
        yield
    finally:
        overlap_module.issue_ahead = issue


def _hidden_alone(parallel: ParallelModule, plan: Plan, graph: OpGraph, repeats: int) -> float:
    """Median seconds of the plan's hidden collectives alone: forward gathers, then gradient reductions."""
    hidden = [e for e in plan.edges if e.hidden and e.grad_src_spec is not None]
    names = {n.name: n.qualname for n in graph}
    pieces = [parallel.local_value(names[e.src]).detach() for e in hidden]
    grads = [torch.zeros(e.grad_src_spec.local_shape(tuple(parallel.get_parameter(names[e.src]).shape),
                                                     plan.mesh.shape)) for e in hidden]
    times = []
    for k in range(repeats + 1):
        start = time.perf_counter()
        for e, piece in zip(hidden, pieces):
            run_steps(piece, e.steps, parallel.groups)
        for e, grad in zip(reversed(hidden), reversed(grads)):
            run_steps(grad, e.grad_steps, parallel.groups)
        if k:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def overlap_row(world: int, steps: int, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                graph: OpGraph) -> dict[str, float]:
    """The four timings of the overlap table on ``world`` ranks (rank 0's; every rank runs the same)."""
    problem = build_model_problem(graph, world, mode="training", overlap=True)
    plan = make_plan(problem, torchtitan_choice(problem))
    blocking = replace(plan, edges=[replace(e, hidden=False) for e in plan.edges])

    def measure(rank: int, world_size: int) -> dict[str, float]:
        groups = MeshGroups.create(plan.mesh)
        ahead = parallelize(model, plan, groups, graph=graph)
        plain = parallelize(model, blocking, groups, graph=graph)
        row = step_times({"overlapped": (ahead, ahead.zero_grad, nullcontext),
                          "blocking": (plain, plain.zero_grad, nullcontext),
                          "compute": (ahead, ahead.zero_grad, _communication_free)}, inputs, steps)
        row["communication"] = _hidden_alone(ahead, plan, graph, steps)
        row["hidden edges"] = sum(e.hidden for e in plan.edges)
        return row

    return _forked(world, measure)[0]


def train_compile_rows(steps: int = 5) -> tuple[list[float], list[float], dict[str, Any], dict[str, Any]]:
    """Eager and compiled losses of ``autoshard.train`` on the LLaMA example's Megatron 2x2 plan, and
    each run's dynamo counts and step seconds (rank 0's)."""
    from autoshard.cli.train import Training, build_parser, quiet_dtensor_hints, train
    from autoshard.problem.baselines.megatron import megatron_choice

    loaded = load_model(str(EXAMPLES / "llama.py")).for_training()
    graph = trace(loaded.model, loaded.example_inputs)
    problem = build_model_problem(graph, "2x2", mode="training")
    training = Training(make_plan(problem, megatron_choice(problem), model="llama"), loaded, graph, torch.device("cpu"))

    def run(compiled: bool) -> Callable[[int, int], Any]:
        def fn(rank: int, world: int) -> Any:
            import io

            import torch._dynamo.utils

            quiet_dtensor_hints()
            seconds: list[float] = []
            last = [time.perf_counter()]

            def tick(step: int, loss: float) -> None:
                now = time.perf_counter()
                seconds.append(now - last[0])
                last[0] = now

            args = build_parser().parse_args(["llama.py", "--plan", "plan.json", "--steps", str(steps), "--lr", "3e-3",
                                              *(["--compile"] if compiled else [])])
            losses = train(args, training, rank, io.StringIO(), tick)
            counters = torch._dynamo.utils.counters
            return losses, {"graphs": counters["stats"]["unique_graphs"],
                            "breaks": sum(counters["graph_break"].values()), "seconds": seconds}

        return fn

    eager, plain = _forked(4, run(False))[0]
    compiled, info = _forked(4, run(True))[0]
    return eager, compiled, plain, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile columns")
    parser.add_argument("--no-overlap-rows", action="store_true", help="skip the multi-rank overlap table")
    parser.add_argument("--models", default=",".join(OVERHEAD_MODELS),
                        help="overhead rows, comma-separated (empty: none)")
    parser.add_argument("--train-compile", action="store_true",
                        help="also check autoshard.train --compile on 4 ranks against eager (minutes on 2 cores)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ms = 1e3
    if args.train_compile:
        eager, compiled, plain, info = train_compile_rows()
        worst = max(abs(c - e) / abs(e) for c, e in zip(compiled, eager))
        print("autoshard.train --compile: LLaMA example, Megatron 2x2 plan, 4 gloo ranks, 5 steps")
        print(f"  eager losses    {' '.join(f'{x:.6f}' for x in eager)}")
        print(f"  compiled losses {' '.join(f'{x:.6f}' for x in compiled)}")
        print(f"  largest relative difference {worst:.2e} ({'within' if worst <= 1e-4 else 'ABOVE'} 1e-4); "
              f"dynamo: {info['graphs']} graph(s), {info['breaks']} break(s); step 1 {plain['seconds'][0]:.1f} s "
              f"eager, {info['seconds'][0]:.1f} s compiled; step {len(info['seconds'])} {plain['seconds'][-1]:.2f} s "
              f"eager, {info['seconds'][-1]:.2f} s compiled\n", flush=True)
    print("Per-step overhead, world size 1 (gloo, CPU, 1 thread), median CPU ms of a training step; ratios: "
          "median of the per-turn ratios")
    print("| model | plain | parallel | ratio | plain compiled | parallel compiled | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in filter(None, args.models.split(",")):
        samples = overhead_row(name, args.steps, not args.no_compile)
        r = {variant: statistics.median(t) for variant, t in samples.items()}
        compiled = (f"{r['plain compiled'] * ms:.2f} | {r['parallel compiled'] * ms:.2f} | "
                    f"{paired_ratio(samples, 'parallel compiled', 'plain compiled'):.2f}x") \
            if "plain compiled" in r else "- | - | -"
        print(f"| {name} | {r['plain'] * ms:.2f} | {r['parallel'] * ms:.2f} | "
              f"{paired_ratio(samples, 'parallel', 'plain'):.2f}x | "
              f"{compiled} |", flush=True)
    if args.no_overlap_rows:
        return
    print()
    print("Overlap: 4-layer LLaMA (hidden 512, 2 x 128 tokens per rank), torchtitan's FSDP plan priced with overlap")
    print("| ranks | hidden edges | compute alone | communication alone | blocking step | overlapped step | "
          "blocking - overlapped | hidden |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for world in OVERLAP_WORLDS:
        model, inputs = llama(4, 512, 2 * world, 128)
        graph = trace(model, inputs)
        r = overlap_row(world, args.steps, model, inputs, graph)
        hidden = (r["compute"] + r["communication"] - r["overlapped"]) / r["communication"]
        print(f"| {world} | {r['hidden edges']} | {r['compute'] * ms:.1f} | {r['communication'] * ms:.1f} | "
              f"{r['blocking'] * ms:.1f} | {r['overlapped'] * ms:.1f} | {(r['blocking'] - r['overlapped']) * ms:.1f} | "
              f"{hidden:.0%} |", flush=True)


if __name__ == "__main__":
    main()
