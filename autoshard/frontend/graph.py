"""The traced model as plain data: ops with tensor metadata and module paths (no torch types).

The frontend (``autoshard.frontend``) fills it from torch.fx or torch.export; the problem builder
reads it; the runtime executes ``OpGraph.module`` node by node using the same node names.

Conventions every producer of an OpGraph keeps:

- ``nodes`` is in topological order and names are the fx node names.
- ``OpNode.op`` is the ATen overload-packet name (``linear``, ``add``, ``view``, ``softmax``,
  ``scaled_dot_product_attention``, ``getitem`` ...) whichever frontend traced the model, or
  ``None`` when the call has no ATen equivalent the frontend knows.
- ``OpNode.inputs`` lists the producers of the tensor operands in ATen schema order (for
  ``embedding`` that is weight, then indices), and ``OpNode.attrs`` holds the non-tensor
  arguments by ATen schema name (``dim``, ``keepdim``, ``size``, ``dim0``, ``normalized_shape``).
"""

from __future__ import annotations

import hashlib

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterator

import networkx as nx

EXPERTS_OP = "moe_experts"
"""The op name of a fused mixture-of-experts node (frontend/experts.py; its rule is ``[moe_experts]``
in specs/ops.toml)."""

RECEIVED = "received"
"""``OpNode.attrs`` key of a pipeline stage's input that an earlier stage sends it point to point
(autoshard/pipeline/stages.py): held in the layout the stage reads it in, its gradient sent back."""


@dataclass(frozen=True)
class TensorMeta:
    """Global shape and dtype of one tensor."""

    shape: tuple[int, ...]
    dtype: str
    itemsize: int

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self.numel * self.itemsize

    @property
    def is_float(self) -> bool:
        """True for floating-point dtypes (the ones that carry gradients)."""
        return self.dtype.startswith(("float", "bfloat", "complex"))


class NodeKind(str, Enum):
    """What a graph node stands for."""

    INPUT = "input"
    PARAM = "param"
    BUFFER = "buffer"
    OP = "op"
    OUTPUT = "output"


@dataclass(frozen=True)
class OpWork:
    """What torch itself says one op costs, measured once at global shapes by the frontend.

    ``flops`` and ``backward_flops`` come from ``torch.utils.flop_counter`` (the op, then the
    gradients of the operands that require grad, replayed on the meta device);
    ``saved_operands`` / ``saves_output`` / ``saved_other_bytes`` are what autograd keeps for
    backward (saved-tensor hooks on fake CPU tensors, where fused attention keeps only its
    log-sum-exp as on a GPU); ``alias_of`` is the operand whose storage the output shares (a
    view); ``temporary_bytes`` are allocations freed before the op returns, and
    ``backward_temporary_bytes`` those its backward frees before it returns (beyond the operand
    gradients it produces: cross-entropy's backward holds two logits-sized buffers). ``measured`` is
    False when the op could not be replayed (data-dependent shapes): then nothing is known.
    ``fused``: under torch.compile, the op is fused with its neighbours (``cost/fusion.py``):
    (whether each operand is read from memory, whether the output is written to it). ``float8``:
    the op is a linear torchao's Float8 training runs (``cost/float8.py``): (scaling recipe, whether
    its input's and its output gradient's scaling fuse into the compiled kernels producing them).
    """

    flops: int = 0
    backward_flops: int = 0
    saved_operands: tuple[int, ...] = ()
    saves_output: bool = False
    saved_other_bytes: int = 0
    alias_of: int | None = None
    temporary_bytes: int = 0
    backward_temporary_bytes: int = 0
    measured: bool = True
    fused: tuple[tuple[bool, ...], bool] | None = None
    float8: tuple[str, bool, bool] | None = None


@dataclass
class OpNode:
    """One traced node: a model input, a parameter or buffer, an op, or the output.

    ``requires_grad``: a parameter's own flag; for an op, whether its output receives a gradient
    when the outputs are differentiated. ``no_grad_operands``: operands whose producer requires
    grad but through which no gradient flows (read for their shape only, or feeding nothing
    differentiated); their edges have no backward reshard.
    """

    name: str
    kind: NodeKind
    target: str
    op: str | None = None
    inputs: tuple[str, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    out: TensorMeta | tuple[TensorMeta | None, ...] | None = None
    module: str = ""
    qualname: str = ""
    requires_grad: bool = False
    work: OpWork | None = None
    no_grad_operands: frozenset[int] = frozenset()

    @property
    def tensor(self) -> TensorMeta | None:
        """The single output tensor, or None for tuple/None outputs."""
        return self.out if isinstance(self.out, TensorMeta) else None


@dataclass
class OpGraph:
    """Nodes in topological order plus the executable module they were traced from.

    ``frontend`` is the tracer that produced it (``fx`` or ``export``); ``frontend_note`` says why,
    when it was not the first choice (``auto`` fell back to export: why torch.fx failed).
    """

    nodes: dict[str, OpNode]
    frontend: str
    module: Any = None
    frontend_note: str = ""

    def __iter__(self) -> Iterator[OpNode]:
        return iter(self.nodes.values())

    def __getitem__(self, name: str) -> OpNode:
        return self.nodes[name]

    def __len__(self) -> int:
        return len(self.nodes)

    def users(self, name: str) -> list[OpNode]:
        """Nodes that consume ``name`` (each once, in topological order)."""
        return [n for n in self.nodes.values() if name in n.inputs]

    def gradient_flows(self, node: OpNode, operand: int, meta: TensorMeta) -> bool:
        """Whether training sends a gradient back along operand ``operand`` (of tensor ``meta``) of
        ``node``: its producer requires grad, it is floating point, and autograd sends one through
        that operand (``no_grad_operands``, frontend/gradients.py). The planner charges backward
        steps on exactly these edges, and the plan check expects them there."""
        return self[node.inputs[operand]].requires_grad and meta.is_float and operand not in node.no_grad_operands

    def to_networkx(self) -> nx.MultiDiGraph:
        """Dataflow graph: one edge per (producer, consumer operand), keyed by operand index."""
        g = nx.MultiDiGraph()
        for node in self.nodes.values():
            g.add_node(node.name, node=node)
        for node in self.nodes.values():
            for index, src in enumerate(node.inputs):
                g.add_edge(src, node.name, key=index, operand=index)
        return g


def graph_signature(graph: OpGraph) -> list[str]:
    """One ``name:op:shape`` line per node: what a plan is valid for (hashed by :func:`fingerprint`).

    A frozen parameter's op is ``frozen``: a plan made with it frozen has no gradient steps for it.
    """
    ops = {n.name: "frozen" if n.kind == NodeKind.PARAM and not n.requires_grad else n.op for n in graph}
    return [f"{n.name}:{ops[n.name]}:{getattr(n.tensor, 'shape', None)}" for n in graph]


def fingerprint(graph: OpGraph) -> str:
    """A short hash of the graph's node names, ops and shapes: plans are only valid for one model."""
    return hashlib.sha256(";".join(graph_signature(graph)).encode()).hexdigest()[:16]
