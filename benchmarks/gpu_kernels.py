"""Time the kernels the cost model prices, on the GPU at hand, and write what was measured as JSON.

    python benchmarks/gpu_kernels.py --out measured.json [--quick]

Pure PyTorch (it runs where autoshard is not installed): bf16 matrix products over a grid of
shapes and at LLaMA-3-8B's, causal fused attention (SDPA's flash kernel) forward and backward by
sequence length and head dim, memory-bound kernels by size (copy, add, torchtitan's RMSNorm),
the AdamW step (foreach and fused) on an 8-way shard of LLaMA-3-8B, one LLaMA-3-8B layer and the
output head with its fp32 loss forward and backward at torchtitan's local batch (2 x 8192), the
caching allocator's reserved over allocated bytes in a short training run, and what the CUDA
context and an NCCL communicator take outside the allocator. Every timing is the median of
CUDA-event-timed repeats after warm-ups, on random data. ``benchmarks/kernels.py`` prints these
beside the cost model's predictions. ``--quick`` shrinks every size so the script can be checked
on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from titan_llama import FeedForward, Transformer, TransformerBlock  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
BF16 = torch.bfloat16


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs after ``warmup`` (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if CUDA:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def repeats_for(seconds_each: float, budget: float = 0.2, most: int = 50) -> int:
    """How many repeats fit ``budget`` seconds (at least 5)."""
    return max(5, min(most, int(budget / max(seconds_each, 1e-6))))


def timed(fn: Callable[[], object], budget: float = 0.2) -> float:
    """Median seconds of ``fn``, repeated as often as ``budget`` allows."""
    once = median_seconds(fn, 1, warmup=1)
    return median_seconds(fn, repeats_for(once, budget))


def randn(*shape: int, dtype: torch.dtype = BF16, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE, dtype=dtype, requires_grad=grad)


def environment() -> dict:
    """The card, its power limit and clocks as found, and the software."""
    env = {"torch": torch.__version__, "device": DEVICE, "cuda": torch.version.cuda}
    if CUDA:
        props = torch.cuda.get_device_properties(0)
        env.update(name=props.name, multiprocessors=props.multi_processor_count,
                   memory_bytes=props.total_memory)
        env["nvidia_smi"] = smi("name,power.limit,power.max_limit,clocks.max.sm,clocks.max.memory,driver_version")
    return env


def smi(fields: str) -> str:
    """One nvidia-smi query line (empty where it is missing)."""
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def gemms(sizes: list[int], llama_tokens: list[int]) -> list[dict]:
    """bf16 ``(M, K) @ (K, N)`` over the grid ``sizes``^3, and LLaMA-3-8B's projections at each
    token count in ``llama_tokens`` forward and as both backward products (dX = dY W^T, dW = X^T dY)."""
    rows = []
    shapes = [(m, n, k) for m in sizes for n in sizes for k in sizes]
    for tokens in llama_tokens:
        for k, n in ((4096, 4096), (4096, 1024), (4096, 14336), (14336, 4096), (4096, 128256)):
            shapes += [(tokens, n, k), (tokens, k, n), (k, n, tokens)]
    for m, n, k in shapes:
        a, b = randn(m, k), randn(k, n)
        seconds = timed(lambda: a @ b)
        rows.append({"m": m, "n": n, "k": k, "seconds": seconds, "tflops": 2 * m * n * k / seconds / 1e12})
    return rows


def float8_gemms(llama_tokens: list[int], projections: list[tuple[int, int]]) -> list[dict]:
    """``torch._scaled_mm`` (e4m3 operands, bf16 out) on (tokens, k) x (k, n) projections with
    tensorwise and rowwise scales, and an operand's tensorwise scaling (abs-max, then scale and cast
    to e4m3): the kernels ``--float8`` prices (cost/float8.py), beside the bf16 rows of :func:`gemms`."""
    rows = []
    f32 = dict(device=DEVICE, dtype=torch.float32)
    for tokens in llama_tokens:
        for k, n in projections:
            a = randn(tokens, k).to(torch.float8_e4m3fn)
            b = randn(n, k).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm takes it
            scales = {"tensorwise": (torch.ones((), **f32), torch.ones((), **f32)),
                      "rowwise": (torch.ones(tokens, 1, **f32), torch.ones(1, n, **f32))}
            for recipe, (sa, sb) in scales.items():
                seconds = timed(lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=BF16))
                rows.append({"kernel": f"scaled_mm_{recipe}", "m": tokens, "n": n, "k": k, "seconds": seconds,
                             "tflops": 2 * tokens * n * k / seconds / 1e12})
            x = randn(tokens, k)
            seconds = timed(lambda: (x * (448.0 / x.abs().amax().float())).to(torch.float8_e4m3fn))
            rows.append({"kernel": "cast_tensorwise", "m": tokens, "k": k, "seconds": seconds,
                         "gbps": 5 * tokens * k / seconds / 1e9})
    return rows


def attention(configs: list[tuple[int, int, int, int]]) -> list[dict]:
    """Causal SDPA (flash on CUDA) forward and backward for (batch, heads, seq, head_dim); flops are
    the computed (causal) half, as FlashAttention's benchmarks count them."""
    rows = []
    backend = torch.nn.attention.SDPBackend.FLASH_ATTENTION if CUDA else torch.nn.attention.SDPBackend.MATH
    for batch, heads, seq, dim in configs:
        q, k, v = (randn(batch, heads, seq, dim, grad=True) for _ in range(3))
        with torch.nn.attention.sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            grad = torch.randn_like(out)
            forward = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            backward = timed(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True))
        flops = 4 * batch * heads * seq * seq * dim / 2
        rows.append({"batch": batch, "heads": heads, "seq": seq, "head_dim": dim, "forward_s": forward,
                     "backward_s": backward, "forward_tflops": flops / forward / 1e12,
                     "backward_tflops": 2.5 * flops / backward / 1e12})
    return rows


def streaming(sizes: list[int]) -> list[dict]:
    """Memory-bound kernels by bytes: a bf16 copy, an add, and torchtitan's RMSNorm (fp32 inside)
    forward and backward on (tokens, 4096); bandwidth counts each operand read or written once."""
    rows = []
    for numel in sizes:
        x, y, out = randn(numel), randn(numel), torch.empty(numel, device=DEVICE, dtype=BF16)
        copy = timed(lambda: out.copy_(x))
        add = timed(lambda: torch.add(x, y, out=out))
        rows.append({"kernel": "copy", "bytes": 4 * numel, "seconds": copy, "gbps": 4 * numel / copy / 1e9})
        rows.append({"kernel": "add", "bytes": 6 * numel, "seconds": add, "gbps": 6 * numel / add / 1e9})
    for tokens in (sizes[-1] // 4096 // 4, sizes[-1] // 4096):
        norm = torch.nn.RMSNorm(4096, eps=1e-5, device=DEVICE, dtype=BF16)
        x = randn(tokens, 4096, grad=True)
        y = norm(x)
        grad = torch.randn_like(y)
        forward = timed(lambda: norm(x))
        backward = timed(lambda: torch.autograd.grad(y, (x, norm.weight), grad, retain_graph=True))
        nbytes = 2 * tokens * 4096 * 2
        rows.append({"kernel": "rmsnorm_forward", "bytes": nbytes, "seconds": forward, "gbps": nbytes / forward / 1e9})
        rows.append({"kernel": "rmsnorm_backward", "bytes": 3 * nbytes // 2, "seconds": backward,
                     "gbps": 3 * nbytes / 2 / backward / 1e9})
    return rows


def adamw(layers: int, shard: int, dim: int, hidden: int, vocab: int) -> list[dict]:
    """The AdamW step (foreach and fused) on fp32 parameters shaped as 1/``shard`` of a LLaMA."""
    shapes = [(vocab // shard, dim), (vocab // shard, dim), (dim // shard,)]
    for _ in range(layers):
        shapes += [(dim // shard, dim)] * 2 + [(dim // 4 // shard, dim)] * 2
        shapes += [(hidden // shard, dim)] * 2 + [(dim // shard, hidden), (dim // shard,), (dim // shard,)]
    rows = []
    for implementation in ("foreach", "fused"):
        if implementation == "fused" and not CUDA:
            continue
        params = [torch.nn.Parameter(torch.randn(s, device=DEVICE)) for s in shapes]
        for p in params:
            p.grad = torch.randn_like(p)
        optimizer = torch.optim.AdamW(params, lr=1e-4, **{implementation: True})
        seconds = timed(optimizer.step, budget=1.0)
        count = sum(p.numel() for p in params)
        rows.append({"implementation": implementation, "parameters": count, "tensors": len(params),
                     "seconds": seconds, "bytes_per_parameter_at_gbps": 28 * count / seconds / 1e9})
        del optimizer, params
        empty_cache()
    return rows


def empty_cache() -> None:
    if CUDA:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


SAVED_OPS = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_efficient_attention.default,
             torch.ops.aten._scaled_dot_product_flash_attention.default, torch.ops.aten.max.default}


def titan_selective_policy():  # noqa: ANN201 (torch's context pair)
    """torchtitan's op-level selective checkpointing: save matmul and attention outputs but every
    second matmul's, recompute the rest."""
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):  # noqa: ANN001, ANN202
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            counts[mode] += 1
        save = func in SAVED_OPS and not (func == torch.ops.aten.mm.default and counts[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def layer_and_head(batch: int, seq: int, dim: int, heads: int, kv_heads: int, hidden: int, vocab: int) -> dict:
    """One LLaMA layer (torchtitan's block) and the output head with its fp32 cross-entropy,
    forward and forward+backward, bf16, at ``batch`` x ``seq`` tokens; the layer's peak bytes."""
    block = TransformerBlock(dim, heads, kv_heads, hidden, 1e-5).to(DEVICE, BF16)
    half = dim // heads // 2
    freqs = 1.0 / 500000.0 ** (torch.arange(half, dtype=torch.float32, device=DEVICE) / half)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32, device=DEVICE), freqs).repeat(1, 2)[None, :, None, :]
    cos, sin = angles.cos(), angles.sin()
    x = randn(batch, seq, dim, grad=True)
    grad = randn(batch, seq, dim)

    def forward() -> None:
        with torch.no_grad():
            block(x, cos, sin)

    def step() -> None:
        torch.autograd.backward(block(x, cos, sin), grad)

    def checkpointed(context_fn: Callable | None) -> None:
        kwargs = {"context_fn": context_fn} if context_fn else {}
        out = checkpoint(block, x, cos, sin, use_reentrant=False, **kwargs)
        torch.autograd.backward(out, grad)

    result = {"layer_forward_s": timed(forward, 0.5), "layer_forward_backward_s": timed(step, 0.5),
              "layer_full_ac_s": timed(lambda: checkpointed(None), 0.5),
              "layer_selective_ac_s": timed(lambda: checkpointed(titan_selective_policy), 0.5)}
    ffn = FeedForward(dim, hidden).to(DEVICE, BF16)
    result["ffn_forward_backward_s"] = timed(lambda: torch.autograd.backward(ffn(x), grad), 0.5)
    if CUDA:
        empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        result["layer_peak_bytes_over_inputs"] = torch.cuda.max_memory_allocated() - base
    empty_cache()
    output = torch.nn.Linear(dim, vocab, bias=False).to(DEVICE, BF16)
    h = randn(batch, seq, dim, grad=True)
    labels = torch.randint(0, vocab, (batch * seq,), device=DEVICE)

    def head() -> None:
        F.cross_entropy(output(h).flatten(0, 1).float(), labels).backward()

    result["head_forward_backward_s"] = timed(head, 0.5)
    empty_cache()
    return result


def allocator(layers: int, batch: int, seq: int, dim: int, heads: int, kv_heads: int, hidden: int,
              vocab: int, steps: int) -> dict:
    """A few AdamW training steps of a ``layers``-layer torchtitan LLaMA in bf16: the peak bytes
    allocated and reserved (the caching allocator's headroom), and the device memory in use
    outside the allocator (CUDA context, cuBLAS workspaces)."""
    if not CUDA:
        return {}
    empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = Transformer(layers, dim, heads, kv_heads, hidden, vocab, seq).to(DEVICE)
    model.to(BF16)
    model.cos, model.sin = model.cos.float(), model.sin.float()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    tokens = torch.randint(0, vocab, (batch, seq), device=DEVICE)
    step_times = []
    for _ in range(steps):
        start = time.perf_counter()
        model(tokens, tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        step_times.append(time.perf_counter() - start)
    free, total = torch.cuda.mem_get_info()
    result = {"layers": layers, "peak_allocated": torch.cuda.max_memory_allocated(),
              "peak_reserved": torch.cuda.max_memory_reserved(), "step_s": statistics.median(step_times[1:]),
              "step_times": step_times,
              "device_used": total - free, "reserved_now": torch.cuda.memory_reserved()}
    result["outside_allocator"] = result["device_used"] - result["reserved_now"]
    del model, optimizer, tokens
    empty_cache()
    return result


def nccl_buffers() -> dict:
    """Device bytes a one-rank NCCL communicator takes after its first all-reduce."""
    if not CUDA:
        return {}
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    empty_cache()
    free_before, _ = torch.cuda.mem_get_info()
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    x = randn(1 << 20)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    del x
    empty_cache()
    free_after, _ = torch.cuda.mem_get_info()
    dist.destroy_process_group()
    return {"one_rank_bytes": free_before - free_after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the script on a CPU")
    args = parser.parse_args()
    torch.manual_seed(0)
    q = args.quick
    measured: dict = {"environment": environment()}
    if CUDA:
        measured["context_bytes"] = torch.cuda.mem_get_info()[1] - torch.cuda.mem_get_info()[0]
    dims = dict(dim=256, heads=4, kv_heads=2, hidden=512, vocab=1024) if q else \
        dict(dim=4096, heads=32, kv_heads=8, hidden=14336, vocab=128256)
    steps = [
        ("gemm", lambda: gemms([64, 128] if q else [512, 1024, 2048, 4096, 8192, 16384],
                               [256] if q else [4096, 16384])),
        ("float8", lambda: float8_gemms([64] if q else [4096, 16384],
                                        [(128, 256)] if q else [(4096, 4096), (4096, 14336), (14336, 4096)])),
        ("attention", lambda: attention([(1, 2, 128, 64)] if q else
                                        [(b, 32, s, d) for d in (128, 64) for s, b in
                                         ((1024, 16), (2048, 8), (4096, 4), (8192, 2), (16384, 1), (32768, 1))])),
        ("streaming", lambda: streaming([1 << 12, 1 << 16] if q else [1 << p for p in range(14, 31, 2)])),
        ("adamw", lambda: adamw(2 if q else 32, 8, dims["dim"], dims["hidden"], dims["vocab"])),
        ("layer", lambda: layer_and_head(1 if q else 2, 128 if q else 8192, **dims)),
        ("allocator", lambda: allocator(2, 1 if q else 2, 128 if q else 8192, **dims, steps=4)),
        ("nccl", nccl_buffers),
    ]
    sampler = None
    if CUDA:
        trace = args.out.with_name(args.out.stem + "_smi.csv").open("w")
        sampler = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,power.draw,clocks.sm,clocks.mem,temperature.gpu",
                                    "--format=csv", "-lms", "250"], stdout=trace, stderr=subprocess.DEVNULL)
    for name, run in steps:
        start = time.perf_counter()
        try:
            measured[name] = run()
        except Exception as error:  # one failed measurement must not cost the others
            measured[name] = {"error": f"{type(error).__name__}: {error}"}
        print(f"{name}: {time.perf_counter() - start:.1f} s", flush=True)
        args.out.write_text(json.dumps(measured, indent=1))
        empty_cache()
    if sampler is not None:
        sampler.terminate()
    if CUDA:
        measured["environment"]["nvidia_smi_after"] = smi("power.draw,clocks.sm,temperature.gpu")
    args.out.write_text(json.dumps(measured, indent=1))
    summary = {k: v for k, v in measured.items() if k in ("layer", "allocator", "nccl", "context_bytes")}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
