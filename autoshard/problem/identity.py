"""A plan's nodes under the names of the graph it runs on, matched by what they compute.

fx names an op after its position among ops of its kind (``to_3`` is the fourth ``to`` traced), so
two traces of one model name its ops alike only if they trace them in the same order, and a model
may not: Hugging Face ModernBERT computes one rotary embedding per attention kind while iterating
a Python ``set``, whose order changes with each process's string hashing, so the process that
solves and the one that runs can swap which ``to_k`` reads which ``inv_freq`` buffer.

The identity of a node is therefore its structure, not its name: a node with no operands and no
op (a model input, parameter or buffer) is its own name, which its fully-qualified name makes
stable, and any other node is its op and output shape over the identities of its operands in
order (:func:`structural_keys`). Two nodes that compute the same thing from the same tensors (the
positions both rotary branches derive) are then told apart by where their results go:
:func:`refined` adds each node's consumers and operand positions to its identity, round after
round, until no class splits (colour refinement, forwards and backwards). :func:`align` matches a
plan's nodes to the graph's by identity (nodes still alike in trace order), keeps the match only
if it carries every edge of the plan onto an edge of the graph, and renames the plan; a plan whose
nodes are not the graph's is left to the checks that refuse it.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import replace
from typing import Mapping, Sequence

from autoshard.frontend.graph import OpGraph, fingerprint, graph_signature
from autoshard.problem.plan import Plan

LEAF_OPS = ("None", "frozen")
"""The signature's op of a node that computes nothing: a model input, parameter or buffer."""


def structural_keys(signature: Sequence[str], inputs: Mapping[str, Sequence[str | None]]) -> dict[str, str]:
    """Each node's identity, from its ``name:op:shape`` signature line (topological order) and the
    producers of its operands in order (None where unknown, which no other node's identity matches)."""
    keys: dict[str, str] = {}
    for line in signature:
        name, op, shape = line.split(":", 2)
        operands = inputs.get(name, ())
        if op in LEAF_OPS and not operands:
            keys[name] = f"leaf:{name}"
            continue
        parts = [op, shape] + [keys.get(src, "?") if src is not None else "?" for src in operands]
        keys[name] = hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]
    return keys


def plan_operands(plan: Plan) -> dict[str, list[str | None]]:
    """Per node of the plan, the producers of its operands in order, as its edges record them."""
    operands: dict[str, list[str | None]] = defaultdict(list)
    for edge in plan.edges:
        row = operands[edge.dst]
        row.extend([None] * (edge.operand + 1 - len(row)))
        row[edge.operand] = edge.src
    return operands


def refined(keys: Mapping[str, str], inputs: Mapping[str, Sequence[str | None]]) -> dict[str, str]:
    """``keys`` split until stable by the identities of each node's operands and of its consumers
    (with the operand position each reads it at)."""
    users: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for dst, operands in inputs.items():
        for k, src in enumerate(operands):
            if src is not None:
                users[src].append((dst, k))
    colours, classes = dict(keys), len(set(keys.values()))
    while True:
        step = {}
        for name, colour in colours.items():
            ins = ",".join(colours.get(src, "?") if src is not None else "?" for src in inputs.get(name, ()))
            outs = ",".join(sorted(f"{colours.get(dst, '?')}@{k}" for dst, k in users[name]))
            step[name] = hashlib.sha256(f"{colour}|{ins}|{outs}".encode()).hexdigest()[:20]
        count = len(set(step.values()))
        if count == classes:
            return colours
        colours, classes = step, count


def name_map(plan: Plan, graph: OpGraph) -> dict[str, str] | None:
    """Plan node name -> graph node name for nodes of equal identity, or None when the plan's nodes
    are not the graph's (another model, or a plan file without a signature)."""
    if not plan.signature:
        return None
    ours_in = plan_operands(plan)
    theirs_in = {n.name: list(n.inputs) for n in graph}
    ours = refined(structural_keys(plan.signature, ours_in), ours_in)
    theirs = refined(structural_keys(graph_signature(graph), theirs_in), theirs_in)
    by_key: dict[str, list[str]] = defaultdict(list)
    for name, key in theirs.items():
        by_key[key].append(name)
    mapping: dict[str, str] = {}
    taken: dict[str, int] = defaultdict(int)
    for name, key in ours.items():
        group = by_key.get(key, [])
        if taken[key] >= len(group):
            return None
        mapping[name] = group[taken[key]]
        taken[key] += 1
    if len(mapping) != len(theirs):
        return None
    carried = all(e.src in mapping and e.dst in mapping and e.operand < len(theirs_in[mapping[e.dst]])
                  and theirs_in[mapping[e.dst]][e.operand] == mapping[e.src] for e in plan.edges)
    return mapping if carried else None


def renamed(plan: Plan, name: Mapping[str, str], target: OpGraph, qualname: Mapping[str, str] | None = None) -> Plan:
    """``plan`` with node ``n`` called ``name[n]`` (and parameter ``q`` called ``qualname[q]``), as a plan
    of ``target``: its fingerprint, signature and module paths."""
    qualname = qualname or {}
    return replace(
        plan,
        fingerprint=fingerprint(target),
        signature=graph_signature(target),
        nodes={name[n]: replace(p, name=name[n], module=target[name[n]].module) for n, p in plan.nodes.items()},
        edges=[replace(e, src=name[e.src], dst=name[e.dst]) for e in plan.edges],
        param_specs={qualname.get(q, q): spec for q, spec in plan.param_specs.items()},
        recompute=[[name[n] for n in segment] for segment in plan.recompute],
        recompute_kept=[name[n] for n in plan.recompute_kept],
    )


def align(plan: Plan, graph: OpGraph) -> Plan:
    """``plan`` with every node under the name ``graph`` gives the same computation (itself when the
    names already agree, or when its nodes are not the graph's: the checks then say what differs)."""
    mapping = name_map(plan, graph)
    if mapping is None or all(a == b for a, b in mapping.items()):
        return plan
    return renamed(plan, mapping, graph)
