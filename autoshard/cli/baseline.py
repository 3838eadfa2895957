"""``--baseline``: a plan people run, costed in the same model as ours and printed beside it."""

from __future__ import annotations

from typing import Any

from rich.console import Console


def cost_text(mp: Any, ticks: int) -> str:
    """``131072 elements`` or ``93.2 us (93200000 ps)``."""
    if mp.cost_model.unit == "s":
        return f"{mp.cost_model.format(ticks)} ({ticks} ps)"
    return f"{ticks} {mp.cost_model.unit}"


def print_baseline(mp: Any, ours: int, console: Console, which: str, replicated: str) -> None:
    """A hand-written plan costed in the same model, beside ours (ours can never be higher once proved);
    when ours shards nothing (``replicated`` says why), a ratio would read as a win of sharding, so the
    line says so instead."""
    name, choose = BASELINES[which]
    choice = choose(mp)
    cost = mp.problem.cost(choice)
    fits = "" if mp.problem.is_feasible(choice) else " (does not fit the memory budget)"
    if replicated:
        console.print(f"{name} baseline: {cost_text(mp, cost)}{fits}; ours {cost_text(mp, ours)}, {replicated}",
                      highlight=False)
        return
    console.print(f"{name} baseline: {cost_text(mp, cost)}{fits}; ours {cost_text(mp, ours)} = "
                  f"{ours / cost:.3f}x {name}", highlight=False)


def _megatron(mp: Any) -> list[int]:
    from autoshard.problem.baselines.megatron import megatron_choice

    return megatron_choice(mp)


def _torchtitan(mp: Any) -> list[int]:
    from autoshard.problem.baselines.torchtitan import torchtitan_choice

    return torchtitan_choice(mp)


BASELINES = {"megatron": ("Megatron", _megatron), "torchtitan": ("torchtitan", _torchtitan)}
"""``--baseline`` choices: (name printed, function giving its choice)."""
