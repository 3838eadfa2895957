"""Asynchronous tensor parallelism (``--async-tp``): what torch's micro-pipelined collectives leave exposed.

What torch fuses (torch 2.13, torch/_inductor/fx_passes/micro_pipeline_tp.py, under inductor's
``_micro_pipeline_tp`` with ``enable_symm_mem_for_group``; torchtitan's
``--experimental.enable_async_tensor_parallel``):

- an all-gather with every ``mm`` / ``_scaled_mm`` reading the gathered tensor as its left operand
  (``_find_consumer_matmuls``: a linear without bias lowers to view -> mm -> view; with a bias to
  ``addmm``, which is not matched), all of one kind (bf16 or Float8, else none), into
  ``fused_all_gather_matmul`` (``_scaled``); gathered along the last dim, only unscaled products
  of a shard at least 1024 wide;
- a reduce-scatter with the ``mm`` producing its input (``_find_producer_matmul``), if the product
  has no other reader, into ``fused_matmul_reduce_scatter`` (``_scaled``); along the last dim only
  unscaled;
- nothing else: all-reduces, all-to-alls, reshards of several steps, collectives beside other ops
  run as without async TP (``fuses`` says which ops fuse, ``fused_step`` which reshards).

In training a linear's input gather reverses into a reduce-scatter of its input gradient, produced
by the input-gradient product ``dX = dY W`` (half the linear's backward flops) and fused with it
when one linear writes that gradient (several: their sum, an add, fuses with nothing); a
row-parallel output's reduce-scatter reverses into an all-gather of the output gradient, whose
only left-operand reader is the input-gradient product (the weight gradient reads ``dY^T``).

How torch runs them (torch/distributed/_symmetric_memory/__init__.py), on ``n`` ranks with equal
chunks: ``g`` one chunk's products (every fused product on 1/n of the rows, each at the device's
rate for that size: ``cost/devices.py`` ``by_flops``), ``c`` one chunk's transfer (a ``copy_``
between symmetric-memory buffers, a cudaMemcpyAsync over NVLink by ATen's
``copy_device_to_device``, aten/src/ATen/native/cuda/Copy.cu; copies serialize on the link,
"cp from different streams cannot overlap"), products serialize on the SMs in the order they
become ready:

- all-gather + matmul (``_pipelined_all_gather_and_consume``): the shard is copied into the local
  symmetric buffer on the compute stream before the barrier (exposed: torch gives up overlapping
  it), the local chunk's products run, and remote chunks ``k = 1..n-1``, alternately on a second
  stream and the compute stream, are each copied in, then multiplied. The shard's copy into the
  gathered output runs under the last chunk's products and is not charged:

      T_ag = copy + g + (n - 1) max(g, c),                      copy = 2 S / streaming

- matmul + reduce-scatter (``_pipelined_produce_and_all2all``): steps ``k = 1..n-1``, alternately on
  the second and the compute stream, each compute the chunk for rank + k into a symmetric buffer
  and pull the chunk rank - k computed for this rank; then this rank's own chunk on the compute
  stream after its last step (for odd ``n`` that waits for the last pull), and once the streams
  join, one kernel sums the ``n`` stacked partials:

      T_rs = g + (n - 1) max(g, c) + (n mod 2) min(g, c) + reduction,   reduction = (n + 1) S / streaming

with ``S`` one chunk's bytes (the all-gather's shard; a ``1/n`` of the reduce-scatter's input).
Both are exact for that timeline (``tests/cost/test_async_tp.py`` simulates it chunk by chunk).
The chunks move the collective's bytes over its links: ``c`` is the collective's price (the cost
model's, one latency) over ``n - 1``. What a fused collective leaves exposed is
``max(0, T - G)``, ``G`` its products unchunked at their own rate (what the nodes are charged).

Not modelled: copies and products contending for HBM, barrier latency beyond the collective's one,
two products on different streams sharing the SMs (torch's reason for two streams: "greatly
reducing quantization inefficiency"; here they run one after the other), and inductor's
``reorder_for_compute_comm_overlap`` filter (off by default).

The solver prices each activation edge this way (``problem/edges.py`` ``EdgePrices.async_matrices``):
per strategy pair, the forward reshard fused as a gather with the consumer's product or as a
scatter with the producer's (where the edge is the only reader of the producer's output, counted in
the build: ``problem/edges.py`` ``reader_counts``), the gradient's with the input-gradient products, whichever exposes
least, and in full where ``fused_step`` finds no single fusable collective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from autoshard.cost.devices import Device
from autoshard.frontend.graph import OpNode
from autoshard.sharding.reshard import ALL_GATHER, REDUCE_SCATTER, SLICE, Step

NARROWEST_LAST_DIM_SHARD = 1024
"""micro_pipeline_tp.py: a shard gathered along its last dim narrower than this is not fused
("Decomposed mms should not be too small")."""


def gather_matmul_ticks(chunk: np.ndarray | int, transfer: np.ndarray | int, parts: int,
                        copy: np.ndarray | int) -> np.ndarray:
    """``fused_all_gather_matmul``'s time over ``parts`` ranks: copy + g + (n - 1) max(g, c)."""
    return np.asarray(copy) + chunk + (parts - 1) * np.maximum(chunk, transfer)


def matmul_scatter_ticks(chunk: np.ndarray | int, transfer: np.ndarray | int, parts: int,
                         reduction: np.ndarray | int) -> np.ndarray:
    """``fused_matmul_reduce_scatter``'s time over ``parts`` ranks:
    g + (n - 1) max(g, c) + (n mod 2) min(g, c) + reduction."""
    return (np.asarray(chunk) + (parts - 1) * np.maximum(chunk, transfer)
            + (parts % 2) * np.minimum(chunk, transfer) + reduction)


def fuses(node: OpNode) -> bool:
    """Whether torch's pass can fuse a collective with ``node``'s product: a bias-free linear or an
    ``mm`` (one aten ``mm`` / ``_scaled_mm``; a biased linear is an ``addmm``)."""
    return (node.op == "linear" and len(node.inputs) == 2) or node.op == "mm"


def fused_step(steps: Sequence[Step], shape: tuple[int, ...], mesh_shape: tuple[int, ...], kind: str,
               scaled: bool) -> Step | None:
    """The one collective of a reshard's ``steps`` (slices aside) if it is of ``kind``
    (``ALL_GATHER`` or ``REDUCE_SCATTER``) and torch fuses it with products ``scaled`` (Float8) or
    not: along the last dim only unscaled, and a gathered shard at least 1024 wide; else None."""
    moving = [s for s in steps if s.kind != SLICE]
    if len(moving) != 1 or moving[0].kind != kind:
        return None
    step = moving[0]
    if step.dim == len(shape) - 1:
        width = shape[-1] // math.prod(mesh_shape[a] for a in step.before.dims[-1])
        if scaled or (kind == ALL_GATHER and width < NARROWEST_LAST_DIM_SHARD):
            return None
    return step


@dataclass(frozen=True)
class Gemms:
    """Products one fused collective runs chunk by chunk: each one's local flops (unchunked), in
    ``dtype`` on ``device``, priced in ticks of ``ticks_per_unit`` a second."""

    flops: tuple[int, ...]
    dtype: str
    device: Device
    ticks_per_unit: int

    def ticks(self, parts: int) -> int:
        """Ticks of the products each cut into ``parts`` row chunks: one chunk of each, at the
        device's rate for a chunk's size (``parts = 1``: unchunked)."""
        seconds = 0.0
        for flops in self.flops:
            chunk = flops / parts
            if chunk:
                seconds += chunk / self.device.flops_per_second(self.dtype, "matmul", chunk)
        return round(seconds * self.ticks_per_unit)


def pipelined_exposed(step: Step, parts: int, collective_ticks: int, gemms: Gemms) -> int:
    """Ticks a fused ``step`` (one all-gather or reduce-scatter over ``parts`` ranks, priced
    ``collective_ticks`` unfused) leaves exposed beside its ``gemms``: max(0, T - G) (module doc)."""
    streamed = gemms.device.streaming_bandwidth / gemms.ticks_per_unit  # bytes a tick
    chunk, whole = gemms.ticks(parts), gemms.ticks(1)
    transfer = collective_ticks / (parts - 1)
    if step.kind == ALL_GATHER:
        total = gather_matmul_ticks(chunk, transfer, parts, 2 * step.in_bytes / streamed)
    elif step.kind == REDUCE_SCATTER:
        total = matmul_scatter_ticks(chunk, transfer, parts, (parts + 1) * step.in_bytes / parts / streamed)
    else:
        raise ValueError(f"torch fuses no {step.kind} with a matmul")
    return max(0, round(float(total)) - whole)


def fused_exposed(steps: Sequence[Step], shape: tuple[int, ...], mesh_shape: tuple[int, ...], kind: str,
                  ticks: int, products: Sequence[tuple[int, str]], device: Device, ticks_per_unit: int,
                  ragged: bool = False) -> int:
    """What a reshard of ``steps`` (a tensor of ``shape``), priced ``ticks`` unfused, leaves exposed
    where torch fuses it as a collective of ``kind`` with ``products`` ((local flops, dtype) of each:
    the consumers of a gather, the producer of a scatter); ``ticks`` where it does not: no products,
    products of more than one dtype, a reshard ``fused_step`` refuses, or along the last dim a
    gathered tensor ``ragged``ly read by other ops too."""
    dtypes = {dtype for _, dtype in products}
    if len(dtypes) != 1:
        return ticks
    (dtype,) = dtypes
    step = fused_step(steps, shape, mesh_shape, kind, dtype.startswith("float8"))
    if step is None or (ragged and step.dim == len(shape) - 1):
        return ticks
    gemms = Gemms(tuple(flops for flops, _ in products), dtype, device, ticks_per_unit)
    return pipelined_exposed(step, mesh_shape[step.axis], ticks, gemms)

