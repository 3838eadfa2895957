"""What a run of a plan is checked against: the collectives the plan lists, the backend, world
size and model it was made for, the consistency of its recorded layouts with the model
(:func:`check_layouts`), and the relative errors of the results.

:func:`expected_collectives` is the list the cost model charged, by plan edge and pass;
:func:`same_collectives` compares an executed list with it (per edge and pass, in order).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import torch

from autoshard.frontend.graph import fingerprint, graph_signature
from autoshard.problem.candidates import operand_meta
from autoshard.cost.memory import out_metas
from autoshard.errors import AutoshardError
from autoshard.frontend.graph import NodeKind, OpGraph, TensorMeta
from autoshard.problem.identity import align
from autoshard.problem.plan import EdgeReshard, Plan
from autoshard.runtime.collectives import BACKWARD, FORWARD, RECOMPUTE
from autoshard.runtime.experts import exchange_label
from autoshard.sharding.reshard import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, COLLECTIVES, SLICE, Step, reshard_steps
from autoshard.sharding.spec import TensorSpec

BACKEND_COLLECTIVES: dict[str, frozenset[str]] = {
    "gloo": frozenset(COLLECTIVES),  # CPU tensors, torch 2.13
    "nccl": frozenset(COLLECTIVES),
    "mpi": frozenset({ALL_GATHER, ALL_REDUCE, ALL_TO_ALL}),  # ProcessGroupMPI raises on reduce_scatter
}
"""Collectives each torch.distributed backend can run; a plan needing another one is refused."""
NOISE_FLOOR = 1e-3
"""Fraction of the largest reference compared together below which a tensor's own scale is not trusted."""


@dataclass(frozen=True)
class Collective:
    """One collective of a plan edge: its kind, mesh axis, bytes each device sends, and pass
    (``ahead``: issued before its use and waited at first use, ``cost/overlap.py``). ``uneven``: the
    tensor has a dim the mesh cuts unevenly, so the plan's bytes are those of the largest pieces."""

    edge: str
    kind: str
    axis: int
    sent_bytes: int
    phase: str
    routed: bool = False
    ahead: bool = False
    uneven: bool = False


def edge_label(edge: EdgeReshard) -> str:
    """``src->dst[operand]``: how collectives name the edge they belong to."""
    return f"{edge.src}->{edge.dst}[{edge.operand}]"


def count_label(node: str) -> str:
    """``loss[valid count]``: how collectives name a mean loss's all-reduce of its valid-target count."""
    return f"{node}[valid count]"


def expected_collectives(plan: Plan) -> list[Collective]:
    """The collectives one forward (and, for a training plan, one backward) must run, by plan edge:
    forward, then the recomputation's (:func:`replayed_edges`), the re-gather's (a
    parameter gathered again for backward), then the gradient's. A hidden edge's gathers
    (forward, recomputation, re-gather) and gradient collectives are issued ahead
    (``runtime/overlap.py``).

    Bytes are ``Step.sent_bytes``, the quantity the cost model prices; slices are local and omitted.
    """
    result = []
    rerun = {name for segment in plan.recompute for name in segment} - set(plan.recompute_kept)
    replayed = replayed_edges(plan)
    for edge in plan.edges:
        passes = [(FORWARD, edge.steps, edge.hidden)]
        if plan.mode == "training":
            if edge_label(edge) in replayed:
                passes.append((RECOMPUTE, edge.steps, edge.hidden))
            if edge.regather:
                passes.append((BACKWARD, edge.steps, edge.hidden))
            passes.append((BACKWARD, edge.grad_steps, edge.hidden))
        for phase, steps, ahead in passes:
            for step in steps:
                if step.kind != SLICE:
                    sent = step.sent_bytes(plan.mesh.shape[step.axis])
                    result.append(Collective(edge_label(edge), step.kind, step.axis, sent, phase, ahead=ahead,
                                             uneven=bool(step.shape)))
    for node in plan.nodes.values():
        again = node.name in rerun and plan.mode == "training"
        phases = [FORWARD, RECOMPUTE] if again else [FORWARD]
        for phase in phases:
            for step in node.count_steps:
                sent = step.sent_bytes(plan.mesh.shape[step.axis])
                result.append(Collective(count_label(node.name), step.kind, step.axis, sent, phase))
        for x in node.exchanges:
            result.append(Collective(exchange_label(node.name), ALL_TO_ALL, x.axis,
                                     x.sent_bytes(plan.mesh.shape[x.axis]), x.phase, x.routed))
    return result


def replayed_edges(plan: Plan) -> set[str]:
    """Labels of the edges whose forward steps a recomputation runs again: every edge into a
    recomputed op that runs again, and into a kept op (``Plan.recompute_kept``) every edge from a
    parameter or other source (a node that is no op's output: its gathered copy is not kept, and
    the kept op's backward reads it); the reshard of another op's output into a kept op is kept
    with that op (``runtime/recompute.py``), as the cost model charges it (``problem/edges.py``)."""
    if plan.mode != "training":
        return set()
    recomputed = {name for segment in plan.recompute for name in segment}
    kept = set(plan.recompute_kept)
    return {edge_label(e) for e in plan.edges
            if e.dst in recomputed and (e.dst not in kept or plan.nodes[e.src].op is None)}


def same_collectives(executed: Sequence[Collective], planned: Sequence[Collective]) -> bool:
    """The executed collectives are the plan's: per edge and pass the same collectives in the same
    order (how autograd interleaves one edge's backward steps with a recomputation is its own
    business), except that a routed exchange sent what the routing asked for (the plan holds the
    balanced-routing estimate), and that a device holding shorter pieces of an uneven cut sends at
    most the bytes of the largest pieces the plan prices."""
    def by_pass(collectives: Sequence[Collective]) -> list[Collective]:
        return sorted(collectives, key=lambda c: (c.edge, c.phase))  # stable: each pass keeps its order

    return len(executed) == len(planned) and all(
        e == p or (p.routed and e.routed and replace(e, sent_bytes=p.sent_bytes) == p)
        or (p.uneven and e.sent_bytes <= p.sent_bytes and replace(e, sent_bytes=p.sent_bytes, uneven=True) == p)
        for e, p in zip(by_pass(executed), by_pass(planned)))


def required_collectives(plan: Plan) -> set[str]:
    """Kinds of collective the plan runs on mesh axes with more than one device."""
    steps = [step for edge in plan.edges for step in (*edge.steps, *edge.grad_steps)]
    steps += [step for node in plan.nodes.values() for step in node.count_steps]
    kinds = {step.kind for step in steps if step.kind != SLICE and plan.mesh.shape[step.axis] > 1}
    return kinds | ({ALL_TO_ALL} if any(n.exchanges for n in plan.nodes.values()) else set())


def check_backend(plan: Plan, backend: str, table: Mapping[str, frozenset[str]] = BACKEND_COLLECTIVES) -> None:
    """Refuse a plan that needs a collective ``backend`` lacks (backends not in ``table`` are trusted)."""
    supported = table.get(backend)
    if supported is None:
        return
    missing = sorted(required_collectives(plan) - supported)
    if missing:
        others = [name for name, kinds in table.items() if required_collectives(plan) <= kinds]
        hint = f"use the {others[0]} backend (--backend {others[0]})" if others else "re-plan so it needs none of them"
        raise AutoshardError(f"the plan needs {', '.join(missing)}, which the {backend} backend cannot run: {hint}")


def check_world(plan: Plan, world_size: int) -> None:
    """Refuse to run a plan on a world whose size is not the plan mesh's device count."""
    if world_size != plan.mesh.size:
        raise AutoshardError(f"plan is for mesh {plan.mesh.label} ({plan.mesh.size} devices) but the world has "
                             f"{world_size} ranks: launch torchrun --nproc_per_node={plan.mesh.size}")


def check_model(plan: Plan, graph: OpGraph) -> Plan:
    """The plan with its nodes under this trace's names (``problem/identity.py``: a model may trace its
    ops in another order in another process); a plan made for another model is refused, saying what differs."""
    plan = align(plan, graph)
    if plan.fingerprint != fingerprint(graph):
        which = f" ({plan.model})" if plan.model else ""
        raise AutoshardError(f"plan was made for another model{which}: {graph_difference(plan, graph)}; "
                             "re-plan this model with autoshard.solve")
    return plan


def check_layouts(plan: Plan, graph: OpGraph) -> None:
    """Refuse a plan (of this model: :func:`check_model` first) whose recorded layouts do not fit together,
    as a hand-edited or damaged file's: every node of the model placed, every layout of its tensor's
    rank and dividing its shape, ``param_specs`` equal to the parameter nodes' layouts, every
    recomputed node in the model, and on every edge the steps the producer's and consumer's layouts
    need (forward; in training the gradient's, into the producer's layout without partial sums)."""
    def refuse(what: str) -> AutoshardError:
        return AutoshardError(f"plan{f' of {plan.model}' if plan.model else ''} is inconsistent: {what}; the file was "
                              "edited or damaged: write it again with autoshard.solve --out")

    text = lambda spec: spec.format(plan.mesh.ndim) if spec is not None else "none"  # noqa: E731
    placed = {n.name for n in graph if n.kind == NodeKind.OUTPUT or out_metas(n)}
    if missing := [name for name in placed if name not in plan.nodes]:
        raise refuse(f"node {missing[0]} of the model has no placement")
    if extra := [name for name in plan.nodes if name not in placed]:
        raise refuse(f"it places {extra[0]}, which is not a node of the model")
    for node in graph:
        place = plan.nodes.get(node.name)
        if place is None:
            continue
        metas = [(f"{node.name}'s output", place.out_spec, node.tensor)]
        metas += [(f"operand {k} of {node.name}", spec, operand_meta(graph, node, node.inputs[k]))
                  for k, spec in enumerate(place.in_specs) if k < len(node.inputs)]
        for what, spec, meta in metas:
            if not _fits(spec, meta, plan):
                raise refuse(f"{what} is laid out {text(spec)}, which does not cut its shape {list(meta.shape)} "
                             f"on mesh {plan.mesh.label}")
    params = {n.qualname: plan.nodes[n.name].out_spec for n in graph if n.kind in (NodeKind.PARAM, NodeKind.BUFFER)}
    if plan.param_specs and plan.param_specs != params:
        name = next(n for n in (*params, *plan.param_specs) if plan.param_specs.get(n) != params.get(n))
        raise refuse(f"param_specs[{name}] is {text(plan.param_specs.get(name))} but the parameter's node is laid "
                     f"out {text(params.get(name))}")
    if stray := [name for segment in plan.recompute for name in segment if name not in graph.nodes]:
        raise refuse(f"it recomputes {stray[0]}, which is not a node of the model")
    _check_edges(plan, graph, refuse, text)


def _fits(spec: TensorSpec | None, meta: TensorMeta | None, plan: Plan) -> bool:
    """True when ``spec`` is a layout of a tensor ``meta`` on the plan's mesh (or either is absent)."""
    return spec is None or meta is None or spec.fits(meta.shape, plan.mesh.shape)


def _check_edges(plan: Plan, graph: OpGraph, refuse: Callable[[str], AutoshardError],
                 text: Callable[[TensorSpec | None], str]) -> None:
    """Every edge the model has, recorded once with the steps its layouts need (``readback.make_plan``'s)."""
    recorded: dict[tuple[str, int], EdgeReshard] = {}
    for edge in plan.edges:
        if (edge.dst, edge.operand) in recorded:
            raise refuse(f"it has two edges into operand {edge.operand} of {edge.dst}")
        recorded[edge.dst, edge.operand] = edge
    expected = set()
    for node in graph:
        place = plan.nodes.get(node.name)
        for k, src in enumerate(node.inputs if place is not None else ()):
            meta = operand_meta(graph, node, src)
            if src not in plan.nodes or meta is None or k >= len(place.in_specs):
                continue
            expected.add((node.name, k))
            edge = recorded.get((node.name, k))
            label = f"the edge {src}->{node.name}[{k}]"
            if edge is None:
                raise refuse(f"{label} is missing")
            produced, wanted = plan.nodes[src].out_spec, place.in_specs[k] or plan.nodes[src].out_spec
            if edge.src != src or (edge.src_spec, edge.dst_spec) != (produced, wanted):
                raise refuse(f"{label} is recorded as {edge.src} {text(edge.src_spec)} -> {text(edge.dst_spec)}, "
                             f"the nodes' layouts are {text(produced)} -> {text(wanted)}")
            _check_steps(label, edge.steps, produced, wanted, meta, plan, refuse, text)
            backward = plan.mode == "training" and place.in_specs[k] is not None and graph.gradient_flows(node, k, meta)
            if not backward:
                if edge.grad_steps or edge.grad_src_spec is not None:
                    raise refuse(f"{label} has gradient steps, but no gradient flows along it")
                continue
            back = produced.without_partial() if produced is not None else None
            if edge.grad_src_spec is None or not _fits(edge.grad_src_spec, meta, plan) or edge.grad_dst_spec != back:
                raise refuse(f"{label}'s gradient is recorded as {text(edge.grad_src_spec)} -> "
                             f"{text(edge.grad_dst_spec)}, not into {src}'s layout {text(back)}")
            _check_steps(f"{label}'s gradient", edge.grad_steps, edge.grad_src_spec, back, meta, plan, refuse, text)
    if stray := [key for key in recorded if key not in expected]:
        raise refuse(f"it has an edge into operand {stray[0][1]} of {stray[0][0]}, which the model does not have")


def _check_steps(label: str, steps: tuple[Step, ...], src: TensorSpec | None, dst: TensorSpec | None,
                 meta: TensorMeta, plan: Plan, refuse: Callable[[str], AutoshardError],
                 text: Callable[[TensorSpec | None], str]) -> None:
    """Refuse ``steps`` unless they are the ones that turn ``src`` into ``dst`` (none when either is absent)."""
    try:
        need = reshard_steps(src, dst, meta.shape, meta.itemsize, plan.mesh.shape) \
            if src is not None and dst is not None else ()
    except (ValueError, AssertionError):
        raise refuse(f"{label} cannot lead from {text(src)} to {text(dst)}") from None
    if tuple(steps) != need:
        have = ", ".join(s.describe() for s in steps) or "none"
        raise refuse(f"{label}'s steps ({have}) do not lead from {text(src)} to {text(dst)}, which needs "
                     f"{', '.join(s.describe() for s in need) or 'none'}")


def graph_difference(plan: Plan, graph: OpGraph) -> str:
    """What tells the plan's graph from ``graph``: the tracer, the first differing node, or the fingerprints."""
    frontend = ""
    if plan.frontend and plan.frontend != graph.frontend:
        frontend = f"it was traced with {plan.frontend}, this model with {graph.frontend}; "
    ours = graph_signature(graph)
    if not plan.signature:
        return f"{frontend}its fingerprint {plan.fingerprint} is not this model's {fingerprint(graph)}"
    for k, (planned, traced) in enumerate(zip(plan.signature, ours)):
        if planned != traced:
            return f"{frontend}node {k} differs: the plan has {_node_text(planned)}, this model {_node_text(traced)}"
    return f"{frontend}the plan has {len(plan.signature)} nodes, this model {len(ours)}, the first ones equal"


def _node_text(line: str) -> str:
    """``linear_1 (linear, shape (8, 32))`` from a signature line ``linear_1:linear:(8, 32)`` (inputs have no op)."""
    name, op, shape = line.split(":", 2)
    details = [part for part in (op if op != "None" else "", f"shape {shape}" if shape != "None" else "") if part]
    return f"{name} ({', '.join(details)})" if details else name


def relative_errors(got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor]) -> dict[str, tuple[float, float]]:
    """Per name of ``want``: (max |got - want|, max |got - want| / (|want| + s)), in float64; missing names get inf.

    The check is ``torch.testing.assert_close``'s, |got - want| <= atol + rtol |want| elementwise,
    written as one relative error against ``rtol`` with ``atol = rtol * s``; ``s`` scales it to the
    tensor and to everything compared with it: ``s = max(max |want|, NOISE_FLOOR * M)``, where M is
    the largest entry of all ``want`` tensors. A reference that is zero up to float32 rounding
    (an attention key bias's gradient: softmax ignores it) is then judged against 1e-3 of the
    largest gradient, not against its own noise, while an error in any tensor of real magnitude is
    still measured against that tensor. NaN where the reference has NaN (a mean over no targets) is equal.
    """
    largest = max((_finite_max(w) for w in want.values() if w.numel()), default=0.0)
    errors = {}
    for name, w in want.items():
        if name not in got or tuple(got[name].shape) != tuple(w.shape):
            errors[name] = (float("inf"), float("inf"))
            continue
        if not w.numel():
            errors[name] = (0.0, 0.0)
            continue
        g, w64 = got[name].detach().double().cpu(), w.detach().double().cpu()
        diff = (g - w64).abs()
        diff = torch.where(torch.isnan(g) & torch.isnan(w64), 0.0, diff)
        diff = torch.where((g == w64), 0.0, diff)  # equal infinities
        diff = torch.nan_to_num(diff, nan=float("inf"))
        scale = max(_finite_max(w64), NOISE_FLOOR * largest)
        denominator = torch.nan_to_num(w64.abs(), nan=0.0, posinf=0.0) + scale
        relative = diff / denominator if scale > 0 else diff
        errors[name] = (float(diff.max()), float(relative.max()))
    return errors


def _finite_max(t: torch.Tensor) -> float:
    """Largest finite |entry| (0 when none)."""
    finite = t.detach().abs()[torch.isfinite(t.detach())]
    return float(finite.max()) if finite.numel() else 0.0
