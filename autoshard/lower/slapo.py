"""Plan -> Slapo-style schedule lines (``sch["fc1"].shard(...)`` / ``sch["fc1"].sync(...)``).

Slapo schedules act on modules: ``shard`` replaces a parameter by this rank's slice, ``sync``
hooks a module's first input (``fwd_pre``), its output (``fwd_post``) or its input's gradient
(``bwd_post``). A plan reshards op-level edges, so each edge is attached to a module boundary:
an edge entering a module from outside becomes a ``fwd_pre`` sync of that module, an edge
leaving a module (to the model output or to top-level code) a ``fwd_post`` sync. Lines are
grouped per module in execution order with ``shard`` before ``sync`` (Slapo validates a sync
against the module's sharded parameters) and ``fwd_pre`` before ``bwd_post`` (in backward the
gradient all-reduce then runs before the reverse of the forward reshard). Edges no module
hook can express (inside a module, 2-D meshes, parameter gathers) are listed as comments: the
torch.distributed runtime executes them from the JSON plan.
"""

from __future__ import annotations

from autoshard.lower.fold import fold, layer_key
from autoshard.frontend.graph import NodeKind, OpGraph
from autoshard.problem.plan import EdgeReshard, Plan
from autoshard.sharding.spec import TensorSpec


def _inside(module: str, outer: str) -> bool:
    return bool(outer) and (module == outer or module.startswith(outer + "."))


def _letters(spec: TensorSpec) -> str:
    """A layout on a 1-D mesh; a scalar reads ``()``."""
    return spec.format(1) or "()"


def reshard_text(src: TensorSpec, dst: TensorSpec) -> str:
    """Slapo's resharding string: the last two dims (``RR->SR``) when only they are sharded."""
    sharded = [d for s in (src, dst) for d, axes in enumerate(s.dims) if axes]
    start = src.ndim - 2 if src.ndim >= 2 and all(d >= src.ndim - 2 for d in sharded) else 0

    def short(spec: TensorSpec) -> str:
        return "".join("S" if axes else "R" for axes in spec.dims[start:])

    return f"{short(src)}->{short(dst)}"


def _sync_op(edge: EdgeReshard) -> str:
    """The sync_op_or_fn argument for one forward edge."""
    if edge.src_spec.partial:
        sharded = [d for d, axes in enumerate(edge.dst_spec.dims) if axes]
        if sharded:
            return f'"reduce_scatter", axis={sharded[0]}'
        return '"all_reduce"'
    return f'"{reshard_text(edge.src_spec, edge.dst_spec)}"'


def schedule_lines(plan: Plan, graph: OpGraph, every: bool = False) -> list[str]:
    """The plan as Slapo schedule lines (with comments for what module hooks cannot express); unless
    ``every``, comments that say the same of several parameters (or of one source's edges to
    several ops) are one, naming them all with repeated layers folded
    (``# gradient of model.layers.{0..31}.mlp.up_proj.weight, lm_head.weight needs all_reduce ...``)."""
    if plan.mesh.ndim != 1:
        return [f"# Slapo schedules shard over one device group; mesh {plan.mesh.label} is {plan.mesh.ndim}-D:",
                "# run the JSON plan with autoshard.run (torchrun) instead."]
    split_experts = [n.module for n in plan.nodes.values() if n.op == "moe_experts" and n.in_specs[3].dims[0]]
    if split_experts:
        return [f"# {split_experts[0]} runs its experts split over devices (expert routing): Slapo has no primitive",
                "# for it; run the JSON plan with autoshard.run (torchrun) instead."]
    per_module: dict[str, list[str]] = {}
    notes: dict[str, dict[str, list[str]]] = {}  # comment with {} for the names -> names by layer pattern

    def note(comment: str, name: str) -> None:
        notes.setdefault(comment, {}).setdefault(name if every else layer_key(name)[0], []).append(name)

    def add(module: str, line: str) -> None:
        per_module.setdefault(module, []).append(line)

    for node in graph:
        if node.kind == NodeKind.PARAM and node.name in plan.nodes:
            spec = plan.nodes[node.name].out_spec
            dims = [d for d, axes in enumerate(spec.dims) if axes]
            if dims:
                attr = node.qualname[len(node.module) + 1:] if node.module else node.qualname
                add(node.module, f'sch["{node.module}"].shard("{attr}", axis={dims[0]})')
    first_input: dict[str, str] = {}
    for edge in plan.edges:
        dst_module = plan.nodes[edge.dst].module
        src_module = plan.nodes[edge.src].module
        if dst_module and not _inside(src_module, dst_module) and graph[edge.src].kind != NodeKind.PARAM:
            first_input.setdefault(dst_module, edge.src)
    for edge in plan.edges:
        src_node, dst_node = graph[edge.src], graph[edge.dst]
        dst_module, src_module = plan.nodes[edge.dst].module, plan.nodes[edge.src].module
        collective = [s for s in edge.steps if s.kind != "slice"] or edge.steps
        grad_reduce = edge.grad_src_spec is not None and bool(edge.grad_src_spec.partial)
        if not collective and not grad_reduce:
            continue
        if src_node.kind == NodeKind.PARAM:
            if collective:
                note(f"# parameter {{}} {_letters(edge.src_spec)}->{_letters(edge.dst_spec)} is gathered before "
                     "use (run by autoshard.run)", src_node.qualname)
            grad_collectives = [s.kind for s in edge.grad_steps if s.kind != "slice"]
            if grad_collectives:
                note(f"# gradient of {{}} needs {' + '.join(grad_collectives)} (data parallelism: wrap with DDP, "
                     "or run the JSON plan with autoshard.run)", src_node.qualname)
            continue
        if dst_module and first_input.get(dst_module) == edge.src and dst_node.kind == NodeKind.OP:
            if collective:
                add(dst_module, f'sch["{dst_module}"].sync(mode="fwd_pre", sync_op_or_fn={_sync_op(edge)})')
            if grad_reduce:
                add(dst_module, f'sch["{dst_module}"].sync(mode="bwd_post", sync_op_or_fn="all_reduce")')
        elif src_module and not _inside(dst_module, src_module) and collective and not grad_reduce:
            add(src_module, f'sch["{src_module}"].sync(mode="fwd_post", sync_op_or_fn={_sync_op(edge)})')
        else:
            note(f"# {edge.src} -> {{}}: {_letters(edge.src_spec)}->{_letters(edge.dst_spec)} has no module "
                 "boundary to hook (run by autoshard.run)", edge.dst)
    order = {m: i for i, m in enumerate(dict.fromkeys(n.module for n in graph))}
    blocks: list[tuple[str, list[str]]] = []
    for module in sorted(per_module, key=lambda m: order.get(m, len(order))):
        group = per_module[module]
        blocks.append((module, sorted(group, key=lambda l: (0 if ".shard(" in l else 1 if "fwd_pre" in l
                                                            else 2 if "bwd_post" in l else 3))))
    lines = [line for _, group in blocks for line in group] if every else _loop_layers(blocks)
    return lines + _fill(notes, every)


def _loop_layers(blocks: list[tuple[str, list[str]]]) -> list[str]:
    """Module lines in order, where three or more consecutive layers have the same lines but for
    their layer number, as one ``for i in range(a, b):`` loop over them (still runnable code).
    Where it is shorter, a run of layers whose lines differ only by syncs of some layers' own (the
    first layer resharding the model's input) is one loop over their common lines followed by
    those syncs: each module still shards before it syncs."""
    runs: list[tuple[str | None, int, list[str]]] = []  # (path up to the layer number, the number, lines)
    for module, group in blocks:
        pattern, number = layer_key(module)
        head = pattern[:pattern.index("#")] if number is not None else None
        if head is not None and runs and runs[-1][:2] == (head, number):
            runs[-1][2].extend(group)
        else:
            runs.append((head, -1 if number is None else number, list(group)))
    lines: list[str] = []
    k = 0
    while k < len(runs):
        head, number = runs[k][:2]
        end = k + 1
        while head is not None and end < len(runs) and runs[end][:2] == (head, number + end - k):
            end += 1
        equal = _equal_loops(runs[k:end])
        common = _common_loop(runs[k:end])
        lines += common if common is not None and len(common) < len(equal) else equal
        k = end
    return lines


def _equal_loops(runs: list[tuple[str | None, int, list[str]]]) -> list[str]:
    """Consecutive layers' lines, each stretch of three or more with equal lines as one loop."""
    lines: list[str] = []
    k = 0
    while k < len(runs):
        head, number, group = runs[k]
        body = _generic(group, head, number)
        end = k + 1
        while end < len(runs) and _generic(runs[end][2], head, runs[end][1]) == body:
            end += 1
        if head is not None and end - k >= 3 and not any("{" in line for line in group):
            lines.append(f"for i in range({number}, {number + end - k}):  # {head}{{{number}..{number + end - k - 1}}}")
            lines += [f"    {line}" for line in body]
        else:
            lines += [line for run in runs[k:end] for line in run[2]]
        k = end
    return lines


def _common_loop(runs: list[tuple[str | None, int, list[str]]]) -> list[str] | None:
    """Consecutive layers' lines as one loop over the lines they share and, after it, each
    layer's other lines; None where they share none or those include a ``shard``."""
    head, number = runs[0][:2]
    if head is None or len(runs) < 3 or any("{" in line for run in runs for line in run[2]):
        return None
    bodies = [_generic(run[2], head, run[1]) for run in runs]
    common = [line for line in bodies[0] if all(line in body for body in bodies[1:])]
    own = [line for run, body in zip(runs, bodies) for line, generic in zip(run[2], body) if generic not in common]
    if not common or any(".shard(" in line for line in own):
        return None
    return [f"for i in range({number}, {number + len(runs)}):  # {head}{{{number}..{number + len(runs) - 1}}}",
            *(f"    {line}" for line in common), *own]


def _generic(lines: list[str], head: str | None, number: int) -> list[str]:
    """Lines of layer ``number`` with its module paths written for any layer ``i`` (f-strings)."""
    if head is None:
        return lines
    return [line.replace(f'sch["{head}{number}.', f'sch[f"{head}{{i}}.').replace(f'sch["{head}{number}"]',
                                                                                 f'sch[f"{head}{{i}}"]')
            for line in lines]


def _fill(notes: dict[str, dict[str, list[str]]], every: bool) -> list[str]:
    """Each comment once, in order of first use, naming all it concerns (parameters with a comment
    in common, the ops an edge's source feeds alike), the copies in repeated layers folded
    (``model.layers.{0..31}.mlp.up_proj.weight``); with ``every``, once per name."""
    lines = []
    for comment, groups in notes.items():
        named = [fold(names) if len(names) >= 3 else ", ".join(names) for names in groups.values()]
        lines += [comment.format(name) for name in named] if every else [comment.format(", ".join(named))]
    return lines
