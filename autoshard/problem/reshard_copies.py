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
``C``'s items hold exactly what the edge allocates: one per window, each key's bytes in it.

Shared across identical layers (``CopiesBuilder``): key ``k``'s bytes in window ``w`` are

    usage_k(w) = sum of column_s[k] over the slots s with window_s = w  (w nonempty)

where a slot's column (:func:`_slot_bytes`) reads only the keys, the tensor, the mesh and whether
the reader saves the operand, reruns, is a view or is the handed saver, and its window
(:func:`_slot_windows`) only the edge's times. Twins share the first (computed once per kind of
edge) and place it in their own windows.
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
from autoshard.problem.edges import recent_steps
from autoshard.sharding.mesh import Mesh
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


_COPIES: dict[tuple, tuple[int, int]] = {}
""":func:`_copy` per (layouts, shape, itemsize, mesh shape), for every build in the process: it reads nothing else."""


def _copy(a: TensorSpec, b: TensorSpec, meta: TensorMeta, mesh: Mesh) -> tuple[int, int]:
    """(peak, kept) bytes of resharding a piece laid out ``a`` into layout ``b``."""
    if a == b:
        return 0, 0
    key = (a, b, meta.shape, meta.itemsize, mesh.shape)
    if key not in _COPIES:
        steps = recent_steps(a, b, meta.shape, meta.itemsize, mesh.shape)  # the edge's prices just made them
        _COPIES[key] = reshard_buffers(steps, local_bytes(a, meta, mesh), mesh.shape)
    return _COPIES[key]


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
    of_layout: dict[TensorSpec, list[int]] = {}
    for n, k in enumerate(keys[1:], 1):
        of_layout.setdefault(k[0], []).append(n)
    to_src = np.full((len(outs), len(keys)), FORBIDDEN, dtype=np.int64)
    for i, a in enumerate(outs):
        to_src[i, of_layout.get(a, []) if a in charged else 0] = 0
    read: dict[tuple[TensorSpec, bool], list[int]] = {}  # the keys a reader layout and flag allow
    for b, r in set(zip(ins, flags)):
        read[b, r] = [position[(a, *copies[a, b], r)] for a in charged if (a, b) in copies]
    to_dst = np.full((len(keys), len(ins)), FORBIDDEN, dtype=np.int64)
    to_dst[0, :] = 0
    for j, (b, r) in enumerate(zip(ins, flags)):
        to_dst[read[b, r], j] = 0
    to_src.flags.writeable = to_dst.flags.writeable = False
    return tuple(keys), to_src, to_dst


COPY, ACTIVATION = "reshard copy", "activation"
"""The two kinds of bytes a copies' node holds: the reshard's buffers, and the producer's own output
that a handed saver keeps."""

Slot = tuple[str, str]
"""(what, where): one of the windows an edge's copies may hold bytes in (:func:`_slot_bytes`)."""


@dataclass(frozen=True)
class _Kind:
    """An edge's copies as its twins in identical layers share them: the keys and ties of its node
    and the bytes per key in each slot (``columns``, a slot listed only where some key holds bytes
    in it); ``held`` keeps alive the lists whose identities key it (``CopiesBuilder.kinds``)."""

    keys: tuple[Key, ...]
    to_src: np.ndarray
    to_dst: np.ndarray
    columns: dict[Slot, tuple[int, ...]]
    held: tuple[object, ...]


def _slot_bytes(keys: tuple[Key, ...], saves: bool, reruns: bool, handed: bool, view: bool, meta: TensorMeta,
                mesh: Mesh) -> dict[Slot, tuple[int, ...]]:
    """Bytes per key of an edge's copies in each slot. For key ``(a, peak, kept, r)`` (module doc):

    - the reader is a view: ``peak - kept`` in its forward, ``kept`` from it to the view's end;
    - else, ``r`` and the reader runs again: ``peak`` in its forward, ``peak - kept·saves`` at the
      recomputation, and ``kept·saves`` from the recomputation to the reader's backward;
    - else: ``peak - kept·saves`` in its forward, ``kept·saves`` from it to the reader's backward;
    - a handed saver whose copy is none (``peak`` = 0) keeps the producer's output, ``a``'s local
      bytes, from the producer's last use to the reader's backward (its start depends on ``r``)."""
    columns: dict[Slot, list[int]] = {}

    def add(slot: Slot, k: int, used: int) -> None:
        column = columns.get(slot)
        if column is None:
            column = columns[slot] = [0] * len(keys)
        column[k] += used

    for k, key in enumerate(keys):
        if key is None:
            continue
        a, peak, kept, recomputed = key
        held = kept if saves else 0
        if view:
            add((COPY, "forward"), k, peak - kept)
            add((COPY, "view"), k, kept)
        elif recomputed and reruns:
            add((COPY, "forward"), k, peak)
            add((COPY, "again"), k, peak - held)
            add((COPY, "again to backward"), k, held)
        else:
            add((COPY, "forward"), k, peak - held)
            add((COPY, "forward to backward"), k, held)
        if handed and peak == 0:
            add((ACTIVATION, "recomputed producer" if recomputed else "producer"), k, local_bytes(a, meta, mesh))
    return {slot: tuple(column) for slot, column in columns.items() if any(column)}


def _slot_windows(slots: list[Slot], reader: str, root: str, view_end: int | None,
                  times: StepTimes) -> dict[Slot, tuple[int, int]]:
    """The window of each of ``slots`` on one edge (reader ``reader``, producer's base ``root``)."""
    life, base, blocks = times.life, times.base, times.blocks
    forward, back = life.forward_window(reader), life.backward(reader) + 1
    where = {s for _, s in slots}
    again = blocks.recompute_start(life, reader) if where & {"again", "again to backward", "recomputed producer"} \
        else None
    windows = {"forward": forward, "forward to backward": (forward[0], back)}
    if view_end is not None:
        windows["view"] = (forward[0], view_end)
    if again is not None:
        windows |= {"again": (again, again + 1), "again to backward": (again, back)}
    if "producer" in where:
        windows["producer"] = (base.value[root][1], back)
    if "recomputed producer" in where:
        if blocks.reruns(root):  # the producer runs again: its windows once recomputed
            ends = [w[1] for w in value_windows(root, base, blocks)] + [again]
        else:  # a kept producer holds its output from its forward to the recomputation
            ends = [base.value[root][1], blocks.recompute_start(life, root) + 1]
        windows["recomputed producer"] = (max(ends), back)
    return {slot: windows[slot[1]] for slot in slots}


class CopiesBuilder:
    """The copies' nodes of one build's edges. An edge's keys, ties and bytes per slot (``_Kind``)
    read only its ends' strategy lists, the reader's recompute flags, the operand, the tensor, the
    mesh and four flags of the edge, so twins (the same edge in identical layers, whose candidates
    share those lists) compute them once; each edge then only places the slots in its own windows
    (:func:`_slot_windows`), adding up slots that fall in one window and dropping empty windows."""

    def __init__(self, times: StepTimes) -> None:
        self.times = times
        self.kinds: dict[tuple, _Kind | None] = {}
        self.sums: dict[tuple, tuple[int, ...]] = {}

    def copies(self, src: Candidate, dst: Candidate, operand: int, meta: TensorMeta) -> ReshardCopies | None:
        """The copies' node of the edge ``src -> dst`` (operand ``operand``; an activation, or a
        parameter read by another op than its owner, whose copies ``cost/memory.param_items``
        charges), or None when nothing is charged on it: the producer layouts charged are its
        partial ones, and all of them where the reader saves the operand for backward (it keeps a
        copy, or for a handed saver possibly the producer's own output, ``handed_savers``) or is a
        view of it."""
        times, reader = self.times, dst.node
        if src.node.kind not in (NodeKind.OP, NodeKind.INPUT, NodeKind.PARAM):
            return None
        view = reader.work is not None and reader.work.alias_of == operand
        saves = times.training and reader.requires_grad and reader.work is not None \
            and operand in reader.work.saved_operands
        root = times.life.base[src.node.name]
        reruns, handed = times.blocks.reruns(reader.name), times.handed.get(root) == (reader.name, operand)
        memo = (id(src.strategies), id(dst.strategies), id(dst.recompute), operand, meta, saves, view, reruns, handed)
        if memo not in self.kinds:
            self.kinds[memo] = self._kind(src, dst, operand, meta, saves, view, reruns, handed)
        kind = self.kinds[memo]
        if kind is None:
            return None
        view_end = times.spans.get(reader.name, times.life.order[reader.name] + 1) if view else None
        windows = _slot_windows(list(kind.columns), reader.name, root, view_end, times)
        merged: dict[tuple[str, tuple[int, int]], list[Slot]] = {}
        for slot, window in windows.items():
            if window[0] < window[1]:
                merged.setdefault((slot[0], window), []).append(slot)
        if not merged:
            return None
        items = tuple(MemoryItem(reader.name, what, window, self._usage(memo, kind, merged[what, window]))
                      for what, window in sorted(merged))
        return ReshardCopies(src.node.name, reader.name, operand, kind.keys, kind.to_src, kind.to_dst, items)

    def _usage(self, memo: tuple, kind: _Kind, slots: list[Slot]) -> tuple[int, ...]:
        """Bytes per key of the slots that share one window (each one a slot's own column)."""
        if len(slots) == 1:
            return kind.columns[slots[0]]
        key = (memo, tuple(slots))
        if key not in self.sums:
            self.sums[key] = tuple(map(sum, zip(*(kind.columns[s] for s in slots))))
        return self.sums[key]

    def _kind(self, src: Candidate, dst: Candidate, operand: int, meta: TensorMeta, saves: bool, view: bool,
              reruns: bool, handed: bool) -> _Kind | None:
        times, mesh = self.times, self.times.mesh
        outs = [s.out_spec if isinstance(s.out_spec, TensorSpec) else None for s in src.strategies]
        charged = {o for o in outs if o is not None and (saves or view or o.partial) and meta.nbytes >= times.least}
        if not charged:
            return None
        ins = tuple(s.in_specs[operand] for s in dst.strategies)
        flags = tuple(dst.recompute or [False] * len(ins))
        shared = (tuple(outs), ins, flags, meta, frozenset(charged), mesh)
        if shared not in _TIES:
            _TIES[shared] = _ties(outs, ins, flags, charged, meta, mesh)
        keys, to_src, to_dst = _TIES[shared]
        columns = _slot_bytes(keys, saves, reruns, handed, view, meta, mesh)
        return _Kind(keys, to_src, to_dst, columns, (src.strategies, dst.strategies, dst.recompute))
