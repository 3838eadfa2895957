"""What the profile measures depends on how a GPU lays out and keeps tensors, not on the CPU's path.

The references are torch's own rules: a reshape of an expanded tensor must copy, fused attention
returns its output in the query's layout (so the usual transpose-and-reshape back is a view), and
CUDA's ``_fused_rms_norm`` keeps its input, its weight and one fp32 reciprocal RMS per row
(``derivatives.yaml``), allocating nothing but its two outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autoshard.frontend.graph import NodeKind, OpGraph
from autoshard.frontend.trace import trace

B, S, H, KV, D = 2, 64, 4, 2, 16


class GroupedAttention(nn.Module):
    """Keys and values repeated to every query head (expand + reshape), fused attention, output projection."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(H * D)
        self.q = nn.Linear(H * D, H * D, bias=False)
        self.kv = nn.Linear(H * D, KV * D, bias=False)
        self.out = nn.Linear(H * D, H * D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        q = self.q(h).view(B, S, H, D)
        k = self.kv(h).view(B, S, KV, 1, D).expand(B, S, KV, H // KV, D).reshape(B, S, H, D)
        attended = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2), is_causal=True)
        return self.out(attended.transpose(1, 2).reshape(B, S, H * D))


def _graph() -> OpGraph:
    return trace(GroupedAttention(), (torch.randn(B, S, H * D, requires_grad=True),))


def _ops(graph: OpGraph, op: str) -> list:
    return [n for n in graph if n.kind is NodeKind.OP and n.op == op]


def test_a_reshape_of_an_expanded_tensor_is_a_copy_and_one_of_attentions_output_a_view() -> None:
    graph = _graph()
    repeated, back = _ops(graph, "reshape")
    assert repeated.work.alias_of is None
    assert back.work.alias_of == 0
    attention = _ops(graph, "scaled_dot_product_attention")[0]
    assert graph[attention.inputs[1]].name.startswith("transpose")
    assert repeated.name in {graph[attention.inputs[k]].inputs[0] for k in (1, 2)}


def test_rms_norm_keeps_its_input_and_an_fp32_statistic_per_row_as_cuda_does() -> None:
    norm = _ops(_graph(), "rms_norm")[0]
    assert norm.work.saved_operands == (0, 1)
    assert norm.work.saved_other_bytes == B * S * 4
    assert norm.work.temporary_bytes == B * S * 4  # the kernel's second output, dropped by rms_norm
    assert not norm.work.saves_output
