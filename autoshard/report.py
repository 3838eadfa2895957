"""Rich renderings of a model problem's solutions: per-iteration cost tables and the final plan.

The solver reports progress as events (data); these functions turn a choice into the table a
user reads to see what each plan costs and why (Name / InSpec / OutSpec / Cost, then one
``|-producer`` row per resharded operand, then Total).
"""

from __future__ import annotations

import re

from rich.table import Table

from autoshard.build import ModelProblem
from autoshard.cost.devices import PRESETS, Device
from autoshard.units import format_bytes
from autoshard.graph import NodeKind
from autoshard.plan import Plan
from autoshard.planning import edge_cost
from autoshard.sharding.spec import TensorSpec

MAX_FULL_ROWS = 60
LARGEST_DEVICE = max(PRESETS.values(), key=lambda d: d.memory or 0)


def _text(spec: TensorSpec | None, mesh_ndim: int) -> str:
    return "-" if spec is None else spec.format(mesh_ndim)


def cost_rows(mp: ModelProblem, choice: list[int]) -> list[tuple[str, str, str, int, bool]]:
    """(name, in-spec, out-spec, cost, interesting) rows: ops and output, each followed by its reshards."""
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
        rows.append((name, ins, out, cost, cost > 0 or not s.out_spec.is_replicated))
        for e in incoming.get(name, []):
            src = mp.candidates[e.src].strategies[choice[index[e.src]]].out_spec
            dst = s.in_specs[e.operand]
            c = edge_cost(mp, e.index, choice)
            if c or (dst is not None and src != dst):
                rows.append((f"|-{e.src}", _text(src, nd), _text(dst, nd), c, True))
    return rows


def communication_rows(rows: list[tuple[str, str, str, int, bool]]) -> list[tuple[str, str, str, int, bool]]:
    """The reshard rows that cost something, each under the op it feeds: where a plan communicates."""
    shown: list[tuple[str, str, str, int, bool]] = []
    for k, row in enumerate(rows):
        if row[0].startswith("|-") and row[3]:
            owner = next(r for r in reversed(rows[:k]) if not r[0].startswith("|-"))
            if owner not in shown:
                shown.append(owner)
            shown.append(row)
    return shown


def iteration_table(mp: ModelProblem, choice: list[int], title: str | None = None, full: bool | None = None,
                    compact: bool = False) -> Table:
    """The cost breakdown of one plan; large graphs show only the rows that cost or shard something,
    ``compact`` only the reshards that cost something and the ops they feed."""
    rows = cost_rows(mp, choice)
    if full is None:
        full = len(rows) <= MAX_FULL_ROWS
    table = Table(title=title, title_justify="left")
    for col, justify in (("Name", "left"), ("InSpec", "left"), ("OutSpec", "left"), ("Cost", "right")):
        table.add_column(col, justify=justify)
    shown = communication_rows(rows) if compact else rows if full else [r for r in rows if r[4]]
    for name, ins, out, cost, _ in shown:
        table.add_row(name, ins, out, mp.cost_model.format(cost))
    hidden = len(rows) - len(shown)
    if hidden and compact:
        local = sum(r[3] for r in rows if r not in shown)
        table.add_row(f"({hidden} rows of local work hidden: {mp.cost_model.format(local)}; --tables last shows "
                      "them)", "", "", "")
    elif hidden:
        table.add_row(f"({hidden} replicated zero-cost rows hidden)", "", "", "")
    total = mp.problem.cost(choice)
    table.add_row("Total", "", "", mp.cost_model.format(total), style="bold")
    return table


def layout_summary(mp: ModelProblem, choice: list[int]) -> Table:
    """Parameter layouts of the plan: what every device stores."""
    nd = mp.mesh.ndim
    table = Table(title="Parameter layouts", title_justify="left")
    for col in ("Parameter", "Shape", "Spec", "Bytes/device"):
        table.add_column(col)
    index = {n: i for i, n in enumerate(mp.names)}
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
        table.add_row(cand.node.qualname, str(list(meta.shape)), _text(s.out_spec, nd), f"{size:,}")
    return table


def device_line(device: Device, generic: bool) -> str:
    """One line naming the roofline, links and capacity the costs assume."""
    if generic:
        return f"device: {device.description} (choose one with --device {'|'.join(sorted(PRESETS))})"
    return f"device: {device.description}"


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
    capacity = mp.cost_model.device.memory
    budget = mp.problem.usage_limit
    if budget is not None:
        line += f"; budget {format_bytes(budget)}"
    if capacity is not None and peak > capacity:
        line += f"\nwarning: {format_bytes(peak)} per device is more than a {mp.cost_model.device.name} has " \
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
        parts.append(f"recomputed in backward: {len(layers)} layers ({_fold_groups(layers)})")
    regathered = sorted({e.src for e in plan.edges if e.regather})
    if regathered:
        modules = {re.sub(r"^(.*?\.\d+)\..*$", r"\1", plan.nodes[n].module or n) for n in regathered}
        parts.append(f"re-gathered for backward: {len(regathered)} parameters (of {_fold_groups(sorted(modules))})")
    return "; ".join(parts)


def _fold_groups(names: list[str]) -> str:
    """Names folded per pattern (``model.layers.{0..31}, lm_head``), patterns in first-seen order."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(re.sub(r"\d+", "#", name), []).append(name)
    return ", ".join(_fold(group) for group in groups.values())


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
    where = "; ".join(f"{_fold(modules)} over mesh axis {axis}" for axis, modules in sorted(by_axis.items()))
    experts = sum(1 for n in plan.nodes.values() if n.op == "moe_experts")
    return (f"expert parallel: {len(layers)} of {experts} MoE layers, {where} (tokens sent to their experts by "
            f"all-to-all, priced at balanced routing with capacity factor {plan.capacity_factor})")


def _fold(names: list[str]) -> str:
    """``a.0.b, a.1.b, a.2.b`` -> ``a.{0..2}.b`` when the names differ in one number only."""
    shapes = {re.sub(r"\d+", "#", n) for n in names}
    numbers = [re.findall(r"\d+", n) for n in names]
    if len(names) < 3 or len(shapes) != 1:
        return ", ".join(names)
    varying = [i for i in range(len(numbers[0])) if len({ns[i] for ns in numbers}) > 1]
    if len(varying) != 1:
        return ", ".join(names)
    values = sorted(int(ns[varying[0]]) for ns in numbers)
    span = f"{{{values[0]}..{values[-1]}}}" if values == list(range(values[0], values[-1] + 1)) else \
        "{" + ",".join(map(str, values)) + "}"
    parts = re.split(r"(\d+)", names[0])
    parts[2 * varying[0] + 1] = span
    return "".join(parts)
