"""Strategy restrictions applied before the problem is built: pinned layouts (``--pin``), the
layouts a pipeline stage passes its tensors in, and expert parallelism over a named axis
(``--expert-parallel``). Each keeps a subset of a node's strategies and says in one line why none
is left when that happens.
"""

from __future__ import annotations

import difflib
from typing import Mapping

from autoshard.errors import AutoshardError
from autoshard.frontend.graph import NodeKind
from autoshard.problem.candidates import Candidate
from autoshard.sharding.mesh import Mesh
from autoshard.sharding.spec import TensorSpec


def apply_pins(candidates: dict[str, Candidate], pins: Mapping[str, str], mesh: Mesh) -> None:
    """Keep only the strategies whose output (a parameter's stored) layout is the pinned one."""
    by_qualname = {c.node.qualname: c for c in candidates.values() if c.node.qualname}
    for name, text in pins.items():
        cand = by_qualname.get(name) or candidates.get(name)
        if cand is None:
            known = sorted(set(by_qualname) | set(candidates))
            close = difflib.get_close_matches(name, known, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise AutoshardError(f"--pin {name}={text}: no tensor or node named {name!r}{hint}")
        meta = cand.node.tensor
        if meta is None:
            raise AutoshardError(f"--pin {name}={text}: {name!r} is not a single tensor")
        spec = TensorSpec.parse(text, len(meta.shape), mesh.ndim)
        if not spec.fits(meta.shape, mesh.shape):
            raise AutoshardError(f"--pin {name}={text}: shape {list(meta.shape)} does not divide by mesh "
                                 f"{mesh.label} as {text}, and a dim the mesh does not divide is cut by one mesh "
                                 f"axis only, into nonempty pieces; pick a spec whose sharded dims divide")
        keep = [i for i, s in enumerate(cand.strategies) if s.out_spec == spec]
        if not keep:
            raise AutoshardError(f"--pin {name}={text}: no strategy of {cand.node.op or cand.node.kind.value} "
                                 f"{name!r} produces {text}; allowed: "
                                 f"{', '.join(sorted({s.out_spec.format(mesh.ndim) for s in cand.strategies}))}")
        cand.keep(keep)


def apply_boundary(candidates: dict[str, Candidate], layouts: Mapping[str, TensorSpec]) -> None:
    """Keep the strategies that receive (an input's layout) and send (an output operand's) the
    named tensors in the given layouts."""
    for cand in candidates.values():
        if cand.node.kind == NodeKind.OUTPUT:
            wanted = {k: layouts[src] for k, src in enumerate(cand.node.inputs) if src in layouts}
            keep = [i for i, s in enumerate(cand.strategies) if all(s.in_specs[k] == l for k, l in wanted.items())]
        elif cand.node.kind == NodeKind.INPUT and cand.node.name in layouts:
            keep = [i for i, s in enumerate(cand.strategies) if s.out_spec == layouts[cand.node.name]]
        else:
            continue
        if not keep:
            raise AutoshardError(f"no strategy of {cand.node.name} passes its tensors in the layouts of the "
                                 f"neighbouring pipeline stages: plan without --pipeline or with another mesh")
        cand.keep(keep)


def pin_expert_parallel(candidates: dict[str, Candidate], axis: int, mesh: Mesh) -> None:
    """Keep, for every op that routes tokens to experts, only the strategies exchanging them over ``axis``."""
    if not 0 <= axis < mesh.ndim or mesh.shape[axis] == 1:
        raise AutoshardError(f"--expert-parallel {axis}: mesh {mesh.label} has no axis {axis} of more than one device; "
                             f"name one of {', '.join(str(a) for a, n in enumerate(mesh.shape) if n > 1)}")
    routed = [c for c in candidates.values() if c.instance is not None and c.instance.exchange is not None]
    if not routed:
        raise AutoshardError(f"--expert-parallel {axis}: the model has no mixture-of-experts layer autoshard recognises "
                             f"(Hugging Face experts modules are fused into moe_experts nodes); drop the flag")
    for cand in routed:
        keep = [i for i, s in enumerate(cand.strategies) if s.exchange_axis == axis]
        if not keep:
            raise AutoshardError(f"--expert-parallel {axis}: {cand.node.module or cand.node.name} has no expert-parallel "
                                 f"layout on mesh axis {axis} (its experts or tokens do not divide by "
                                 f"{mesh.shape[axis]}); pick another axis or mesh")
        cand.keep(keep)
