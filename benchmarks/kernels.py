"""The cost model's kernel times against the same kernels timed on a GPU (``gpu_kernels.py``).

    .venv/bin/python benchmarks/kernels.py [--measured benchmarks/data/h100_sxm_measured.json] [--device h100]

Every row is predicted by the model for the measured shape on one device of preset ``--device``
and printed beside the measurement, with predicted / measured (below 1: the model is
optimistic). The preset's scalar fractions, matmul curve, AdamW traffic and allocator headroom
were read off the same file (devices.toml cites it), so those rows check the arithmetic; the
layer, head and training-step rows combine many kernels the model prices one by one (norms,
rotary, SwiGLU, the fp32 loss, recomputation), and are the test of the model.

A second table (``gpu_recompute.py``'s file, where present) prices one-device plans that
recompute the first K layers against their measured peaks and steps. At a budget of each
measured peak, the solver's own choice of layers is checked against the measured peaks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from titan_llama import Transformer  # noqa: E402

from autoshard.api import build_model_problem, default_solve_options, solve_model_problem  # noqa: E402
from autoshard.cost.compute import op_times  # noqa: E402
from autoshard.cost.devices import Device, get_device  # noqa: E402
from autoshard.frontend.graph import NodeKind, OpGraph, OpWork  # noqa: E402
from autoshard.frontend.trace import trace  # noqa: E402
from autoshard.problem.build import ModelProblem  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "h100_sxm_measured.json"
RECOMPUTE_DATA = Path(__file__).resolve().parent / "data" / "h100_recompute_measured.json"
LLAMA_8B = dict(dim=4096, heads=32, kv_heads=8, hidden=14336, vocab=128256)


def gemm_seconds(m: int, n: int, k: int, device: Device) -> float:
    """One bf16 ``(m, k) @ (k, n)`` product."""
    work = OpWork(flops=2 * m * n * k)
    return op_times(work, 1, [2 * m * k, 2 * k * n], [False, False], 2 * m * n, "bfloat16", device, "mm").forward


def attention_seconds(batch: int, heads: int, seq: int, dim: int, device: Device) -> tuple[float, float]:
    """Causal SDPA forward and backward, torch's flop counts."""
    q = torch.empty(batch, heads, seq, dim, dtype=torch.bfloat16, device="meta", requires_grad=True)
    with FlopCounterMode(display=False) as forward:
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    with FlopCounterMode(display=False) as backward:
        out.sum().backward()
    nbytes = 2 * batch * heads * seq * dim
    times = op_times(OpWork(flops=forward.get_total_flops(), backward_flops=backward.get_total_flops()), 1,
                     [nbytes] * 3, [True] * 3, nbytes, "bfloat16", device, "scaled_dot_product_attention", True)
    return times.forward, times.backward


def llama_graph(layers: int = 2) -> OpGraph:
    """torchtitan's LLaMA-3-8B with ``layers`` layers at 2 x 8192 tokens, bf16, traced on meta."""
    with torch.device("meta"):
        model = Transformer(layers, **LLAMA_8B, seq=8192).to(torch.bfloat16)
    model.cos, model.sin = model.cos.float(), model.sin.float()
    tokens = torch.zeros(2, 8192, dtype=torch.long, device="meta")
    return trace(model, (tokens, tokens.clone()))


def llama_problem(graph: OpGraph, device: Device | str, recompute: str, budget: int | None = None) -> ModelProblem:
    """``graph`` (llama_graph) in training on one device of ``device``, under ``budget`` if given."""
    return build_model_problem(graph, "1", mode="training", device=device, recompute=recompute, memory_budget=budget)


def seconds_of(mp: ModelProblem, inside: str | None, recomputed: bool = False, forward: bool = False,
               ops_only: bool = True) -> float:
    """Seconds of the nodes whose module starts with ``inside`` (None: the nodes outside every
    layer and the embedding), each in its recomputed strategy if asked, forward only if asked."""
    ticks = 0
    for name in mp.names:
        candidate = mp.candidates[name]
        node = candidate.node
        if ops_only and node.kind != NodeKind.OP:
            continue
        module = node.module or ""
        if inside is None and (module.startswith("layers.") or module.startswith("tok_embeddings")):
            continue
        if inside is not None and not module.startswith(inside):
            continue
        index = candidate.recompute.index(recomputed) if candidate.recompute and recomputed in candidate.recompute else 0
        ticks += (candidate.forward_costs or candidate.costs)[index] if forward else candidate.costs[index]
    return ticks / mp.cost_model.ticks_per_unit


def rows(measured: dict, device: Device) -> list[tuple[str, float, float, str]]:
    """(what, predicted s or bytes, measured, unit) for every measurement the model can price."""
    out = []
    for r in measured["gemm"][6**3:]:
        if r["m"] == 16384 or r["k"] == 16384:
            out.append((f"GEMM {r['m']}x{r['k']} @ {r['k']}x{r['n']}", gemm_seconds(r["m"], r["n"], r["k"], device),
                        r["seconds"], "s"))
    for r in measured["attention"]:
        if r["head_dim"] == 128 and r["seq"] in (2048, 8192, 32768):
            fwd, bwd = attention_seconds(r["batch"], r["heads"], r["seq"], r["head_dim"], device)
            label = f"flash attention {r['batch']}x{r['heads']}x{r['seq']}x{r['head_dim']}"
            out += [(label + " forward", fwd, r["forward_s"], "s"), (label + " backward", bwd, r["backward_s"], "s")]
    for r in measured["streaming"][-6:]:
        out.append((f"{r['kernel']} {r['bytes'] / 2**30:.1f} GiB", r["bytes"] / device.streaming_bandwidth,
                    r["seconds"], "s"))
    foreach = next(r for r in measured["adamw"] if r["implementation"] == "foreach")
    out.append((f"AdamW (foreach) {foreach['parameters'] / 1e9:.2f}e9 fp32 parameters",
                device.optimizer_seconds(4 * foreach["parameters"]), foreach["seconds"], "s"))
    layer = measured["layer"]
    graph = llama_graph()
    plain, selective, full = (llama_problem(graph, device, r) for r in ("none", "selective", "full"))
    out += [("LLaMA-3-8B layer forward, 2 x 8192", seconds_of(plain, "layers.0", forward=True),
             layer["layer_forward_s"], "s"),
            ("LLaMA-3-8B layer forward+backward", seconds_of(plain, "layers.0"), layer["layer_forward_backward_s"], "s"),
            ("  with torchtitan's selective checkpointing", seconds_of(selective, "layers.0", recomputed=True),
             layer["layer_selective_ac_s"], "s"),
            ("  with full checkpointing", seconds_of(full, "layers.0", recomputed=True), layer["layer_full_ac_s"], "s"),
            ("feed-forward (SwiGLU) forward+backward", seconds_of(plain, "layers.0.feed_forward"),
             layer["ffn_forward_backward_s"], "s"),
            ("output head + fp32 cross-entropy forward+backward", seconds_of(plain, None), layer["head_forward_backward_s"],
             "s")]
    run = measured["allocator"]
    step = seconds_of(plain, "", ops_only=False)
    out.append((f"{run['layers']}-layer training step with AdamW, one GPU", step, run["step_s"], "s"))
    live = plain.problem.peak_usage([0] * plain.problem.num_nodes)
    out.append(("  its peak allocated bytes", live, run["peak_allocated"], "GiB"))
    out.append(("  its peak reserved bytes", device.device_bytes(live) - device.runtime_bytes, run["peak_reserved"], "GiB"))
    return out


def recomputing_first(mp: ModelProblem, recomputed: int) -> list[int]:
    """The one-device plan that recomputes the first ``recomputed`` layers in full."""
    first = tuple(f"layers.{j}." for j in range(recomputed))
    candidates = [mp.candidates[name] for name in mp.names]
    choice = [0 if c.recompute is None else c.recompute.index((c.node.module or "").startswith(first))
              for c in candidates]
    return mp.with_storage_of_users(choice)


def recompute_table(measured: dict, device: Device) -> None:
    """Per K, the plan recomputing K layers: predicted against measured peak and step; and at a
    budget of each measured peak, how many layers the solver recomputes and whether that fits."""
    runs = {r["recomputed"]: r for r in measured["recompute"]}
    graph = llama_graph(measured["layers"])
    mp = llama_problem(graph, device, "full")
    print(f"\n{measured['layers']} layers of LLaMA-3-8B, 2 x 8192 tokens, AdamW, one GPU, the first K layers "
          "recomputed (torch.utils.checkpoint):\n\n| K | predicted peak | measured peak | ratio | predicted step | "
          "measured step | ratio | solver's K at this measured peak | its measured peak |\n"
          "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k, run in sorted(runs.items()):
        choice = recomputing_first(mp, k)
        peak, step = mp.problem.peak_usage(choice), mp.problem.cost(choice) / mp.cost_model.ticks_per_unit
        bound = llama_problem(graph, device, "full", device.device_bytes(run["peak_allocated"]))
        picked = len(solve_model_problem(bound, default_solve_options(bound, 60)).plan.recompute)
        fits = runs[picked]["peak_allocated"] <= run["peak_allocated"] if picked in runs else None
        print(f"| {k} | {peak / 2**30:.2f} GiB | {run['peak_allocated'] / 2**30:.2f} GiB | "
              f"{peak / run['peak_allocated']:.3f} | {step * 1e3:.1f} ms | {run['step_s'] * 1e3:.1f} ms | "
              f"{step / run['step_s']:.3f} | {picked} | "
              f"{'-' if fits is None else ('fits' if fits else 'over')} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=Path, default=DATA)
    parser.add_argument("--recompute-measured", type=Path, default=RECOMPUTE_DATA,
                        help="gpu_recompute.py's output (skipped if absent)")
    parser.add_argument("--device", default="h100", help="the preset to predict with")
    args = parser.parse_args()
    measured = json.loads(args.measured.read_text())
    env = measured["environment"]
    print(f"measured: {env.get('name', env['device'])} ({env.get('nvidia_smi', '')}), torch {env['torch']}; "
          f"predicted: preset {args.device}")
    print("| kernel | predicted | measured | predicted / measured |\n|---|---:|---:|---:|")
    for what, predicted, actual, unit in rows(measured, get_device(args.device)):
        scale, fmt = (1e3, "{:.3f} ms") if unit == "s" else (1 / 2**30, "{:.1f} GiB")
        print(f"| {what} | {fmt.format(predicted * scale)} | {fmt.format(actual * scale)} | {predicted / actual:.2f} |")
    if args.recompute_measured.exists():
        recompute_table(json.loads(args.recompute_measured.read_text()), get_device(args.device))


if __name__ == "__main__":
    main()
