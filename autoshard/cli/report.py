"""Rich renderings of a model problem's solutions: per-iteration cost tables and the final plan.

The solver reports progress as events (data); these functions turn a choice into the table a
user reads to see what each plan costs and why (Name / InSpec / OutSpec / Cost, then one
``|-producer`` row per resharded operand, then Total).
"""

from __future__ import annotations

import re
from typing import Callable, NamedTuple

from rich.table import Table

from autoshard.problem.build import ModelProblem
from autoshard.cost.devices import PRESETS, Device
from autoshard.lower.fold import fold, fold_groups, layer_key
from autoshard.cost.units import format_bytes
from autoshard.frontend.graph import NodeKind, OpNode
from autoshard.problem.plan import Plan
from autoshard.problem.readback import edge_cost
from autoshard.sharding.mesh import Mesh
from autoshard.sharding.spec import TensorSpec

MAX_FULL_ROWS = 60
LARGEST_DEVICE = max(PRESETS.values(), key=lambda d: d.memory or 0)


class Row(NamedTuple):
    """One cost-table row: an op (or the output), or under it a reshard on one of its incoming edges.

    ``layer_name`` is what repeated layers fold on: an op's module path, a reshard's source (a
    parameter's qualified name, or the module of the op producing it); ``what`` is the op (or the
    source op) it names.
    """

    name: str
    ins: str
    out: str
    cost: int
    interesting: bool
    reshard: bool = False
    layer_name: str = ""
    what: str = ""


def _text(spec: TensorSpec | None, mesh_ndim: int) -> str:
    """A layout's letters; a scalar, which has no dims to name, reads ``()``."""
    return "-" if spec is None else spec.format(mesh_ndim) or "()"


def _label(node: OpNode) -> str:
    """The name users know a tensor by: a parameter's or buffer's qualified name (``blocks.0.norm.weight``),
    else the graph node's name."""
    return node.qualname if node.kind in (NodeKind.PARAM, NodeKind.BUFFER) and node.qualname else node.name


def cost_rows(mp: ModelProblem, choice: list[int]) -> list[Row]:
    """Rows of ops and the output, each followed by its reshards."""
    nd = mp.mesh.ndim
    index = {n: i for i, n in enumerate(mp.names)}
    incoming: dict[str, list] = {}
    for e in mp.edges:
        incoming.setdefault(e.dst, []).append(e)
    rows = []
    for name in mp.names:
        cand = mp.candidates[name]
        if cand.node.kind not in (NodeKind.OP, NodeKind.OUTPUT):
            continue
        s = cand.strategies[choice[index[name]]]
        ins = "x".join(_text(spec, nd) for spec in s.in_specs if spec is not None) or "-"
        out = "-" if cand.node.kind == NodeKind.OUTPUT else _text(s.out_spec, nd)
        cost = cand.costs[choice[index[name]]]
        rows.append(Row(name, ins, out, cost, cost > 0 or not s.out_spec.is_replicated, False, cand.node.module,
                        cand.node.op or name))
        for e in incoming.get(name, []):
            source = mp.candidates[e.src].node
            src = mp.candidates[e.src].strategies[choice[index[e.src]]].out_spec
            dst = s.in_specs[e.operand]
            c = edge_cost(mp, e.index, choice)
            if c or (dst is not None and src != dst):
                op_source = source.kind == NodeKind.OP
                rows.append(Row(f"|-{_label(source)}", _text(src, nd), _text(dst, nd), c, True, True,
                                source.module if op_source else _label(source), source.op or "" if op_source else ""))
    return rows


def communication_rows(rows: list[Row]) -> list[Row]:
    """The reshard rows that cost something, each under the op it feeds: where a plan communicates."""
    shown: list[Row] = []
    for k, row in enumerate(rows):
        if row.reshard and row.cost:
            owner = next(r for r in reversed(rows[:k]) if not r.reshard)
            if owner not in shown:
                shown.append(owner)
            shown.append(row)
    return shown


def iteration_table(mp: ModelProblem, choice: list[int], title: str | None = None, full: bool | None = None,
                    compact: bool = False) -> Table:
    """The cost breakdown of one plan; large graphs show only the rows that cost or shard something,
    ``compact`` only the reshards that cost something and the ops they feed, with the copies of a
    repeated layer folded into one block (``linear in model.layers.{0..31}.mlp.up_proj``, ``32 x`` its cost)."""
    rows = cost_rows(mp, choice)
    if full is None:
        full = len(rows) <= MAX_FULL_ROWS
    table = Table(title=title, title_justify="left")
    for col, justify in (("Name", "left"), ("InSpec", "left"), ("OutSpec", "left"), ("Cost", "right")):
        table.add_column(col, justify=justify)
    fmt = mp.cost_model.format
    shown = communication_rows(rows) if compact else rows if full else [r for r in rows if r.interesting]
    for cells in fold_layer_rows(shown, fmt) if compact else [(r.name, r.ins, r.out, fmt(r.cost)) for r in shown]:
        table.add_row(*cells)
    hidden = len(rows) - len(shown)
    if hidden and compact:
        local = sum(r.cost for r in rows if r not in shown)
        table.add_row(f"({hidden} rows of local work hidden: {fmt(local)}; --tables last shows them)", "", "", "")
    elif hidden:
        table.add_row(f"({hidden} replicated zero-cost rows hidden)", "", "", "")
    table.add_row("Total", "", "", fmt(mp.problem.cost(choice)), style="bold")
    return table


def fold_layer_rows(rows: list[Row], fmt: Callable[[int], str]) -> list[tuple[str, str, str, str]]:
    """Table cells of ``rows`` (op rows each followed by its reshards) with blocks that differ only in
    their layer number and costs folded into one, at the first one's place: ``32 x 2.375 ms``, or
    ``32 x 2.375-3.166 ms`` where the layers' choices (recomputed, re-gathered) make the
    copies cost differently; fewer than three such blocks are listed one by one."""
    blocks: list[list[Row]] = []
    for row in rows:
        if row.reshard and blocks:
            blocks[-1].append(row)
        else:
            blocks.append([row])
    groups: dict[tuple, list[list[Row]]] = {}
    for k, block in enumerate(blocks):
        head = block[0]
        pattern, number = layer_key(head.layer_name)
        key = (pattern, head.what, head.ins, head.out,
               tuple((layer_key(r.layer_name)[0], r.what, r.ins, r.out) for r in block[1:]))
        groups.setdefault(key if number is not None else (k,), []).append(block)
    cells = []
    for group in groups.values():
        if len(group) < 3:
            cells += [(r.name, r.ins, r.out, fmt(r.cost)) for block in group for r in block]
            continue
        for position, first in enumerate(group[0]):
            names = fold([block[position].layer_name for block in group])
            name = f"{first.what} in {names}" if first.what else names
            costs = [block[position].cost for block in group]
            each = fmt(costs[0]) if min(costs) == max(costs) else _cost_range(fmt(min(costs)), fmt(max(costs)))
            cells.append((f"|-{name}" if first.reshard else name, first.ins, first.out, f"{len(group)} x {each}"))
    return cells


def _cost_range(low: str, high: str) -> str:
    """``8.96-11.01 ms`` (one unit), ``640 us-1.2 ms`` (two)."""
    (a, _, unit), (b, _, other) = low.rpartition(" "), high.rpartition(" ")
    return f"{a}-{b} {unit}" if unit == other and a and b else f"{low}-{high}"


def layout_summary(mp: ModelProblem, choice: list[int], every: bool = False) -> Table:
    """Parameter layouts of the plan: what every device stores. Unless ``every``, parameters of
    repeated layers with the same shape and layout share one row (``model.layers.{0..31}.mlp.up_proj.weight``)."""
    nd = mp.mesh.ndim
    table = Table(title="Parameter layouts", title_justify="left")
    for col in ("Parameter", "Shape", "Spec", "Bytes/device"):
        table.add_column(col)
    index = {n: i for i, n in enumerate(mp.names)}
    groups: dict[tuple, list[str]] = {}
    for name in mp.names:
        cand = mp.candidates[name]
        if cand.node.kind != NodeKind.PARAM:
            continue
        s = cand.strategies[choice[index[name]]]
        meta = cand.node.tensor
        local = s.out_spec.local_shape(meta.shape, mp.mesh.shape)
        size = meta.itemsize
        for n in local:
            size *= n
        pattern, number = layer_key(cand.node.qualname)
        cells = (str(list(meta.shape)), _text(s.out_spec, nd), f"{size:,}")
        key = (pattern, *cells) if number is not None and not every else (cand.node.qualname, *cells)
        groups.setdefault(key, []).append(cand.node.qualname)
    for key, names in groups.items():
        for name in [fold(names)] if len(names) >= 3 else names:
            table.add_row(name, *key[1:])
    parameters = sum(len(names) for names in groups.values())
    if table.row_count < parameters:  # below the table, so that it never widens or wraps the first column
        table.caption = f"({parameters} parameters in {table.row_count} rows; --params all lists each)"
        table.caption_justify = "left"
    return table


def device_line(device: Device, generic: bool, peak_flops: float | None = None,
                memory_bandwidth: float | None = None, links: Mesh | None = None) -> str:
    """One line naming the roofline, links and capacity the costs assume: the preset's (or generic)
    figures, then what the flags put in their place (``--peak-flops``, ``--memory-bandwidth``, and
    ``links``: the mesh when ``--bandwidth`` / ``--latency`` set its links)."""
    flags = []
    if peak_flops is not None:
        flags.append(f"{_si(peak_flops, 'flop/s')} in every dtype (--peak-flops)")
    if memory_bandwidth is not None:
        flags.append(f"{_si(memory_bandwidth, 'B/s')} memory (--memory-bandwidth)")
    if links is not None:
        axes = ", ".join(f"axis {a} {_si(b, 'B/s')} and {_seconds(t)}"
                         for a, (b, t) in enumerate(zip(links.bandwidth, links.latency)))
        flags.append(f"links {axes} (--bandwidth, --latency)")
    line = f"device: {device.description}"
    if flags:
        line += f"; in their place from the flags: {', '.join(flags)}"
    if generic:
        line += f" (choose a preset with --device {'|'.join(sorted(PRESETS))})"
    return line


def _si(value: float, unit: str) -> str:
    """``1e12, "flop/s"`` -> ``1 Tflop/s``: three significant digits and a decimal prefix."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _seconds(value: float) -> str:
    """``5e-06`` -> ``5 us``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value * 1e9:.3g} ns"


def _moment(mp: ModelProblem, time: int) -> str:
    """``forward of linear_3``, ``backward of linear_3`` or ``optimizer step`` for a timeline slot."""
    horizon = mp.life.horizon
    names = list(mp.life.order)
    if time < horizon:
        return f"forward of {names[time]}"
    if time < 2 * horizon:
        return f"backward of {names[2 * horizon - 1 - time]}"
    return "optimizer step"


def memory_line(mp: ModelProblem, choice: list[int]) -> str:
    """Peak bytes per device, when, what they are, and against the budget or the device's capacity."""
    profile = mp.problem.usage_profile(choice)
    if not profile:
        return "peak memory per device: 0 B"
    time = max(profile, key=lambda t: profile[t])
    peak = profile[time]
    parts = sorted(mp.memory_at(choice, time).items(), key=lambda kv: -kv[1])
    detail = ", ".join(f"{what} {format_bytes(size)}" for what, size in parts if size)
    line = f"peak memory per device: {format_bytes(peak)} at the {_moment(mp, time)} ({detail})"
    device = mp.cost_model.device
    capacity = device.memory
    reserved = device.device_bytes(peak)
    if reserved != peak:
        line += f"; {format_bytes(reserved)} as the allocator reserves it"
    budget = mp.problem.usage_limit
    if budget is not None:
        line += f"; budget {format_bytes(mp.options.device_budget or budget)}"
    if capacity is not None and reserved > capacity:
        line += f"\nwarning: {format_bytes(reserved)} per device is more than a {device.name} has " \
                f"({format_bytes(capacity)}): the plan does not fit"
    elif capacity is None and peak > LARGEST_DEVICE.memory:
        line += f"\nwarning: {format_bytes(peak)} per device is more than any GPU has (the largest preset, " \
                f"{LARGEST_DEVICE.name}, has {format_bytes(LARGEST_DEVICE.memory)}): give --memory-budget or " \
                f"--device, or use more devices"
    return line


def fit_line(plan: Plan) -> str:
    """What the plan recomputes in backward (layers, folded) and which parameters it gathers again
    for backward instead of keeping them gathered (FSDP's reshard after forward); "" when neither."""
    parts = []
    if plan.recompute:
        layers = [_common_module([plan.nodes[n].module for n in names if n in plan.nodes]) for names in plan.recompute]
        parts.append(f"recomputed in backward: {_count(len(layers), 'layer')} ({fold_groups(layers)})")
    regathered = sorted({e.src for e in plan.edges if e.regather})
    if regathered:
        modules = {re.sub(r"^(.*?\.\d+)\..*$", r"\1", plan.nodes[n].module or n) for n in regathered}
        parts.append(f"re-gathered for backward: {_count(len(regathered), 'parameter')} (of {fold_groups(sorted(modules))})")
    return "; ".join(parts)


def _count(n: int, noun: str) -> str:
    """``1 layer``, ``2 layers``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _common_module(modules: list[str]) -> str:
    """The longest dotted prefix shared by ``modules`` (the layer a recomputed block is)."""
    common: list[str] = []
    for parts in zip(*(m.split(".") for m in modules if m)):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return ".".join(common) or "?"


def expert_parallel_line(plan: Plan) -> str:
    """Which mixture-of-experts layers the plan runs expert-parallel, over which mesh axis, and the
    routing its all-to-alls were priced at ("" when none); repeated layers are folded
    (``model.layers.{0..31}.mlp.experts``)."""
    layers = plan.expert_parallel()
    if not layers:
        return ""
    by_axis: dict[int, list[str]] = {}
    for module, axis in layers.items():
        by_axis.setdefault(axis, []).append(module)
    where = "; ".join(f"{fold(modules)} over mesh axis {axis}" for axis, modules in sorted(by_axis.items()))
    experts = sum(1 for n in plan.nodes.values() if n.op == "moe_experts")
    return (f"expert parallel: {len(layers)} of {experts} MoE layers, {where} (tokens sent to their experts by "
            f"all-to-all, priced at balanced routing with capacity factor {plan.capacity_factor})")
