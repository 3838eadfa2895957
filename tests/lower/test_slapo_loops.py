"""Repeated layers' Slapo lines fold into ``for`` loops that run exactly the unfolded schedule."""

from __future__ import annotations

import torch

from autoshard.api import build_model_problem, default_solve_options, solve_model_problem
from autoshard.frontend.trace import trace
from autoshard.lower.slapo import schedule_lines


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Stack(torch.nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class Recorder:
    """Stands for Slapo's schedule: records every primitive called on every module."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getitem__(self, module: str) -> "Recorder":
        recorder = self

        class Module:
            def __getattr__(self, primitive: str):
                return lambda *args, **kwargs: recorder.calls.append((module, primitive, args,
                                                                      tuple(sorted(kwargs.items()))))
        return Module()


def _run(lines: list[str]) -> list[tuple]:
    sch = Recorder()
    exec("\n".join(lines), {"sch": sch})
    return sch.calls


def test_identical_layers_loop_and_run_the_same_primitives() -> None:
    layers = 6
    pins = {f"layers.{i}.up.weight": "SR" for i in range(layers)} | {f"layers.{i}.down.weight": "RS"
                                                                      for i in range(layers)}
    graph = trace(Stack(layers), (torch.randn(8, 32),), "fx")
    mp = build_model_problem(graph, "2", pins=pins)
    plan = solve_model_problem(mp, default_solve_options(mp, 60)).plan
    every, folded = schedule_lines(plan, graph, every=True), schedule_lines(plan, graph)
    assert len(folded) < len(every)
    loops = [line for line in folded if line.startswith("for i in range(")]
    assert loops and "layers.{" in loops[0]
    assert _run(folded) == _run(every)


def test_a_layer_with_a_sync_of_its_own_stays_in_the_loop_and_each_module_still_shards_first() -> None:
    from autoshard.lower.slapo import _loop_layers

    def layer(i: int) -> list[tuple[str, list[str]]]:
        return [(f"layers.{i}.up", [f'sch["layers.{i}.up"].shard("weight", axis=0)']
                 + ([f'sch["layers.{i}.up"].sync(mode="fwd_pre", sync_op_or_fn="RR->SR")'] if i == 0 else [])),
                (f"layers.{i}.down", [f'sch["layers.{i}.down"].shard("weight", axis=1)',
                                      f'sch["layers.{i}.down"].sync(mode="fwd_post", sync_op_or_fn="all_reduce")'])]

    blocks = [block for i in range(6) for block in layer(i)]
    every = [line for _, group in blocks for line in group]
    folded = _loop_layers(blocks)
    assert folded[0].startswith("for i in range(0, 6):") and len(folded) == 5
    calls, unfolded = _run(folded), _run(every)
    assert sorted(calls) == sorted(unfolded)
    for module in {call[0] for call in unfolded}:  # per module: the same primitives in the same order
        assert [c for c in calls if c[0] == module] == [c for c in unfolded if c[0] == module]


def test_comments_that_say_the_same_name_everything_they_concern_once_unless_every_is_asked() -> None:
    from autoshard.lower.slapo import _fill

    gradient = "# gradient of {} needs all_reduce"
    edge = "# rope -> {}: RR->SR has no module boundary to hook"
    notes = {gradient: {"layers.#.norm.weight": [f"layers.{i}.norm.weight" for i in range(4)],
                        "head.weight": ["head.weight"]},
             edge: {"index": ["index"], "index_1": ["index_1"]}}
    assert _fill(notes, every=False) == ["# gradient of layers.{0..3}.norm.weight, head.weight needs all_reduce",
                                         "# rope -> index, index_1: RR->SR has no module boundary to hook"]
    every = {gradient: {f"layers.{i}.norm.weight": [f"layers.{i}.norm.weight"] for i in range(2)},
             edge: {"index": ["index"], "index_1": ["index_1"]}}
    assert _fill(every, every=True) == ["# gradient of layers.0.norm.weight needs all_reduce",
                                        "# gradient of layers.1.norm.weight needs all_reduce",
                                        "# rope -> index: RR->SR has no module boundary to hook",
                                        "# rope -> index_1: RR->SR has no module boundary to hook"]
