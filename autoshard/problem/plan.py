"""A solved sharding plan as plain data: what every node computes where, and every edge's reshard.

The plan is what the lowering steps consume (schedule text, JSON file, torch.distributed
runtime). It is torch-free and round-trips through JSON (``Plan.to_json`` / ``Plan.from_json``).

Per node it records the spec required of each tensor operand (``in_specs``, in ``OpNode.inputs``
order) and the spec of the output (``out_spec``; for tuple outputs, of every element), plus the
local-execution adjustments the runtime must apply so that running the op on local pieces
computes the local piece of the global result:

- ``local_attrs``: attribute overrides by ATen schema name, e.g. ``{"size": [2, 8, 64]}`` for a
  view whose global size argument must become the local one;
- ``scale``: multiply the local output by this (a mean over a sharded dim is a partial sum of
  local means divided by the shard count);
- ``masked_operands``: operands added into a partial-sum output (a bias) are kept only on the
  devices at coordinate 0 of the partial axes, so the sum counts them once;
- ``count_steps``: a mean loss whose targets are sharded runs as a local sum divided by the
  count of valid targets (not ``ignore_index``) all-reduced by these steps (``strategy.count_steps``).
- ``exchange_axis`` and ``exchanges``: an expert-parallel op (mixture of experts) sends tokens to
  their experts' devices along that mesh axis and back; ``exchanges`` lists those all-to-alls
  with the bytes the cost model charged (balanced routing times the plan's ``capacity_factor``,
  see ``sharding/exchange.py``).

It also records the tracer that produced the graph (``frontend``: ``fx`` or ``export``), so the
runtime re-traces the model the same way, and the graph's ``signature`` (one ``name:op:shape``
line per node, hashed into ``fingerprint``), so a plan run on another model says which node
differs. Plan files written before these fields existed still load (frontend ``""``: re-traced
with ``auto``; no signature: only the fingerprint is compared).

Per edge it records the forward steps (producer spec -> required spec) and, in training mode,
the backward steps of the gradient (consumer's gradient spec -> producer's expected gradient);
``regather`` marks a parameter gathered again for backward instead of kept from forward (its
forward steps run once more in backward); ``hidden`` an edge whose collectives the cost model
hides under compute (``cost/overlap.py``), which the runtime issues ahead. ``Plan.recompute`` lists the recomputed segments (runs
of consecutive graph nodes, each a repeated layer): their forward runs again in backward, but
for ``Plan.recompute_kept``, the ops a selective policy keeps (``cost/recompute.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from autoshard import specs
from autoshard.errors import AutoshardError
from autoshard.sharding.exchange import Exchange
from autoshard.sharding.mesh import Mesh
from autoshard.sharding.reshard import Step
from autoshard.sharding.spec import TensorSpec

PLAN_VERSION = 1


@dataclass
class NodePlacement:
    """Where one node's operands and output live, and how its local computation is adjusted."""

    name: str
    op: str | None
    module: str
    in_specs: tuple[TensorSpec, ...]
    out_spec: TensorSpec | None
    cost: int = 0
    local_attrs: dict[str, Any] = field(default_factory=dict)
    scale: Fraction = Fraction(1)
    masked_operands: tuple[int, ...] = ()
    count_steps: tuple[Step, ...] = ()
    exchange_axis: int | None = None
    exchanges: tuple[Exchange, ...] = ()


@dataclass
class EdgeReshard:
    """The reshard on one (producer -> consumer operand) edge, forward and (training) backward."""

    src: str
    dst: str
    operand: int
    src_spec: TensorSpec
    dst_spec: TensorSpec
    steps: tuple[Step, ...]
    grad_src_spec: TensorSpec | None = None
    grad_dst_spec: TensorSpec | None = None
    grad_steps: tuple[Step, ...] = ()
    cost: int = 0
    regather: bool = False
    hidden: bool = False


@dataclass
class Plan:
    """A full plan for one traced model on one mesh under one cost model."""

    model: str
    fingerprint: str
    mesh: Mesh
    cost_model: str
    mode: str
    nodes: dict[str, NodePlacement]
    edges: list[EdgeReshard]
    total_cost: int
    cost_unit: str
    ticks_per_unit: int
    lower_bound: int | None = None
    proved_optimal: bool = False
    param_specs: dict[str, TensorSpec] = field(default_factory=dict)
    frontend: str = ""
    signature: list[str] = field(default_factory=list)
    recompute: list[list[str]] = field(default_factory=list)
    capacity_factor: float = 1.0
    recompute_kept: list[str] = field(default_factory=list)

    def shards_nothing(self) -> bool:
        """True when every tensor the model reads is replicated: each device runs the whole model."""
        read = {edge.src for edge in self.edges}
        return all(spec is None or spec.is_replicated for node in self.nodes.values()
                   if node.name in read or node.op is not None for spec in (node.out_spec, *node.in_specs))

    def expert_parallel(self) -> dict[str, int]:
        """Module path (else node name) of every expert-parallel op -> the mesh axis it exchanges tokens over."""
        return {n.module or n.name: n.exchange_axis for n in self.nodes.values() if n.exchange_axis is not None}

    def edge(self, dst: str, operand: int) -> EdgeReshard:
        """The edge into operand ``operand`` of node ``dst``."""
        for e in self.edges:
            if e.dst == dst and e.operand == operand:
                return e
        raise KeyError((dst, operand))

    def to_json(self) -> dict:
        """Plain-data form (specs as text, steps as dicts)."""
        nd = self.mesh.ndim
        return {
            "version": PLAN_VERSION,
            "model": self.model,
            "fingerprint": self.fingerprint,
            "mesh": self.mesh.to_json(),
            "cost_model": self.cost_model,
            "mode": self.mode,
            "total_cost": self.total_cost,
            "cost_unit": self.cost_unit,
            "ticks_per_unit": self.ticks_per_unit,
            "lower_bound": self.lower_bound,
            "proved_optimal": self.proved_optimal,
            "param_specs": {k: _spec_json(v, nd) for k, v in self.param_specs.items()},
            "frontend": self.frontend,
            "signature": self.signature,
            "recompute": self.recompute,
            "recompute_kept": self.recompute_kept,
            "capacity_factor": self.capacity_factor,
            "expert_parallel": self.expert_parallel(),
            "nodes": [_node_json(n, nd) for n in self.nodes.values()],
            "edges": [_edge_json(e, nd) for e in self.edges],
        }

    def save(self, path: str | Path) -> None:
        """Write the plan as indented JSON; the document is checked against specs/plan.schema.json
        first, so no file is written that :meth:`load` would refuse."""
        data = self.to_json()
        if wrong := specs.problem(data, specs.PLAN_SCHEMA):
            raise ValueError(f"the plan of {self.model} breaks specs/plan.schema.json ({wrong}): the writer and "
                             f"the schema disagree")
        Path(path).write_text(json.dumps(data, indent=1) + "\n")

    @staticmethod
    def from_json(data: dict, source: str = "plan file") -> "Plan":
        """Inverse of :meth:`to_json`; a malformed ``source`` raises :class:`AutoshardError` naming the field:
        one that breaks specs/plan.schema.json (a missing key, a wrong type, an unknown step kind or
        field), or a layout or step on a mesh axis the mesh lacks."""
        try:
            if not isinstance(data, dict):
                raise TypeError(f"it holds a JSON {type(data).__name__}, not an object")
            if "pipeline" in data:
                raise AutoshardError(f"{source} holds a pipelined plan (autoshard.solve --pipeline), which only "
                                     f"autoshard.train runs: train it with torchrun ... -m autoshard.train, or "
                                     f"plan without --pipeline")
            if data.get("version") != PLAN_VERSION:
                raise AutoshardError(f"plan version {data.get('version')} is not {PLAN_VERSION}: re-run autoshard.solve")
            if wrong := specs.problem(data, specs.PLAN_SCHEMA):
                raise ValueError(wrong)
            mesh = Mesh.from_json(data["mesh"])
            nodes = {n["name"]: _node_from(n) for n in data["nodes"]}
            edges = [_edge_from(e) for e in data["edges"]]
            plan = Plan(
                model=data["model"],
                fingerprint=data["fingerprint"],
                mesh=mesh,
                cost_model=data["cost_model"],
                mode=data["mode"],
                nodes=nodes,
                edges=edges,
                total_cost=data["total_cost"],
                cost_unit=data["cost_unit"],
                ticks_per_unit=data["ticks_per_unit"],
                lower_bound=data.get("lower_bound"),
                proved_optimal=data.get("proved_optimal", False),
                param_specs={k: _spec_from(v) for k, v in data.get("param_specs", {}).items()},
                frontend=data.get("frontend", ""),
                signature=list(data.get("signature", [])),
                recompute=[list(names) for names in data.get("recompute", [])],
                recompute_kept=list(data.get("recompute_kept", [])),
                capacity_factor=data.get("capacity_factor", 1.0),
            )
            _check_axes(plan)
            return plan
        except (TypeError, ValueError) as exc:  # the schema's verdict, or a layout the mesh cannot hold
            what = str(exc).splitlines()[0]
            raise AutoshardError(f"{source} is malformed ({what}): write it again with autoshard.solve --out") from None

    @staticmethod
    def load(path: str | Path) -> "Plan":
        """Read a plan file written by :meth:`save`."""
        p = Path(path)
        if p.is_dir():
            raise AutoshardError(f"plan file {str(p)!r} is a folder: give the file autoshard.solve --out wrote")
        if not p.is_file():
            raise AutoshardError(f"plan file {str(p)!r} does not exist: write one with autoshard.solve --out {p}")
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise AutoshardError(f"plan file {str(p)!r} is not JSON ({exc}): re-create it") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise AutoshardError(f"plan file {str(p)!r} cannot be read ({exc}): re-create it") from None
        return Plan.from_json(data, f"plan file {str(p)!r}")


def _check_axes(plan: Plan) -> None:
    """Raise ValueError unless every layout, step and exchange names an axis of the plan's mesh (what the
    schema cannot say: it does not know the mesh)."""
    axes = range(plan.mesh.ndim)

    def check(where: str, layouts: tuple[TensorSpec | None, ...], steps: tuple[Step, ...] = ()) -> None:
        named = {a for spec in layouts if spec is not None for a in spec.used_axes}
        named |= {a for step in steps for spec in (step.before, step.after) if spec is not None for a in spec.used_axes}
        named |= {step.axis for step in steps}
        if bad := sorted(a for a in named if a not in axes):
            have = "axis 0" if plan.mesh.ndim == 1 else f"axes 0-{plan.mesh.ndim - 1}"
            raise ValueError(f"{where} names mesh axis {bad[0]}, but mesh {plan.mesh.label} has only {have}")

    for node in plan.nodes.values():
        check(f"node {node.name}", (*node.in_specs, node.out_spec), node.count_steps)
        if any(a not in axes for a in (node.exchange_axis, *(x.axis for x in node.exchanges)) if a is not None):
            raise ValueError(f"node {node.name} exchanges over a mesh axis the mesh {plan.mesh.label} lacks")
    for edge in plan.edges:
        check(f"edge {edge.src}->{edge.dst}[{edge.operand}]",
              (edge.src_spec, edge.dst_spec, edge.grad_src_spec, edge.grad_dst_spec), (*edge.steps, *edge.grad_steps))
    for name, spec in plan.param_specs.items():
        check(f"param_specs[{name}]", (spec,))


def _spec_json(spec: TensorSpec | None, mesh_ndim: int) -> dict | None:
    if spec is None:
        return None
    return {"text": spec.format(mesh_ndim), "dims": [list(a) for a in spec.dims], "partial": sorted(spec.partial)}


def _spec_from(data: dict | None) -> TensorSpec | None:
    if data is None:
        return None
    return TensorSpec(tuple(tuple(a) for a in data["dims"]), frozenset(data["partial"]))


def _step_json(step: Step, mesh_ndim: int) -> dict:
    return {
        "kind": step.kind,
        "axis": step.axis,
        "dim": step.dim,
        "to_dim": step.to_dim,
        "in_bytes": step.in_bytes,
        "before": _spec_json(step.before, mesh_ndim),
        "after": _spec_json(step.after, mesh_ndim),
        **({"shape": list(step.shape)} if step.shape else {}),
    }


def _step_from(data: dict) -> Step:
    return Step(data["kind"], data["axis"], data["dim"], data["to_dim"], data["in_bytes"],
                _spec_from(data["before"]), _spec_from(data["after"]), tuple(data.get("shape", ())))


def _node_json(node: NodePlacement, mesh_ndim: int) -> dict:
    return {
        "name": node.name,
        "op": node.op,
        "module": node.module,
        "in_specs": [_spec_json(s, mesh_ndim) for s in node.in_specs],
        "out_spec": _spec_json(node.out_spec, mesh_ndim),
        "cost": node.cost,
        "local_attrs": node.local_attrs,
        "scale": [node.scale.numerator, node.scale.denominator],
        "masked_operands": list(node.masked_operands),
        "count_steps": [_step_json(s, mesh_ndim) for s in node.count_steps],
        "exchange_axis": node.exchange_axis,
        "exchanges": [{"what": x.what, "phase": x.phase, "axis": x.axis, "in_bytes": x.in_bytes, "routed": x.routed}
                      for x in node.exchanges],
    }


def _node_from(data: dict) -> NodePlacement:
    return NodePlacement(
        name=data["name"],
        op=data["op"],
        module=data["module"],
        in_specs=tuple(_spec_from(s) for s in data["in_specs"]),
        out_spec=_spec_from(data["out_spec"]),
        cost=data["cost"],
        local_attrs=data["local_attrs"],
        scale=Fraction(*data["scale"]),
        masked_operands=tuple(data["masked_operands"]),
        count_steps=tuple(_step_from(s) for s in data.get("count_steps", [])),
        exchange_axis=data.get("exchange_axis"),
        exchanges=tuple(Exchange(x["what"], x["phase"], x["axis"], x["in_bytes"], x["routed"])
                        for x in data.get("exchanges", [])),
    )


def _edge_json(edge: EdgeReshard, mesh_ndim: int) -> dict:
    return {
        "src": edge.src,
        "dst": edge.dst,
        "operand": edge.operand,
        "src_spec": _spec_json(edge.src_spec, mesh_ndim),
        "dst_spec": _spec_json(edge.dst_spec, mesh_ndim),
        "steps": [_step_json(s, mesh_ndim) for s in edge.steps],
        "grad_src_spec": _spec_json(edge.grad_src_spec, mesh_ndim),
        "grad_dst_spec": _spec_json(edge.grad_dst_spec, mesh_ndim),
        "grad_steps": [_step_json(s, mesh_ndim) for s in edge.grad_steps],
        "cost": edge.cost,
        "regather": edge.regather,
        "hidden": edge.hidden,
    }


def _edge_from(data: dict) -> EdgeReshard:
    return EdgeReshard(
        src=data["src"],
        dst=data["dst"],
        operand=data["operand"],
        src_spec=_spec_from(data["src_spec"]),
        dst_spec=_spec_from(data["dst_spec"]),
        steps=tuple(_step_from(s) for s in data["steps"]),
        grad_src_spec=_spec_from(data["grad_src_spec"]),
        grad_dst_spec=_spec_from(data["grad_dst_spec"]),
        grad_steps=tuple(_step_from(s) for s in data["grad_steps"]),
        cost=data["cost"],
        regather=data.get("regather", False),
        hidden=data.get("hidden", False),
    )
