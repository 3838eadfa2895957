"""torchao's Float8 training of ``nn.Linear``, as the cost model prices it (``--float8 tensorwise|rowwise``).

``torchao.float8.convert_to_float8_training`` swaps each eligible ``nn.Linear`` for a
``Float8Linear``: its three GEMMs (output, input gradient, weight gradient) run on float8
operands (``torch._scaled_mm``), each operand cast from bf16 by memory-bound kernels first.
Which linears: those whose weight dims both divide by 16 (``_scaled_mm``'s requirement), except
the final projection to the vocabulary (torchtitan's default ``filter_fqns = ["output"]``; its
Hugging Face name ``lm_head``), which keeps bf16.

Priced per Float8 linear, on one device's local shapes (``n_x``, ``n_w``, ``n_g``: elements of the
input, the weight and the output gradient):

- the GEMMs at the device's fp8 peak times the fraction its bf16 products of the same local flops
  reach (the ``by_flops`` curve or ``achieved["matmul"]``): torchao's own roofline takes one
  achievable fraction for both dtypes (torchao/testing/training/roofline_utils.py,
  ``pct_achievable_gemm_tops``);
- the scaling and cast kernels at the streaming bandwidth, moving the bytes torchao's roofline
  counts for each operand's role (same file, ``get_tensor_memory_traffic_ovhd_s``), bf16 in and
  float8 out. Tensorwise: an abs-max pass (``2n``; fused into the producing op where compiled code
  fuses that op, never for the weight) and a cast writing both layouts (input, output gradient:
  ``4n``; weight: ``3n`` for the forward and ``3n`` again in backward). Rowwise: input and output
  gradient ``5n`` (``3n`` fused) + ``3n``; weight ``3n`` + ``4n`` + ``3n``. The input's and the
  weight's forward kernels run in the forward, the rest in the backward;
- with tensorwise scaling under FSDP, the weight's all-gather moves float8 (one byte an element:
  torchtitan's ``enable_fsdp_float8_all_gather``, which it sets only for tensorwise scaling;
  ``problem/edges.py`` reads :func:`gather_itemsize`);
- with tensorwise scaling under tensor parallelism, the linear's input is gathered in float8 and
  its output's gradient too (torchao's Float8 tensor-parallel styles; :func:`activation_itemsize`).
  Both as torchtitan runs them; this project's runtime gathers bf16 and casts its copy
  (``runtime/float8.py``).

Activation memory is left as bf16 training keeps it (torchtitan's Table 1: 77.0 GiB compiled, 76.8
with Float8).
"""

from __future__ import annotations

from dataclasses import replace

from autoshard.cost.compute import PassTimes
from autoshard.cost.devices import Device
from autoshard.cost.fusion import view_sources
from autoshard.frontend.graph import NodeKind, OpGraph, OpNode, OpWork

RECIPES = ("tensorwise", "rowwise")
"""torchao's Float8 scaling recipes the model prices (``Float8LinearConfig.from_recipe_name``)."""
SKIPPED_MODULES = ("output", "lm_head")
"""Linears left in bf16: the projection to the vocabulary (torchtitan's ``filter_fqns``)."""
FLOAT8_DTYPE = "float8_e4m3fn"
FLOAT8_BYTES = 1
BF16_BYTES = 2

CAST_BYTES = {  # bytes per element: (forward, backward, amax pass fusable into the producer)
    "tensorwise": {"input": (2 + 4, 0, 2), "weight": (2 + 3, 3, 0), "grad_output": (0, 2 + 4, 2)},
    "rowwise": {"input": (5, 3, 2), "weight": (3, 4 + 3, 0), "grad_output": (0, 5 + 3, 2)},
}
"""torchao's roofline traffic per role and recipe (module doc); the last entry is what ``--compile``
saves by fusing the first read into the producing op."""


def float8_graph(graph: OpGraph, recipe: str) -> OpGraph:
    """``graph`` with each linear torchao converts marked (``work.float8``: the recipe, and whether
    its input's and output gradient's abs-max fuse into a compiled producer: the input's source op
    is fused (``cost/fusion.py``; run :func:`~autoshard.cost.fusion.compiled_graph` first), and
    for the gradient, some reader of the output is)."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown Float8 recipe {recipe!r}; use one of {', '.join(RECIPES)}")
    source = view_sources(graph)
    fused = {n.name for n in graph if n.work is not None and n.work.fused is not None}
    readers: dict[str, set[str]] = {}
    for node in graph:
        for src in node.inputs:
            readers.setdefault(source[src], set()).add(node.name)
    nodes = {}
    for node in graph:
        if converted(graph, node):
            marks = (recipe, source[node.inputs[0]] in fused, bool(readers.get(node.name, set()) & fused))
            node = replace(node, work=replace(node.work, float8=marks))
        nodes[node.name] = node
    return replace(graph, nodes=nodes)


def converted(graph: OpGraph, node: OpNode) -> bool:
    """Whether ``convert_to_float8_training`` (with torchtitan's filter) converts the linear ``node``."""
    if node.op != "linear" or node.work is None or len(node.inputs) < 2:
        return False
    weight = graph[node.inputs[1]]
    if weight.kind != NodeKind.PARAM or weight.tensor is None or len(weight.tensor.shape) != 2:
        return False
    module = node.module.rpartition(".")[2]
    return module not in SKIPPED_MODULES and all(d % 16 == 0 for d in weight.tensor.shape)


def compute_dtype(work: OpWork | None, dtype: str) -> str:
    """The dtype a linear's GEMMs run in: float8 where it is converted, else ``dtype``."""
    return FLOAT8_DTYPE if work is not None and work.float8 else dtype


def with_casts(times: PassTimes, work: OpWork | None, in_bytes: list[int], out_bytes: int,
               device: Device) -> PassTimes:
    """``times`` of a Float8 linear plus its scaling and cast kernels (module doc); others unchanged."""
    if work is None or not work.float8:
        return times
    recipe, input_fused, grad_fused = work.float8
    table = CAST_BYTES[recipe]
    forward = backward = 0.0
    for role, nbytes, fuses in (("input", in_bytes[0], input_fused), ("weight", in_bytes[1], False),
                                ("grad_output", out_bytes, grad_fused)):
        fwd, bwd, fusable = table[role]
        elements = nbytes / BF16_BYTES
        saved = fusable if fuses else 0
        forward += (fwd - (saved if fwd else 0)) * elements
        backward += (bwd - (saved if not fwd else 0)) * elements
    bandwidth = device.streaming_bandwidth
    return PassTimes(times.forward + forward / bandwidth, times.backward + backward / bandwidth)


def gather_itemsize(owner: OpNode, operand: int) -> int | None:
    """Bytes per element an FSDP all-gather of the owner's operand moves when it is a tensorwise
    Float8 linear's weight (cast before the gather); None otherwise."""
    return FLOAT8_BYTES if _tensorwise(owner) and operand == 1 else None


def activation_itemsize(linear: OpNode) -> int | None:
    """Bytes per element of the activation reshards around ``linear`` that move no partial sums,
    when torchao's Float8 tensor-parallel styles run it (``Float8ColwiseParallel``,
    ``Float8RowwiseParallel``, ``PrepareFloat8ModuleInput`` in torchao/float8/float8_tensor_parallel.py;
    torchtitan applies them to a tensorwise Float8 model): its input is cast to float8 (e4m3) before
    it is redistributed, and its output's gradient (e5m2, ``NoopFwToFloat8BwDynamic``, applied after
    the output's redistribute) before that redistribute's reverse. None for any other op. Partial
    sums (a row-parallel output's reduce-scatter, an input gradient's) are redistributed as computed,
    in bf16."""
    return FLOAT8_BYTES if _tensorwise(linear) else None


def _tensorwise(node: OpNode) -> bool:
    """Whether ``node`` is a linear converted to Float8 with tensorwise scaling."""
    work = node.work
    return work is not None and work.float8 is not None and work.float8[0] == "tensorwise"
