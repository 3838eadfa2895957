"""Attention split over one mesh axis by the sequence: what the plan chose, and what torch offers for it.

A plan may split an axis's layers over the sequence (the linears and norms on each rank's
sequence slice, their weights stored sharded and gathered) and then split attention one of two ways:

- **by heads** (Ulysses-style): all-to-alls trade the sequence split of the queries, keys and
  values for a split of their heads, attention runs whole per head, and an all-to-all trades back.
  PyTorch has no API for it; the export writes it for transformers' models (``lower.sequence``).
- **by query rows** (context parallelism, ``runtime/context.py`` for causal attention): each rank
  attends its rows to the keys and values it gathered. torch's ``context_parallel``
  (``torch.distributed.tensor.experimental``) is that choice, as ring attention, but in torch
  2.13 only over SDPA's CUDA kernels (flash, efficient, cuDNN: the CPU kernel has no sharding
  rule, so it cannot run on gloo), and it shards the sequence of the tensors it is handed, so the
  model must take every sequence-indexed tensor it reads (position ids, labels shifted for a
  next-token loss) as an input rather than compute it from the whole sequence.

:func:`attention_split` finds such a split on a 1-D view of the plan (``lower.project``) and says
what it is, for the export's note on the axis when it cannot write it (``lower.dtensor``).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoshard.frontend.graph import OpGraph
from autoshard.lower.tp_styles import sharded_dims
from autoshard.problem.plan import Plan
from autoshard.sharding.reshard import ALL_TO_ALL
from autoshard.sharding.spec import TensorSpec

SDPA = "scaled_dot_product_attention"
RING = "only over SDPA's CUDA kernels and only for a model taking its position ids and shifted labels as inputs"


def cuts(spec: TensorSpec | None, dim: int) -> bool:
    """The 1-D spec cuts tensor dim ``dim`` (negative from the last; False past its dims)."""
    return spec is not None and -spec.ndim <= dim < spec.ndim and bool(spec.dims[dim])


@dataclass(frozen=True)
class AttentionSplit:
    """How an axis splits attention (``ROWS`` or ``HEADS``), the module holding it, and the choice in words."""

    kind: str
    module: str
    description: str


ROWS, HEADS = "rows", "heads"


def attention_split(view: Plan, graph: OpGraph, dependent: frozenset[str]) -> AttentionSplit | None:
    """The split, when the 1-D ``view`` splits attention (fused, or its softmax written out) by query
    rows, or by heads with all-to-alls into it (module doc); None when it does neither.
    ``dependent``: the nodes that depend on a parameter (``project.parameter_dependent``)."""
    by_heads: dict[str, str] = {}
    for node in graph:
        place = view.nodes.get(node.name)
        if node.name not in dependent or place is None or node.op not in (SDPA, "softmax"):
            continue
        if node.op == SDPA and cuts(place.in_specs[0], -2):
            return AttentionSplit(ROWS, node.module, (
                f"it splits attention {node.name} ({node.module or 'the root'}) by query rows, the keys and "
                f"values gathered, which torch's context_parallel runs {RING} (it shards the sequence of the "
                "tensors it is handed)"))
        if cuts(place.in_specs[0], 1):
            by_heads.setdefault(node.module, node.name)
    for edge in view.edges:
        dst = graph[edge.dst]
        if edge.src in dependent and dst.module in by_heads and any(step.kind == ALL_TO_ALL for step in edge.steps):
            before, after = sharded_dims(edge.src_spec), sharded_dims(edge.dst_spec)
            return AttentionSplit(HEADS, dst.module, (
                f"it splits attention {by_heads[dst.module]} ({dst.module}) by heads through all-to-alls from the "
                f"layers' sequence slices (Ulysses-style: the first moves the split of {edge.src} from dim "
                f"{before[0] if before else '-'} to dim {after[0] if after else '-'} for {dst.name} ({dst.op})), "
                f"where torch's context_parallel would split it by query rows (ring attention, {RING})"))
    return None
