"""Pipeline x tensor parallelism trains like one device: a 4-layer torchtitan LLaMA on 2x2 gloo ranks.

Mesh axis 0 is a two-stage 1F1B pipeline (two layers and the embedding, two layers and the
head), two microbatches per step; each stage runs Megatron's tensor-parallel plan over axis 1.
Five AdamW steps must give the unsharded loop's losses, step 1 its gradients, and every rank
must send and receive exactly what its stage's plan charged: the point-to-point pieces and the
collectives, once per microbatch.
"""

from __future__ import annotations

from pathlib import Path

import torch

from autoshard.cost.devices import get_device
from autoshard.frontend.graph import NodeKind
from autoshard.frontend.load import load_model
from autoshard.frontend.trace import trace
from autoshard.pipeline.search import PipelineOption, PipelineSearch, boundary_of
from autoshard.pipeline.stages import stage_layouts
from autoshard.problem.baselines.megatron import megatron_choice
from autoshard.problem.readback import make_plan
from autoshard.runtime.checks import expected_collectives, same_collectives
from autoshard.runtime.executor import gather_full, local_of
from autoshard.runtime.pipeline import PipelineRunner, expected_transfers
from autoshard.sharding.mesh import parse_mesh

from .dist import run_ranks
from .test_train import TOLERANCE, _worst
from .test_train_context import MODEL

STEPS, MICROBATCHES, LR = 5, 2, 3e-3


def _stages(path: Path):
    path.write_text(MODEL)
    loaded = load_model(str(path))
    mesh = parse_mesh("2x2")
    engine = PipelineSearch(lambda m: trace(loaded.model, tuple(t.narrow(0, 0, t.shape[0] // m)
                                                                 for t in loaded.example_inputs)),
                            mesh, 0, dict(mode="training", device=get_device(None)), None)
    option = PipelineOption("1f1b", 2, MICROBATCHES, 1, (2, 2))
    stages = engine.stages(option)
    plans = []
    for d, stage in enumerate(stages):  # stage 1 receives in the layout stage 0 sends in
        sent = {stages[0].graph[n].tensor: spec for n, spec in stage_layouts(stages[0].graph, plans[0])[1].items()} \
            if d else {}
        mp = engine.stage_problem(option, stage, 2 - d, boundary=boundary_of(stage, sent))
        plans.append(make_plan(mp, megatron_choice(mp), model=f"stage{d}"))
    assert any(spec.used_axes for spec in plans[0].param_specs.values())  # tensor parallel, not replicated
    inputs = [n.name for n in engine.graph(MICROBATCHES) if n.kind == NodeKind.INPUT]
    return loaded, mesh, [s.graph for s in stages], plans, inputs


def _train(rank: int, world: int, loaded, mesh, graphs, plans, inputs) -> dict:
    runner = PipelineRunner(loaded.model, graphs, plans, mesh, 0, "1f1b", MICROBATCHES, inputs)
    params = [p for p in runner.module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR)
    losses, grads = [], {}
    for step in range(1, STEPS + 1):
        optimizer.zero_grad(set_to_none=True)
        runner.reset_log()
        loss = runner.step(loaded.step_batch(step))
        if step == 1:
            grads = {name: gather_full(local_of(p.grad), runner.module.param_specs[name], runner.groups).numpy()
                     for name, p in runner.module.named_parameters()}  # numpy: tensors do not outlive a fork
            transfers, collectives = runner.transfers(), runner.module.collectives()
        optimizer.step()
        if loss is not None:
            spec = runner.loss_spec
            losses.append(float(loss) if spec.is_replicated else float(gather_full(loss, spec, runner.groups)))
    return {"device": runner.device, "losses": losses, "grads": grads, "transfers": transfers,
            "collectives": collectives}


def _reference(loaded) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = loaded.model
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    losses, grads = [], {}
    for step in range(1, STEPS + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = model(*loaded.step_batch(step))
        loss.backward()
        if step == 1:
            grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, grads


def test_pipeline_with_tensor_parallel_follows_single_device_training(tmp_path: Path) -> None:
    loaded, mesh, graphs, plans, inputs = _stages(tmp_path / "titan_tiny.py")
    results = run_ranks(4, _train, loaded, mesh, graphs, plans, inputs, timeout=180)
    losses, grads = _reference(load_model(str(tmp_path / "titan_tiny.py")))
    seen = set()
    for result in results:
        d = result["device"]
        if d == 1:
            assert _worst(result["losses"], losses) <= TOLERANCE
        for name, grad in result["grads"].items():
            seen.add(name)
            assert torch.allclose(torch.from_numpy(grad), grads[name], rtol=1e-4, atol=1e-6), name
        assert result["transfers"] == expected_transfers(graphs[d], plans[d], MICROBATCHES, d == 0, d == 1)
        assert same_collectives(result["collectives"], expected_collectives(plans[d]) * MICROBATCHES)
    assert seen == set(grads)
