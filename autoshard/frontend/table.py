"""Render an OpGraph as a rich table: one row per op, its parameters and buffers indented below it.

Parameters are listed under each op that reads them (a tied weight appears under every user),
so a 100-node transformer reads top to bottom like its forward pass.
"""

from __future__ import annotations

from rich.table import Table

from autoshard.frontend.graph import NodeKind, OpGraph, OpNode, TensorMeta

_STATE_KINDS = (NodeKind.PARAM, NodeKind.BUFFER)


def graph_table(graph: OpGraph) -> Table:
    """Columns name, op, target, shape, dtype; params/buffers as ``|- qualname`` rows under their users."""
    ops = sum(node.kind is NodeKind.OP for node in graph)
    params = [node for node in graph if node.kind is NodeKind.PARAM]
    megabytes = sum(node.tensor.nbytes for node in params if node.tensor) / 2**20
    table = Table(title=f"{graph.frontend} graph: {ops} ops, {len(params)} parameters ({megabytes:.1f} MiB)")
    for column in ("name", "op", "target", "shape", "dtype"):
        table.add_column(column, no_wrap=column != "target", overflow="fold")
    for node in graph:
        if node.kind in _STATE_KINDS:
            continue
        op = (node.op or "?") if node.kind is NodeKind.OP else node.kind.value
        table.add_row(node.name, op, node.target, _shape(node.out), _dtype(node.out), style=_row_style(node))
        for source in dict.fromkeys(node.inputs):
            state = graph[source]
            if state.kind in _STATE_KINDS and node.kind is NodeKind.OP:
                table.add_row(f"  |-{state.qualname}", state.kind.value, "", _shape(state.out), _dtype(state.out),
                              style="dim")
    return table


def _shape(out: TensorMeta | tuple[TensorMeta | None, ...] | None) -> str:
    if isinstance(out, TensorMeta):
        return str(list(out.shape))
    if isinstance(out, tuple):
        return ", ".join(_shape(item) for item in out)
    return "-"


def _dtype(out: TensorMeta | tuple[TensorMeta | None, ...] | None) -> str:
    if isinstance(out, TensorMeta):
        return out.dtype
    if isinstance(out, tuple):
        return ", ".join(sorted({item.dtype for item in out if item is not None}))
    return "-"


def _row_style(node: OpNode) -> str | None:
    """Unknown ops (no ATen name) in red: later stages keep them replicated."""
    return "red" if node.kind is NodeKind.OP and node.op is None else None
