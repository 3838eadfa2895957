"""Every tensor keeps its identity from trace to plan to run, whatever order a process traces it in.

``TwoRotary`` has ModernBERT's pattern: one rotary table per attention kind, each from its own
``inv_freq`` buffer of one shape, computed in the order of ``kinds`` (ModernBERT iterates a
Python set, whose order changes with the process's string hashing). It also holds two buffers of
equal value and a weight tied under two names. Tracing it in both orders stands for two processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from autoshard.api import build_model_problem
from autoshard.errors import AutoshardError
from autoshard.frontend.graph import NodeKind
from autoshard.frontend.trace import trace
from autoshard.problem.baselines.megatron import megatron_choice
from autoshard.problem.identity import align, name_map, refined, structural_keys
from autoshard.problem.readback import make_plan
from autoshard.runtime.checks import check_layouts, check_model
from tests.differential.harness import findings, run_plans
from tests.runtime.dist import run_on_a_free_port
from tests.runtime.plans import Traced

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("full", "sliding")


class Rotary(nn.Module):
    """One rotary table, from its own ``inv_freq`` buffer."""

    def __init__(self, base: float) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / base ** (torch.arange(0, 16, 2) / 16))

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


class TwoRotary(nn.Module):
    """Embedding -> two attention-free layers scaled by per-kind rotary tables -> tied LM head."""

    def __init__(self, kinds: tuple[str, ...] = KINDS) -> None:
        super().__init__()
        self.kinds = kinds
        self.embed = nn.Embedding(32, 16)
        self.rotary = nn.ModuleDict({"full": Rotary(10000.0), "sliding": Rotary(100.0)})
        self.register_buffer("scale_a", torch.full((16,), 0.5))
        self.register_buffer("scale_b", torch.full((16,), 0.5))  # the same value as scale_a, its own buffer
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in KINDS)
        self.head = nn.Linear(16, 32, bias=False)
        self.head.weight = self.embed.weight  # one tensor, two names

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        tables = {kind: self.rotary[kind](positions) for kind in self.kinds}
        h = self.embed(tokens)
        for layer, kind, scale in zip(self.layers, KINDS, (self.scale_a, self.scale_b)):
            h = h + layer(h * tables[kind]) * scale
        return self.head(h)


def _traced(kinds: tuple[str, ...]) -> Traced:
    torch.manual_seed(0)
    model = TwoRotary(kinds).eval()
    inputs = (torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(1)),)
    return Traced("two_rotary", model, inputs, trace(model, inputs, "export"))


@pytest.fixture(scope="module")
def orders() -> tuple[Traced, Traced]:
    return _traced(KINDS), _traced(KINDS[::-1])


def _plan(t: Traced, mode: str = "training"):
    mp = build_model_problem(t.graph, "2x2", mode=mode)
    return make_plan(mp, megatron_choice(mp), model=t.name)


def _reader(graph, buffer: str) -> str:
    return next(n.name for n in graph if buffer in n.inputs)


def test_the_two_orders_name_the_buffers_readers_apart(orders) -> None:
    first, second = orders
    assert _reader(first.graph, "b_rotary_full_inv_freq") == _reader(second.graph, "b_rotary_sliding_inv_freq")
    buffers = [n.name for n in first.graph if n.kind == NodeKind.BUFFER]
    assert {"b_scale_a", "b_scale_b", "b_rotary_full_inv_freq", "b_rotary_sliding_inv_freq"} <= set(buffers)
    params = [n.qualname for n in first.graph if n.kind == NodeKind.PARAM]
    assert params.count("embed.weight") == 1 and "head.weight" not in params  # tied: one node


def test_a_plan_of_one_order_is_refused_unaligned_and_fits_the_other_aligned(orders) -> None:
    first, second = orders
    plan = _plan(first)
    with pytest.raises(AutoshardError, match="inconsistent"):
        check_layouts(plan, second.graph)
    moved = check_model(plan, second.graph)
    check_layouts(moved, second.graph)
    for buffer in ("b_rotary_full_inv_freq", "b_rotary_sliding_inv_freq", "b_scale_a", "b_scale_b"):
        assert plan.nodes[_reader(first.graph, buffer)].in_specs == moved.nodes[_reader(second.graph, buffer)].in_specs
    assert moved.param_specs == plan.param_specs and align(plan, first.graph) is plan


def test_an_aligned_plan_runs_equal_to_the_unsharded_model(orders) -> None:
    first, second = orders
    plans = {"megatron": _plan(first)}
    outcomes = run_plans(second, plans)
    # the collectives are logged under the names of the graph that ran
    assert findings({"megatron": check_model(plans["megatron"], second.graph)}, outcomes) == []


def test_equal_computations_are_told_apart_by_their_consumers() -> None:
    signature = ["x:None:(4,)", "a:None:(4,)", "b:None:(4,)", "u:neg:(4,)", "v:neg:(4,)", "p:mul:(4,)", "q:mul:(4,)"]
    inputs = {"u": ["x"], "v": ["x"], "p": ["u", "a"], "q": ["v", "b"]}
    keys = structural_keys(signature, inputs)
    assert keys["u"] == keys["v"] and keys["p"] != keys["q"]
    colours = refined(keys, inputs)
    assert colours["u"] != colours["v"] and len(set(colours.values())) == len(signature)


def test_a_plan_of_another_model_is_not_renamed(orders) -> None:
    first, _ = orders
    other = Traced("other", *_model_and_graph(nn.Sequential(nn.Linear(16, 16))))
    plan = _plan(first)
    assert name_map(plan, other.graph) is None
    with pytest.raises(AutoshardError, match="another model"):
        check_model(plan, other.graph)


def _model_and_graph(model: nn.Module) -> tuple[nn.Module, tuple[torch.Tensor], object]:
    inputs = (torch.randn(4, 16),)
    return model, inputs, trace(model, inputs, "fx")


MODERNBERT = '''import torch
from transformers import ModernBertConfig, ModernBertForMaskedLM


def build():
    torch.manual_seed(0)
    config = ModernBertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                              vocab_size=64, max_position_embeddings=32, global_attn_every_n_layers=2,
                              local_attention=8, attn_implementation="eager", pad_token_id=0, bos_token_id=1,
                              eos_token_id=2, cls_token_id=1, sep_token_id=2)
    return ModernBertForMaskedLM(config).eval(), (torch.randint(3, 64, (4, 16)),)


example_targets = torch.randint(3, 64, (4, 16), generator=torch.Generator().manual_seed(1))


def loss(outputs, labels):
    return torch.nn.functional.cross_entropy(outputs.logits.flatten(0, 1), labels.flatten())
'''


def _set_order(seed: int | None) -> list[str]:
    """The order a process with this string-hash seed iterates ModernBERT's set of layer kinds in."""
    env = dict(os.environ, PYTHONHASHSEED=str(seed))
    code = "print(','.join({'full_attention', 'sliding_attention'}))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip().split(",")


def _run_check(rank: int, world: int, port: int, argv: list[str]) -> int:
    from autoshard.cli.run import main

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    return main(argv)


def test_modernbert_solved_in_one_hash_order_passes_the_run_check_in_the_other(tmp_path) -> None:
    here = list({"full_attention", "sliding_attention"})
    seed = next(s for s in range(64) if _set_order(s) != here)
    model, plan = tmp_path / "modernbert.py", tmp_path / "plan.json"
    model.write_text(MODERNBERT)
    env = dict(os.environ, PYTHONHASHSEED=str(seed), OMP_NUM_THREADS="1")
    solved = subprocess.run([sys.executable, "-m", "autoshard.solve", str(model), "--mesh", "2", "--mode",
                             "training", "--quiet", "--out", str(plan), "--pin",
                             "model.layers.0.mlp.Wi.weight=SR"], env=env, capture_output=True, text=True, cwd=ROOT)
    assert solved.returncode == 0, solved.stderr
    assert run_on_a_free_port(2, _run_check, [str(model), "--plan", str(plan)], timeout=240) == [0, 0]
