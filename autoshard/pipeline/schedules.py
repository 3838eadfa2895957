"""Pipeline schedules as data: each device's ordered forward and backward actions, and their timing.

A pipeline of ``p`` devices runs ``m`` microbatches through ``p * v`` stages; stage ``s`` lives on
device ``s % p`` (``v`` > 1: interleaved virtual stages, as Megatron-LM and
``torch.distributed.pipelining.ScheduleInterleaved1F1B`` place them). Each schedule is the order
in which a device runs its actions:

- ``gpipe``: every forward, then every backward;
- ``1f1b``: ``p - d - 1`` warm-up forwards on device ``d``, then one forward and one backward in
  turn, then the remaining backwards (PipeDream-Flush);
- ``interleaved-1f1b``: 1F1B over virtual stages, microbatches taken in groups of ``p`` and each
  group run through every chunk in turn (``m`` a multiple of ``p``).

Timing is the critical path of the dependency graph (a networkx DAG): an action starts when the
previous action on its device has finished and its input has arrived, i.e. the forward of stage
``s - 1`` (or the backward of stage ``s + 1``) of the same microbatch plus the point-to-point
transfer. The step is the longest path, bubbles included. The activations a device holds at its
fullest are the largest count of its forwards whose backward has not run yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import networkx as nx

from autoshard.errors import AutoshardError

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


@dataclass(frozen=True)
class Action:
    """One forward (``F``) or backward (``B``) of ``stage`` on ``microbatch``."""

    kind: str
    stage: int
    microbatch: int


@dataclass(frozen=True)
class Timing:
    """The step's critical path and, per device, its most microbatch-stages in flight at once."""

    step: float
    in_flight: tuple[int, ...]


def check_schedule(schedule: str, devices: int, microbatches: int, virtual: int) -> None:
    """Raise a one-line error for a schedule these counts cannot run."""
    if schedule not in SCHEDULES:
        raise AutoshardError(f"pipeline schedule {schedule!r} is unknown: use one of {', '.join(SCHEDULES)}")
    if devices < 1 or microbatches < 1 or virtual < 1:
        raise AutoshardError("a pipeline needs at least one device, microbatch and stage per device")
    if schedule != "interleaved-1f1b" and virtual != 1:
        raise AutoshardError(f"{schedule} runs one stage per device: use interleaved-1f1b for {virtual} per device")
    if schedule == "interleaved-1f1b" and microbatches % devices:
        raise AutoshardError(f"interleaved-1f1b takes microbatches in groups of the pipeline degree: "
                             f"use a multiple of {devices}, not {microbatches}")


def device_orders(schedule: str, devices: int, microbatches: int, virtual: int = 1) -> list[list[Action]]:
    """Every device's actions in the order the schedule runs them."""
    check_schedule(schedule, devices, microbatches, virtual)
    p, m, v = devices, microbatches, virtual
    orders = []
    for d in range(p):
        if schedule == "gpipe":
            orders.append([Action("F", d, i) for i in range(m)] + [Action("B", d, i) for i in range(m)])
            continue
        forwards = [_interleaved(k, d, p, v, backward=False) for k in range(m * v)]
        backwards = [_interleaved(k, d, p, v, backward=True) for k in range(m * v)]
        warmup = min(m * v, (p - d - 1) + (p - d - 1 if v > 1 else 0) + (v - 1) * p)
        order = forwards[:warmup]
        for i in range(m * v - warmup):
            order += [forwards[warmup + i], backwards[i]]
        orders.append(order + backwards[m * v - warmup:])
    return orders


def _interleaved(k: int, device: int, p: int, v: int, backward: bool) -> Action:
    """The ``k``-th forward (or backward) of ``device``: microbatches in groups of ``p``, each group
    through the chunks in order (backwards: in reverse)."""
    chunk = (k // p) % v
    if backward:
        chunk = v - 1 - chunk
    microbatch = (k // (p * v)) * p + k % p
    return Action("B" if backward else "F", chunk * p + device, microbatch)


def timing(orders: Sequence[Sequence[Action]], forward: Sequence[float], backward: Sequence[float],
           transfer: float = 0.0) -> Timing:
    """Critical path of running ``orders`` with per-stage forward and backward times, ``transfer``
    seconds for each point-to-point send between devices."""
    stages = len(forward)
    graph = nx.DiGraph()
    duration = {}
    for order in orders:
        for a in order:
            duration[a] = forward[a.stage] if a.kind == "F" else backward[a.stage]
        for a, b in zip(order, order[1:]):
            graph.add_edge(a, b, weight=duration[a])
    for a in duration:
        graph.add_edge("start", a, weight=0.0)
        graph.add_edge(a, "end", weight=duration[a])
        if a.kind == "F" and a.stage + 1 < stages:
            graph.add_edge(a, Action("F", a.stage + 1, a.microbatch), weight=duration[a] + transfer)
        elif a.kind == "F":
            graph.add_edge(a, Action("B", a.stage, a.microbatch), weight=duration[a])
        elif a.stage > 0:
            graph.add_edge(a, Action("B", a.stage - 1, a.microbatch), weight=duration[a] + transfer)
    if not nx.is_directed_acyclic_graph(graph):
        raise AutoshardError("this pipeline schedule waits on itself (a cycle of dependencies): use another")
    return Timing(nx.dag_longest_path_length(graph, weight="weight"), tuple(peak_in_flight(o) for o in orders))


def peak_in_flight(order: Sequence[Action]) -> int:
    """Most forwards run on a device whose backward has not."""
    live = peak = 0
    for a in order:
        live += 1 if a.kind == "F" else -1
        peak = max(peak, live)
    return peak
