"""A plan lowered to one per-rank GraphModule: its nodes are the model's ops and the plan's
collectives, hidden gathers issued ahead, and it runs under torch.compile as one graph.

The structure is checked on programs lowered in this process under a fake process group (no
collective runs): one reshard node per plan edge that moves data or a gradient, each hidden
edge's gather issued before the layer ahead of its owner's starts and waited by its reshard,
and on one device nothing but the model's ops (on one rank in all, on plain parameters, step
after step as the model). The compiled programs run on forked gloo ranks
(dynamo and AOTAutograd, ``backend="aot_eager"``, so the test compiles in seconds; inductor
runs in ``test_train_compile.py``) for plans with every feature a graph carries: hidden edges
with their gradient reductions, recomputed and re-gathered layers, selective recomputation,
split query rows, a mean loss over a global count, an inference plan. Each is captured whole
(one graph, no break) and reproduces the unsharded model's outputs and gradients.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.fx as fx

from autoshard.api import build_model_problem
from autoshard.cost.communication import make_cost_model
from autoshard.problem.baselines.torchtitan import torchtitan_choice
from autoshard.problem.build import BuildOptions, build_problem
from autoshard.problem.readback import make_plan
from autoshard.runtime.checks import check_model, edge_label
from autoshard.runtime.executor import ParallelModule, parallelize
from autoshard.runtime.graph.calls import Issue, Reshard
from autoshard.runtime.groups import MeshGroups
from autoshard.runtime.overlap import _layers
from autoshard.sharding.mesh import parse_mesh

from .dist import run_ranks
from .plans import Traced, plans, reference, traced
from .test_executor import TOLERANCE, Case, _run_cases


def _fsdp_overlap(t: Traced, mesh: str, recompute: str = "none") -> Case:
    """torchtitan's plan (FSDP, re-gathered or recomputed layers) priced with overlap."""
    m = parse_mesh(mesh)
    options = BuildOptions(mode="training", overlap=True, memory_budget=10**15, recompute=recompute)
    mp = build_problem(t.graph, m, make_cost_model("alpha-beta", m), options)
    outputs, grads = reference(t, True)
    return Case(f"fsdp {recompute}", make_plan(mp, torchtitan_choice(mp), model=t.name), outputs, grads)


def _lowered(t: Traced, case: Case) -> ParallelModule:
    """The parallel module of rank 0 under a fake process group of the plan's world (nothing runs)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=case.plan.mesh.size)
    try:
        return parallelize(t.model, case.plan, MeshGroups.create(case.plan.mesh), graph=t.graph)
    finally:
        dist.destroy_process_group()


def _calls(module: fx.GraphModule) -> list[fx.Node]:
    return [n for n in module.graph.nodes if n.op in ("call_function", "call_method")]


def test_a_plan_is_one_graph_module_with_its_collectives_as_nodes() -> None:
    t = traced("llama")
    case = _fsdp_overlap(t, "2")
    plan = check_model(case.plan, t.graph)
    program = _lowered(t, case).program
    assert isinstance(program, fx.GraphModule)
    nodes = _calls(program)
    reshards = [n for n in nodes if isinstance(n.target, Reshard)]
    moving = [e for e in plan.edges if e.steps or e.grad_steps]
    assert sorted(n.target.label for n in reshards) == sorted(edge_label(e) for e in moving)
    position = {n: k for k, n in enumerate(nodes)}
    layer_of = _layers(t.graph)
    first_op = {}
    for n in nodes:
        layer = layer_of.get(n.name)
        if layer is not None and not isinstance(n.target, (Issue, Reshard)):
            first_op.setdefault(layer, position[n])
    issues = [n for n in nodes if isinstance(n.target, Issue)]
    hidden = [e for e in plan.edges if e.hidden and e.steps]
    assert hidden and len(issues) == len(hidden)
    for issue in issues:
        (user,) = issue.users
        edge = user.target.edge
        assert isinstance(user.target, Reshard) and user.args[1] is issue and user.target.label == issue.target.label
        layer = layer_of[edge.dst]
        assert position[issue] < first_op[max(layer - 1, 0)] and position[issue] < position[user], edge_label(edge)
        if layer > 0:  # the layer before the owner's computes while the gather travels
            assert first_op[layer - 1] < position[user], edge_label(edge)
    blocking = [n for n in reshards if len(n.args) == 1]
    assert {n.target.label for n in blocking} == {edge_label(e) for e in moving if not (e.hidden and e.steps)}


def test_on_one_device_the_program_is_the_models_ops() -> None:
    t = traced("attention")
    case = Case("one device", plans(t, "1", "training", 0)["megatron"], [], {})
    nodes = _calls(_lowered(t, case).program)
    assert not any(isinstance(n.target, (Issue, Reshard)) for n in nodes)
    assert len(nodes) == sum(1 for n in t.graph if n.kind.value == "op")


def _one_rank(rank: int, world: int, t: Traced, case: Case) -> tuple[set[type], bool, list]:
    """The parameter types of the plan's module on this rank, whether a second step after
    ``zero_grad`` gives the first step's gradients again, and ``_run_cases``'s outcome."""
    module = parallelize(t.model, case.plan, MeshGroups.create(case.plan.mesh), graph=t.graph)
    steps = []
    for _ in range(2):
        module(*t.inputs).sum().backward()
        steps.append({name: p.grad.clone() for name, p in module.named_parameters()})
        module.zero_grad()
    again = steps[0].keys() == steps[1].keys() and all(torch.equal(g, steps[1][n]) for n, g in steps[0].items())
    return {type(p) for p in module.parameters()}, again, _run_cases(rank, world, t, [case])


def test_with_one_rank_the_parameters_are_plain_and_train_as_the_model() -> None:
    """World size 1: each piece is the whole tensor, so the parameters are plain (no DTensor to
    wrap every use), and the program reproduces the model, step after step."""
    t = traced("attention")
    outputs, grads = reference(t, True)
    case = Case("one rank", plans(t, "1", "training", 0)["megatron"], outputs, grads)
    ((types, again, (outcome,)),) = run_ranks(1, _one_rank, t, case, timeout=120)
    assert types == {torch.nn.Parameter} and again
    bad = {name: err for name, (_, err) in outcome.errors.items() if not err <= TOLERANCE}
    assert not bad and len(outcome.errors) == len(outputs) + len(grads), bad


def _compiled_cases(rank: int, world: int, runs: list[tuple[Traced, list[Case]]]) -> list[list[tuple]]:
    """Per model and case, ``_run_cases``'s outcome with the program compiled (aot_eager), and
    dynamo's count of graphs and breaks (reset before each case, so each is its own count)."""
    import torch._dynamo.utils

    results = []
    for t, cases in runs:
        results.append([])
        for case in cases:
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
            (outcome,) = _run_cases(rank, world, t, [case], {"backend": "aot_eager"})
            counters = torch._dynamo.utils.counters
            results[-1].append((outcome, counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())))
    return results


def _counted_loss(t: Traced) -> Case:
    """A plan whose cross-entropy runs on split targets: its mean divides by the all-reduced count."""
    mp = build_model_problem(t.graph, "2", mode="training")
    loss = next(name for name in mp.names if mp.candidates[name].node.op == "cross_entropy_loss")
    choice = [0] * mp.problem.num_nodes
    choice[mp.names.index(loss)] = next(k for k, s in enumerate(mp.candidates[loss].strategies) if s.count_axes)
    plan = make_plan(mp, choice, model=t.name)
    assert plan.nodes[loss].count_steps
    outputs, grads = reference(t, True)
    return Case("counted mean", plan, outputs, grads)


def test_compiled_programs_reproduce_the_unsharded_model() -> None:
    llama, causal = traced("llama"), traced("causal")
    outputs, grads = reference(causal, True)
    inference = reference(causal, False)
    runs = [(llama, [_fsdp_overlap(llama, "2", policy) for policy in ("none", "full", "selective")]),
            (causal, [Case("context-parallel", plans(causal, "2", "training", 0)["context-parallel"], outputs, grads),
                      Case("inference", plans(causal, "2", "inference", 0)["megatron"], *inference)]),
            (traced("cnn_loss"), [_counted_loss(traced("cnn_loss"))])]
    assert any(e.regather for e in runs[0][1][0].plan.edges) and runs[0][1][1].plan.recompute
    assert runs[0][1][2].plan.recompute_kept
    # one group of ranks for every model: each rank pays dynamo's first-compile set-up once
    for rank, per_model in enumerate(run_ranks(2, _compiled_cases, runs, timeout=600)):
        for (_, cases), results in zip(runs, per_model, strict=True):
            for case, (outcome, graphs, breaks) in zip(cases, results, strict=True):
                assert (graphs, breaks) == (1, 0), f"{case.label}: {graphs} graphs, {breaks} breaks"
                bad = {name: err for name, (_, err) in outcome.errors.items() if not err <= TOLERANCE}
                assert not bad, f"{case.label}: relative errors above {TOLERANCE} on rank {rank}: {bad}"
                assert outcome.collectives == [], "a compiled program logs nothing"
