"""Trace a model of many identical layers by tracing three and replicating the last (``trace_replicated``).

A model whose forward runs a ``ModuleList`` of ``L`` identical blocks (same class, same parameter
and buffer shapes) is traced with the list cut to its first :data:`TEMPLATE` blocks; the traced
graph's last block (``k = TEMPLATE - 1``, whose entry operands come from block ``k - 1`` exactly as
block ``i``'s come from block ``i - 1``) is then copied for blocks ``k + 1 .. L - 1``, and the ops
after the blocks (the head, the loss) read the last copy. This is the graph a full trace gives,
because tracing is deterministic per block: block ``i`` of a full trace equals block ``k`` with

- operands: inside the block at the same position, from block ``i - 1`` at the same position as
  block ``k`` reads block ``k - 1``, outside all blocks at the same node;
- names: each run of digits in which block ``k - 1`` and block ``k`` differ moves on by its
  step per block (``linear_10 -> linear_17``, ``layers_2_w1_weight -> layers_3_w1_weight``: fx and
  torch.export count names per base), and the names after the blocks move on by their base's step;
- module paths, targets and qualified names: ``container.k`` read as ``container.i``;
- shapes, attributes, torch's measured work and gradient flags: unchanged.

Two traced blocks differ from each other only in those respects (``sharding.layers`` checks the
rest), and ``tests/frontend/test_replicate.py`` checks the whole graph against a full trace.
When a model does not have this shape (no such list, blocks configured differently, blocks that
trace differently, ops after the blocks that read an earlier block), the model is traced whole.
Assumed, not checkable without tracing: the forward treats every block alike but for the block's
own attributes (no ``if i == 40`` in the loop over the blocks).

The graph's ``module`` is the cut model's traced module: it replays every node's call (the copied
blocks' ops with their block's call, their parameters fetched from the whole model), which is
what planning reads; running the model itself takes :func:`autoshard.frontend.trace.trace`.
"""

from __future__ import annotations

import contextlib
import operator
import re
from dataclasses import replace
from typing import Iterator

import torch
from torch import nn

from autoshard.frontend.call import NODE_CALLS_KEY, NodeCall
from autoshard.frontend.graph import NodeKind, OpGraph, OpNode
from autoshard.frontend.trace import trace
from autoshard.sharding.layers import find_repeated_layers

TEMPLATE = 3
"""Blocks traced: block 0 may differ in names (its entry reads the embedding), blocks 1 and 2 give each
name's step per block."""

_DIGITS = re.compile(r"\d+")
_COUNTED = re.compile(r"^(?P<base>.*?)(?:_(?P<count>\d+))?$")


def trace_replicated(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], frontend: str = "auto") -> OpGraph:
    """The model's OpGraph as a full trace gives it, traced over :data:`TEMPLATE` of its identical
    blocks and replicated (the whole model traced where it has no such blocks)."""
    found = repeated_blocks(model)
    if found is None:
        return trace(model, example_inputs, frontend)
    path, count = found
    with _cut_to(model, path, TEMPLATE):
        small = trace(model, example_inputs, frontend)
    graph = replicate(small, model, path, count)
    return graph if graph is not None else trace(model, example_inputs, frontend)


def repeated_blocks(model: nn.Module) -> tuple[str, int] | None:
    """The path and length of the longest ``ModuleList`` of more than :data:`TEMPLATE` identical blocks."""
    best: tuple[str, int] | None = None
    for path, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > TEMPLATE and _alike(list(module)):
            if best is None or len(module) > best[1]:
                best = (path, len(module))
    return best


def _alike(blocks: list[nn.Module]) -> bool:
    """Same class, the same named parameters and buffers (shape, dtype, whether trained), and the same
    plain attributes in every submodule, but for those that already differ between the last two
    traced blocks (a layer index): a block that alone attends through a sliding window, or is
    configured otherwise, would trace otherwise than the block copied for it."""
    def shape(block: nn.Module) -> tuple:
        state = [(n, tuple(t.shape), t.dtype, t.requires_grad) for n, t in block.named_parameters()]
        return type(block), tuple(state), tuple((n, tuple(t.shape), t.dtype) for n, t in block.named_buffers())
    first = shape(blocks[0])
    if any(shape(b) != first for b in blocks[1:]):
        return False
    settings = [_settings(b) for b in blocks]
    indexed = {k for k in settings[TEMPLATE - 1] if settings[TEMPLATE - 1][k] != settings[TEMPLATE - 2].get(k)}
    copied = {k: v for k, v in settings[TEMPLATE - 1].items() if k not in indexed}
    return all({k: v for k, v in later.items() if k not in indexed} == copied for later in settings[TEMPLATE:])


def _settings(block: nn.Module) -> dict[str, object]:
    """Every plain attribute (numbers, strings, flags, None, tuples of them) of the block and its
    submodules, by dotted name: what a forward may branch on."""
    plain = (bool, int, float, str, type(None))
    found: dict[str, object] = {}
    for path, module in block.named_modules():
        for key, value in vars(module).items():
            if isinstance(value, plain) or isinstance(value, tuple) and all(isinstance(v, plain) for v in value):
                found[f"{path}.{key}"] = value
    return found


@contextlib.contextmanager
def _cut_to(model: nn.Module, path: str, keep: int) -> Iterator[None]:
    """Run with the ``ModuleList`` at ``path`` holding only its first ``keep`` blocks."""
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path)
    whole = parent._modules[name]
    parent._modules[name] = nn.ModuleList(list(whole)[:keep])
    try:
        yield
    finally:
        parent._modules[name] = whole


def replicate(small: OpGraph, model: nn.Module, path: str, count: int) -> OpGraph | None:
    """``small`` (traced with :data:`TEMPLATE` blocks of the list at ``path``) with its last block
    copied up to ``count`` blocks, or None when ``small`` does not have the shape copying needs."""
    layers = find_repeated_layers(small)
    if layers is None or layers.count != TEMPLATE or not _is_container(layers.container, path):
        return None
    order = list(small.nodes)
    index = {name: k for k, name in enumerate(order)}
    previous, template = layers.layers[-2], layers.layers[-1]
    start, end = index[template[0]], index[template[-1]]
    if [order[k] for k in range(start, end + 1)] != list(template):
        return None  # another node inside the last block's span: not a block alone
    before = set(order[:start])
    after = order[end + 1:]
    if any(src in before and src in layers.nodes for name in after for src in small[name].inputs):
        return None  # the ops after the blocks read an earlier block than the last
    steps = _name_steps(previous, template)
    if steps is None:
        return None
    base_steps = _base_steps(previous, template)
    position = {name: p for p, name in enumerate(template)}
    back = {name: p for p, name in enumerate(previous)}
    last = TEMPLATE - 1
    names = {i: [_advance(name, step, i - last) for name, step in zip(template, steps)] for i in range(last, count)}
    traced: dict[str, NodeCall] = small.module.meta[NODE_CALLS_KEY]
    old_path = f"{layers.container}.{last}"
    nodes = {name: small[name] for name in order[:end + 1]}
    calls = {name: traced[name] for name in nodes if name in traced}
    for i in range(last + 1, count):
        for p, name in enumerate(template):
            node = small[name]
            inputs = tuple(names[i][position[s]] if s in position else names[i - 1][back[s]] if s in back else s
                           for s in node.inputs)
            copy = _moved(node, names[i][p], inputs, old_path, f"{layers.container}.{i}")
            nodes[copy.name] = copy
            if name in traced:
                own_state = node.kind != NodeKind.OP and copy.target != node.target  # this block's own tensor
                calls[copy.name] = NodeCall(operator.attrgetter(copy.target), (model,)) if own_state else traced[name]
    tail = {name: _shift(name, base_steps, count - TEMPLATE) for name in after}
    final = {name: names[count - 1][p] for name, p in position.items()}
    for name in after:
        node = small[name]
        moved = replace(node, name=tail[name], inputs=tuple(final.get(s, tail.get(s, s)) for s in node.inputs))
        nodes[moved.name] = moved
        if name in traced:
            calls[moved.name] = traced[name]
    if len(nodes) != len(order) + (count - TEMPLATE) * len(template):
        return None  # two names met: the naming is not the counting this module assumes
    small.module.meta[NODE_CALLS_KEY] = calls
    return OpGraph(nodes, small.frontend, small.module, small.frontend_note)


def _is_container(container: str, path: str) -> bool:
    """The traced blocks are the list at ``path`` (``model.layers``; export may prefix nothing more)."""
    return container == path or container.endswith("." + path) or path.endswith("." + container)


def _name_steps(previous: tuple[str, ...], template: tuple[str, ...]) -> list[tuple[int, ...]] | None:
    """Per node of the block, each digit run's step from block ``k - 1`` to block ``k`` (0 where equal),
    or None where the two names differ in more than their digits."""
    steps = []
    for a, b in zip(previous, template):
        if _DIGITS.split(a) != _DIGITS.split(b):
            return None
        step = tuple(int(y) - int(x) for x, y in zip(_DIGITS.findall(a), _DIGITS.findall(b)))
        if any(s < 0 for s in step):
            return None
        steps.append(step)
    return steps


def _advance(name: str, step: tuple[int, ...], blocks: int) -> str:
    """``name`` with each digit run moved on by ``blocks`` times its step."""
    runs = iter(step)
    return _DIGITS.sub(lambda m: str(int(m.group()) + blocks * next(runs)), name)


def _base_steps(previous: tuple[str, ...], template: tuple[str, ...]) -> dict[str, int]:
    """Per counted base name (``linear`` of ``linear_17``), how far its count moves per block."""
    steps: dict[str, int] = {}
    for a, b in zip(previous, template):
        x, y = _COUNTED.match(a), _COUNTED.match(b)
        if x["base"] == y["base"]:
            steps[x["base"]] = int(y["count"] or 0) - int(x["count"] or 0)
    return steps


def _shift(name: str, steps: dict[str, int], blocks: int) -> str:
    """A name after the blocks, its count moved on by ``blocks`` times its base's step per block."""
    match = _COUNTED.match(name)
    step = steps.get(match["base"], 0)
    if not step:
        return name
    return f"{match['base']}_{int(match['count'] or 0) + blocks * step}"


def _moved(node: OpNode, name: str, inputs: tuple[str, ...], old: str, new: str) -> OpNode:
    """A copy of a block's node as the node of another block: its name, operands and module paths."""
    def path(text: str) -> str:
        return new + text[len(old):] if text == old or text.startswith(old + ".") else text
    target = path(node.target) if node.kind != NodeKind.OP else node.target
    return replace(node, name=name, inputs=inputs, module=path(node.module), qualname=path(node.qualname),
                   target=target)
