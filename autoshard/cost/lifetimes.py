"""When each tensor of a traced model is alive during one step, from what autograd saves.

The step is a timeline of ``2T + 1`` slots for a graph of ``T`` nodes: node at forward position
``t`` runs forward at ``t`` and backward at ``B(t) = 2T - 1 - t`` (autograd walks the graph in
reverse), and the optimizer step runs at ``2T``. Intervals are half-open ``[start, end)``.

- A view (``OpWork.alias_of``) shares its base's storage: it holds no memory of its own, and its
  uses and its being saved keep the base alive.
- Inference: a tensor lives from its producer to its last reader.
- Training: a tensor that autograd saves (its producer saves its output, or a reader saves it
  as an operand, ``OpWork.saves_output`` / ``saved_operands``) lives until the backward of the
  earliest-in-forward saver (``value``); the others die after their last forward reader
  (``read``), as does a partial sum, which every reader reshards before reading (the reader then
  saves its own copy). Its gradient lives
  from the backward of its last reader, views included (the first gradient contribution), to
  its producer's backward.

Pure functions of the graph (no torch): the memory model (``cost/memory.py``) turns these
intervals and the per-strategy byte counts into the problem's memory items.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoshard.frontend.graph import NodeKind, OpGraph, OpNode


@dataclass(frozen=True)
class Lifetimes:
    """Forward positions, aliases and per-tensor intervals of one graph and mode."""

    order: dict[str, int]
    horizon: int
    base: dict[str, str]
    value: dict[str, tuple[int, int]]
    read: dict[str, tuple[int, int]]
    gradient: dict[str, tuple[int, int]]
    first_reader: dict[str, str]
    last_reader: dict[str, str]
    savers: dict[str, tuple[str, ...]]

    @property
    def end(self) -> int:
        """One past the optimizer step: the end of whole-step intervals."""
        return 2 * self.horizon + 1

    def backward(self, name: str) -> int:
        """The time slot of node ``name``'s backward."""
        return 2 * self.horizon - 1 - self.order[name]

    def forward_window(self, name: str) -> tuple[int, int]:
        """The slot of node ``name``'s forward."""
        t = self.order[name]
        return t, t + 1

    def saved_window(self, name: str) -> tuple[int, int]:
        """From node ``name``'s forward to the end of its backward (what it saves lives this long)."""
        return self.order[name], self.backward(name) + 1

    def backward_window(self, name: str) -> tuple[int, int]:
        """The slot of node ``name``'s backward."""
        b = self.backward(name)
        return b, b + 1


def alias_base(graph: OpGraph, node: OpNode) -> str:
    """The node whose storage ``node``'s output lives in (itself unless it is a view)."""
    while node.work is not None and node.work.alias_of is not None and node.work.alias_of < len(node.inputs):
        source = graph[node.inputs[node.work.alias_of]]
        if source.kind not in (NodeKind.OP, NodeKind.INPUT, NodeKind.PARAM, NodeKind.BUFFER):
            break
        node = source
    return node.name


def _runs_backward(node: OpNode) -> bool:
    return node.kind == NodeKind.OP and node.requires_grad


def lifetimes(graph: OpGraph, training: bool) -> Lifetimes:
    """Intervals of every tensor's value (and, in training, its gradient) on the step timeline."""
    order = {node.name: t for t, node in enumerate(graph)}
    horizon = len(order)
    base = {node.name: alias_base(graph, node) for node in graph}
    last_use = {name: order[name] for name in order}
    first_reader: dict[str, str] = {}
    last_reader: dict[str, str] = {}
    kept_until: dict[str, int] = {}
    savers: dict[str, list[str]] = {}
    for node in graph:
        t = order[node.name]
        for k, src in enumerate(node.inputs):
            if src not in base:
                continue
            root = base[src]
            last_use[root] = max(last_use[root], t)
            first_reader.setdefault(src, node.name)
            last_reader[src] = node.name
            if training and _runs_backward(node) and node.work is not None and k in node.work.saved_operands:
                kept_until[root] = max(kept_until.get(root, 0), 2 * horizon - t)
                savers.setdefault(root, []).append(node.name)
        if training and _runs_backward(node) and node.work is not None and node.work.saves_output:
            root = base[node.name]
            kept_until[root] = max(kept_until.get(root, 0), 2 * horizon - t)
            savers.setdefault(root, []).append(node.name)
    value: dict[str, tuple[int, int]] = {}
    read: dict[str, tuple[int, int]] = {}
    gradient: dict[str, tuple[int, int]] = {}
    for node in graph:
        name = node.name
        start, end = order[name], max(last_use[name] + 1, kept_until.get(name, 0))
        value[name] = (start, end)
        read[name] = (start, last_use[name] + 1)
        if training and node.requires_grad and base[name] == name and last_use[name] > order[name]:
            gradient[name] = (2 * horizon - 1 - last_use[name], 2 * horizon - order[name])
    return Lifetimes(order, horizon, base, value, read, gradient, first_reader, last_reader,
                     {root: tuple(names) for root, names in savers.items()})


def view_spans(graph: OpGraph, life: Lifetimes, training: bool) -> dict[str, int]:
    """For each view: one past the last slot its storage is needed through it, by its own readers
    and those of the views of it, and (training) until the backward of those that save it."""
    spans: dict[str, int] = {}
    for node in graph:
        t = life.order[node.name]
        saved = node.work.saved_operands if training and _runs_backward(node) and node.work is not None else ()
        for k, src in enumerate(node.inputs):
            end = 2 * life.horizon - t if k in saved else t + 1
            view = src
            while life.base.get(view, view) != view:  # up the chain ``alias_base`` followed
                spans[view] = max(spans.get(view, life.order[view] + 1), end)
                view = graph[view].inputs[graph[view].work.alias_of]
    return spans
