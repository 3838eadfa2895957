"""Self-attention block: fused qkv projection, eager matmul + softmax attention, out projection,
residual add and post-LayerNorm (x [2, 16, 64], 4 heads)."""

import math

import torch
from torch import nn


class SelfAttentionBlock(nn.Module):
    """``layernorm(x + out(attention(qkv(x))))`` with the attention written out op by op."""

    def __init__(self, hidden: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        head_dim = hidden // self.heads
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(head_dim)
        context = torch.matmul(scores.softmax(dim=-1), v)
        context = context.transpose(1, 2).reshape(batch, seq, hidden)
        return self.norm(x + self.out(context))


torch.manual_seed(0)
model = SelfAttentionBlock()
example_inputs = (torch.randn(2, 16, 64),)
