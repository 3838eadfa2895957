"""What resharding an activation on an edge allocates, as decisions of the problem.

Where a reader's layout ``b`` differs from its producer's ``a``, the runtime reshards into a new
buffer (``cost/reshard_memory.py``: the copy and the staging buffers of its collectives; a slice
too is copied). Two cases are charged, because their bytes depend on both ends of the edge:

- a partial sum (``a`` partial): every reader reduces it while it is still alive, so the
  reduction's buffers add to it during the reader's forward;
- a reader that saves the operand for backward: autograd keeps what the reader read, the copy
  from its forward (or, if its block is recomputed and it runs again, from its recomputation)
  to its backward, or with no reshard the producer's own output. For the producer's last keeper
  (``handed_savers``) that keeping is charged here too and taken off the producer's lifetime.

The memory rows are per node, so each such edge gets an auxiliary node ``C`` whose strategies are
``none`` (nothing charged: the producer's layout is none of those charged) and the keys
``(a, peak, kept, r)``: the buffers resharding ``a`` into some layout the reader may read, ``r``
whether the reader's block is recomputed. Two tie matrices keep ``C`` consistent with the
edge's ends, producer strategy ``i`` and reader strategy ``j``:

    tie(i, C) = 0  iff  C = none if out(i) is not charged, else C = (out(i), ...)
    tie(C, j) = 0  iff  C = none, or C = (a, copy(a, in_k(j)), recompute(j))

(``FORBIDDEN`` otherwise), so every feasible plan picks the one key of its two layouts, and
``C``'s items (one per window, the windows of ``_windows``) hold exactly what the edge allocates.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from autoshard.cost.lifetimes import Lifetimes
from autoshard.cost.memory import MemoryItem, local_bytes
from autoshard.cost.recompute import Blocks, value_windows
from autoshard.cost.reshard_memory import reshard_buffers
from autoshard.frontend.graph import NodeKind, OpGraph, TensorMeta
from autoshard.problem.candidates import Candidate
from autoshard.sharding.mesh import Mesh
from autoshard.sharding.reshard import reshard_steps
from autoshard.sharding.spec import TensorSpec
from autoshard.solver.model.problem import FORBIDDEN

Key = tuple[TensorSpec, int, int, bool] | None
"""A strategy of the copies' node: (producer layout, peak bytes, kept bytes, whether the reader's
block is recomputed), or None: nothing charged on this edge."""


@dataclass(frozen=True)
class ReshardCopies:
    """The auxiliary node of one edge whose copies are charged (module docstring)."""

    src: str
    dst: str
    operand: int
    keys: tuple[Key, ...]
    to_src: np.ndarray
    to_dst: np.ndarray
    items: tuple[MemoryItem, ...]

    @property
    def name(self) -> str:
        """The node's name in the problem."""
        return f"{self.dst}#copy{self.operand}"

    @property
    def intervals(self) -> tuple[tuple[int, int], ...]:
        """The distinct windows of its items, in order: one problem node each (``memory_nodes``)."""
        return tuple(dict.fromkeys(item.interval for item in self.items))

    def choose(self, src_strategy: int, dst_strategy: int) -> int:
        """The strategy the edge's ends leave this node (the one both ties allow)."""
        allowed = (self.to_src[src_strategy] == 0) & (self.to_dst[:, dst_strategy] == 0)
        return int(np.flatnonzero(allowed)[0])


NEGLIGIBLE = 0.01
"""Edges of tensors under this fraction of the graph's largest tensor get no copies' node: their
copies (norm statistics, rotary tables) cannot move a peak, and each node costs the solver."""


def negligible(graph: OpGraph) -> int:
    """Bytes below which a tensor's copies are not charged (``NEGLIGIBLE`` of the largest tensor)."""
    return int(NEGLIGIBLE * max((n.tensor.nbytes for n in graph if n.tensor is not None), default=0))


def handed_savers(graph: OpGraph, life: Lifetimes, blocks: Blocks, least: int) -> dict[str, tuple[str, int]]:
    """Op outputs whose last keeper is one reader that saves it (the saver with the latest backward,
    reading it, or a view of it of the same size, in one operand, in the producer's block or both
    in none; of ``least`` bytes or more): producer -> (reader, operand). Whether that reader keeps the output or a resharded
    copy of it depends on both layouts, so its copies' node charges the keeping (:func:`without_handed`)."""
    handed = {}
    for root, savers in life.savers.items():
        node = graph[root]
        if node.kind != NodeKind.OP or root in savers or life.base[root] != root or node.tensor is None:
            continue
        latest = min(savers, key=life.order.__getitem__)
        reads = [k for k, src in enumerate(graph[latest].inputs) if life.base.get(src) == root
                 and graph[src].tensor is not None and graph[src].tensor.numel == node.tensor.numel]
        same = blocks.block_of.get(root) == blocks.block_of.get(latest)
        if savers.count(latest) == 1 and len(reads) == 1 and same and node.tensor.nbytes >= least:
            handed[root] = (latest, reads[0])
    return handed


def without_handed(life: Lifetimes, handed: dict[str, tuple[str, int]]) -> Lifetimes:
    """``life`` with each handed output kept only by its other savers (its copies' node adds the rest)."""
    savers = dict(life.savers)
    value = dict(life.value)
    for root, (reader, _) in handed.items():
        rest = tuple(s for s in life.savers[root] if s != reader)
        savers[root] = rest
        value[root] = (value[root][0], max([life.read[root][1], *(life.backward(s) + 1 for s in rest)]))
    return replace(life, savers=savers, value=value)


def _copy(a: TensorSpec, b: TensorSpec, meta: TensorMeta, mesh: Mesh) -> tuple[int, int]:
    """(peak, kept) bytes of resharding a piece laid out ``a`` into layout ``b``."""
    if a == b:
        return 0, 0
    steps = reshard_steps(a, b, meta.shape, meta.itemsize, mesh.shape)
    return reshard_buffers(steps, local_bytes(a, meta, mesh), mesh.shape)


@dataclass(frozen=True)
class StepTimes:
    """The timeline the copies' windows are read from: the lifetimes with and without the handed
    savers (``life``, ``base``), the recomputable blocks, the handed savers, the views' spans
    (``lifetimes.view_spans``), the mesh, whether the step trains, and the bytes of the smallest
    tensor whose copies are charged (:func:`negligible`)."""

    life: Lifetimes
    base: Lifetimes
    blocks: Blocks
    handed: dict[str, tuple[str, int]]
    spans: dict[str, int]
    mesh: Mesh
    training: bool
    least: int = 0


_TIES: dict[tuple, tuple[tuple[Key, ...], np.ndarray, np.ndarray]] = {}
""":func:`_ties` per kind of edge and mesh, shared by identical edges (repeated layers) and by every
problem built in the process (pipeline stages): it depends on nothing else."""


def _ties(outs: list[TensorSpec | None], ins: tuple[TensorSpec, ...], flags: tuple[bool, ...],
          charged: set[TensorSpec], meta: TensorMeta, mesh: Mesh) -> tuple[tuple[Key, ...], np.ndarray, np.ndarray]:
    """The keys of an edge's copies' node and its ties to the producer's and the reader's strategies."""
    copies = {(a, b): _copy(a, b, meta, mesh) for a in charged for b in set(ins)
              if b is not None and b.partial <= a.partial}
    keys: list[Key] = [None] + sorted({(a, *copies[a, b], r) for a in charged for b, r in set(zip(ins, flags))
                                       if (a, b) in copies}, key=repr)
    position = {k: n for n, k in enumerate(keys)}
    to_src = np.full((len(outs), len(keys)), FORBIDDEN, dtype=np.int64)
    for i, a in enumerate(outs):
        to_src[i, [position[k] for k in keys[1:] if k[0] == a] if a in charged else 0] = 0
    to_dst = np.full((len(keys), len(ins)), FORBIDDEN, dtype=np.int64)
    to_dst[0, :] = 0
    for j, (b, r) in enumerate(zip(ins, flags)):
        for a in charged:
            if (a, b) in copies:
                to_dst[position[(a, *copies[a, b], r)], j] = 0
    to_src.flags.writeable = to_dst.flags.writeable = False
    return tuple(keys), to_src, to_dst


@dataclass(frozen=True)
class _Edge:
    """What decides the windows of one edge's copies (``view_end``: the reader is a view of the
    operand, so the copy lives as long as the view's storage is needed)."""

    root: str
    dst: str
    saves: bool
    reruns: bool
    handed: bool
    meta: TensorMeta
    view_end: int | None


def _windows(key: Key, edge: _Edge, times: StepTimes) -> dict[tuple[str, tuple[int, int]], int]:
    """Bytes per (what, window) that strategy ``key`` of an edge's copies' node holds: the reshard's
    buffers, or the producer's own output that the reader keeps (an ``activation``)."""
    if key is None:
        return {}
    life, base, blocks = times.life, times.base, times.blocks
    a, peak, kept, recomputed = key
    reader = edge.dst
    forward, back = life.forward_window(reader), life.backward(reader) + 1
    out: dict[tuple[str, tuple[int, int]], int] = {}

    def add(window: tuple[int, int], used: int, what: str = "reshard copy") -> None:
        if used and window[0] < window[1]:
            out[what, window] = out.get((what, window), 0) + used

    rerun = recomputed and edge.reruns
    again = blocks.recompute_start(life, reader) if recomputed else None
    if edge.view_end is not None:
        add(forward, peak - kept)
        add((forward[0], edge.view_end), kept)
    elif rerun:
        add(forward, peak)
        add((again, again + 1), peak - (kept if edge.saves else 0))
        if edge.saves:
            add((again, back), kept)
    else:
        add(forward, peak - (kept if edge.saves else 0))
        if edge.saves:
            add((forward[0], back), kept)
    if edge.handed and peak == 0:  # the reader keeps the producer's own output
        if recomputed and blocks.reruns(edge.root):  # the producer runs again: its windows once recomputed
            ends = [w[1] for w in value_windows(edge.root, base, blocks)] + [again]
        elif recomputed:  # a kept producer holds its output from its forward to the recomputation
            ends = [base.value[edge.root][1], blocks.recompute_start(life, edge.root) + 1]
        else:
            ends = [base.value[edge.root][1]]
        start = max(ends)
        add((start, back), local_bytes(a, edge.meta, times.mesh), "activation")
    return out
def reshard_copies(src: Candidate, dst: Candidate, operand: int, meta: TensorMeta,
                   times: StepTimes) -> ReshardCopies | None:
    """The copies' node of the edge ``src -> dst`` (operand ``operand``; an activation, or a parameter
    read by another op than its owner, whose copies ``cost/memory.param_items`` charges), or None when
    nothing is charged on it: the producer layouts charged are its partial ones, and all of them
    where the reader saves the operand for backward (it keeps a copy, or for a handed saver
    possibly the producer's own output, ``handed_savers``) or is a view of it."""
    reader, life, mesh = dst.node, times.life, times.mesh
    view = reader.work is not None and reader.work.alias_of == operand
    saves = times.training and reader.requires_grad and reader.work is not None and operand in reader.work.saved_operands
    if src.node.kind not in (NodeKind.OP, NodeKind.INPUT, NodeKind.PARAM):
        return None
    root = life.base[src.node.name]
    edge = _Edge(root, reader.name, saves, times.blocks.reruns(reader.name),
                 times.handed.get(root) == (reader.name, operand), meta,
                 times.spans.get(reader.name, life.order[reader.name] + 1) if view else None)
    outs = [s.out_spec if isinstance(s.out_spec, TensorSpec) else None for s in src.strategies]
    charged = {o for o in outs if o is not None and (saves or view or o.partial) and meta.nbytes >= times.least}
    if not charged:
        return None
    ins = tuple(s.in_specs[operand] for s in dst.strategies)
    flags = tuple(dst.recompute or [False] * len(ins))
    memo = (tuple(outs), ins, flags, meta, frozenset(charged), mesh)
    if memo not in _TIES:
        _TIES[memo] = _ties(outs, ins, flags, charged, meta, mesh)
    keys, to_src, to_dst = _TIES[memo]
    held = [_windows(k, edge, times) for k in keys]
    windows = sorted({w for h in held for w in h})
    items = [MemoryItem(reader.name, what, w, tuple(h.get((what, w), 0) for h in held)) for what, w in windows]
    if not items:
        return None
    return ReshardCopies(src.node.name, reader.name, operand, tuple(keys), to_src, to_dst, tuple(items))
