"""A solved plan's structure carried to a smaller model of the same code: LLaMA-3-8B's optimum on a 2-layer LLaMA.

The 8B plans take minutes to solve; their structure (every op's layouts, which layers recompute,
which parameters are re-gathered) is what the export must express. :func:`structure_of` reads it
off a plan, for chosen layers of it, keyed by what a smaller model of the same code shares: the
module path with the layer number replaced, the op, and its rank among that module's ops of that
kind. :func:`structure_choice` picks, for every node of the small model's problem, the strategy
with those layouts (mesh axes keep their numbers: a plan for 2x8 becomes one for 2x2).

    python -m tests.lower.structure PLAN.json LAYER [LAYER ...] > tests/lower/structures/NAME.json
    (with LLAMA_ATTENTION as the plan was solved)
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

from autoshard.frontend.graph import NodeKind, OpGraph
from autoshard.lower.fold import layer_key
from autoshard.problem.build import ModelProblem
from autoshard.problem.plan import Plan


def _keys(graph: OpGraph, layer_map: dict[int, int] | None) -> dict[str, str]:
    """Node name -> structural key; ``layer_map``: this graph's layer number -> the key's (None: same)."""
    seen: dict[tuple[str, str], int] = defaultdict(int)
    keys = {}
    for node in graph:
        where = node.qualname if node.kind == NodeKind.PARAM else node.module
        pattern, number = layer_key(where)
        if number is not None and layer_map is not None:
            if number not in layer_map:
                continue
            number = layer_map[number]
        kind = node.op or node.kind.value
        base = (pattern.replace("#", str(number)) if number is not None else pattern, kind)
        keys[node.name] = f"{base[0]}|{base[1]}|{seen[base]}"
        seen[base] += 1
    return keys


def structure_of(plan: Plan, graph: OpGraph, layers: list[int]) -> dict:
    """The plan's layouts of layers ``layers`` (renumbered 0, 1, ...) and of everything outside layers."""
    keys = _keys(graph, {layer: k for k, layer in enumerate(layers)})
    recomputed = {name for segment in plan.recompute for name in segment}
    regathered = {e.src for e in plan.edges if e.regather}
    nd = plan.mesh.ndim
    nodes = {}
    for name, key in keys.items():
        place = plan.nodes.get(name)
        if place is None:
            continue
        nodes[key] = {"in": [s.format(nd) if s else None for s in place.in_specs],
                      "out": place.out_spec.format(nd) if place.out_spec else None,
                      "recompute": name in recomputed, "regather": name in regathered}
    return {"mesh_ndim": nd, "kept": [keys[n] for n in plan.recompute_kept if n in keys], "nodes": nodes}


def structure_choice(structure: dict, mp: ModelProblem) -> list[int]:
    """The small problem's choice with the structure's layouts, recomputation and re-gathers."""
    keys = _keys(mp.graph, None)
    nd = structure["mesh_ndim"]
    choice = []
    for name in mp.names:
        cand, want = mp.candidates[name], structure["nodes"].get(keys.get(name, ""))
        if want is None:
            raise KeyError(f"{name} ({keys.get(name)}) has no counterpart in the structure")

        def fits(i: int) -> bool:
            s = cand.strategies[i]
            again = cand.recompute[i] if cand.recompute is not None else want["recompute"]  # outside a block
            storage = cand.storage[i].regather if cand.storage else False
            return (s.out_spec.format(nd) if s.out_spec else None) == want["out"] and \
                [x.format(nd) if x else None for x in s.in_specs] == want["in"] and \
                again == want["recompute"] and storage == want["regather"]

        options = [i for i in range(len(cand.strategies)) if fits(i)]
        if not options:
            raise ValueError(f"{name} ({keys[name]}): no strategy has the layouts {want}")
        choice.append(options[0])
    return mp.complete(choice)


if __name__ == "__main__":
    from autoshard.frontend.load import load_model
    from autoshard.frontend.trace import trace

    loaded = load_model("examples/llama3_8b.py").for_training()
    found = structure_of(Plan.load(sys.argv[1]), trace(loaded.model, loaded.example_inputs),
                         [int(x) for x in sys.argv[2:]])
    json.dump(found, sys.stdout, indent=0, sort_keys=True)
