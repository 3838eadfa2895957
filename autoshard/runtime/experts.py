"""Run a mixture-of-experts node (``moe_experts``, frontend/experts.py) on this rank's pieces.

The node's layout (``NodePlacement``) says which experts this rank holds (``gate_up``'s dim 0)
and which tokens (``hidden``'s dim 0). Without an ``exchange_axis`` the rank runs its experts on
its tokens (:func:`autoshard.frontend.experts.moe_experts` with its first expert): pairs routed to
experts held elsewhere add nothing, so over the axes splitting the experts the output is a
partial sum, as the plan expects. With an ``exchange_axis`` a (expert parallelism), the ranks
along a hold disjoint experts and disjoint tokens; each rank

1. sorts its token-expert pairs for the group's experts by (destination rank, its expert) and
   sends the counts (all_to_all_single, ``n * E_l`` int64: the ``counts`` exchange);
2. sends each pair's row to its expert's rank (all_to_all_single with those split sizes:
   ``dispatch``), regroups what it received by expert and runs its experts;
3. sends each result back (the split sizes reversed: ``combine``) and adds it, times its routing
   weight, to its token.

Dispatch and combine are autograd Functions whose backward is the reverse all_to_all_single of
the gradient (``combine``'s first, then ``dispatch``'s), so the token rows' gradients return to
their ranks and each rank's expert weights receive the whole gradient of the pairs it ran.
Every exchange is logged with the bytes this rank sent (``routed``: they depend on the routing).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.distributed as dist

from autoshard.frontend.experts import expert_mlp, moe_experts
from autoshard.frontend.graph import OpNode
from autoshard.problem.plan import NodePlacement
from autoshard.runtime.collectives import BACKWARD, FORWARD, CommLog, CommRecord
from autoshard.runtime.groups import MeshGroups
from autoshard.sharding.reshard import ALL_TO_ALL


def exchange_label(node: str) -> str:
    """How the collectives of an expert-parallel node's exchanges are named (``node:exchange``)."""
    return f"{node}:exchange"


class _AllToAll(torch.autograd.Function):
    """Rows to other ranks by ``send`` split sizes, theirs received by ``receive``; backward reversed."""

    @staticmethod
    def forward(ctx, rows, send, receive, group, axis, rank, log):  # type: ignore[override]
        ctx.args = (send, receive, group, axis, rank, log)
        return _exchange(rows, send, receive, group, axis, rank, log, FORWARD)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        send, receive, group, axis, rank, log = ctx.args
        return _exchange(grad, receive, send, group, axis, rank, log, BACKWARD), None, None, None, None, None, None


def _exchange(rows: torch.Tensor, send: list[int], receive: list[int], group: dist.ProcessGroup, axis: int, rank: int,
              log: CommLog, phase: str) -> torch.Tensor:
    """One all_to_all_single of ``rows`` (first dim split by ``send``), logged with the bytes sent to others."""
    out = rows.new_empty((sum(receive), *rows.shape[1:]))
    dist.all_to_all_single(out, rows.contiguous(), receive, send, group=group)
    row_bytes = math.prod(rows.shape[1:]) * rows.element_size()
    log.records.append(CommRecord(ALL_TO_ALL, axis, (sum(send) - send[rank]) * row_bytes, phase, routed=True))
    return out


def run_experts(operands: Sequence[torch.Tensor], node: OpNode, place: NodePlacement, groups: MeshGroups,
                log: CommLog | None) -> torch.Tensor:
    """This rank's piece of the node's output under its placement (see the module doc); ``log``
    records the exchanges (required with an ``exchange_axis``)."""
    hidden, index, weights, gate_up, down = operands
    activation = node.attrs["activation"]
    held = gate_up.shape[0]
    first = place.in_specs[3].chunk_index(0, groups.coords, groups.mesh.shape) * held
    if place.exchange_axis is None:
        return moe_experts(hidden, index, weights, gate_up, down, activation, first)
    axis = place.exchange_axis
    n, rank = groups.axis_size(axis), groups.coords[axis]
    group = groups.groups[axis]
    tokens, k = index.shape
    ids = index.reshape(-1) - (first - rank * held)  # the exchange axis is the experts' minor axis
    pairs = ((ids >= 0) & (ids < n * held)).nonzero().squeeze(1)
    key, order = torch.sort(ids[pairs], stable=True)  # by destination rank, then its expert
    pairs = pairs[order]
    send_counts = torch.bincount(key, minlength=n * held)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    log.records.append(CommRecord(ALL_TO_ALL, axis, (n - 1) * held * send_counts.element_size(), FORWARD))
    send = send_counts.view(n, held).sum(1).tolist()
    receive = recv_counts.view(n, held).sum(1).tolist()
    received = _AllToAll.apply(hidden[pairs // k], send, receive, group, axis, rank, log)
    by_expert = _expert_major(recv_counts.view(n, held))
    y = expert_mlp(received[by_expert], gate_up, down, recv_counts.view(n, held).sum(0).cumsum(0), activation)
    back = _AllToAll.apply(y[torch.argsort(by_expert)], receive, send, group, axis, rank, log)
    weighted = back * weights.reshape(-1)[pairs].unsqueeze(-1)
    out = weighted.new_zeros(tokens, hidden.shape[-1]).index_add(0, pairs // k, weighted)
    return out.to(hidden.dtype)


def _expert_major(counts: torch.Tensor) -> torch.Tensor:
    """Positions of received rows (blocks by source rank, then expert) in expert-major order."""
    starts = (counts.flatten().cumsum(0) - counts.flatten()).view_as(counts)
    blocks = [torch.arange(int(starts[s, e]), int(starts[s, e] + counts[s, e]))
              for e in range(counts.shape[1]) for s in range(counts.shape[0])]
    return torch.cat(blocks) if blocks else torch.zeros(0, dtype=torch.long)
