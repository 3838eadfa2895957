"""LLaMA-3 as torchtitan defines it (torchtitan/models/llama3/model/model.py), for costing the runs
torchtitan published: the same modules and names (tok_embeddings, layers.N.attention.wq/wk/wv/wo,
feed_forward.w1/w2/w3, attention_norm, ffn_norm, norm, output), causal SDPA (``is_causal=True``,
so CUDA runs the flash kernel), K/V heads repeated before attention, and the loss on fp32 logits.
Rotary embedding is applied in its real (cos/sin) form instead of torchtitan's complex one: the
same flops and bytes in ops every tracer handles. Built on the meta device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """Grouped-query attention: wq/wk/wv, rotary, K/V repeated to every head, causal SDPA, wo."""

    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape
        q = self.wq(x).view(bs, seq, self.heads, self.head_dim)
        k = self.wk(x).view(bs, seq, self.kv_heads, self.head_dim)
        v = self.wv(x).view(bs, seq, self.kv_heads, self.head_dim)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        repeat = self.heads // self.kv_heads
        k = k.unsqueeze(3).expand(bs, seq, self.kv_heads, repeat, self.head_dim).reshape(bs, seq, self.heads, self.head_dim)
        v = v.unsqueeze(3).expand(bs, seq, self.kv_heads, repeat, self.head_dim).reshape(bs, seq, self.heads, self.head_dim)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on (batch, seq, heads, head_dim) in fp32, back in x's dtype (as torchtitan)."""
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + rotated * sin).type_as(x)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm attention and feed-forward with residuals."""

    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.attention = Attention(dim, heads, kv_heads)
        self.feed_forward = FeedForward(dim, hidden)
        self.attention_norm = nn.RMSNorm(dim, eps=eps)
        self.ffn_norm = nn.RMSNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Embedding, repeated blocks, final norm and output projection; the loss on fp32 logits."""

    def __init__(self, layers: int, dim: int, heads: int, kv_heads: int, hidden: int, vocab: int, seq: int,
                 eps: float = 1e-5, theta: float = 500000.0) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(TransformerBlock(dim, heads, kv_heads, hidden, eps) for _ in range(layers))
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.output = nn.Linear(dim, vocab, bias=False)
        half = dim // heads // 2
        freqs = 1.0 / theta ** (torch.arange(half, dtype=torch.float32) / half)
        angles = torch.outer(torch.arange(seq, dtype=torch.float32), freqs).repeat(1, 2)[None, :, None, :]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.cos, self.sin)
        logits = self.output(self.norm(h))
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def titan_llama3_8b(layers: int = 32, seq: int = 8192, batch: int = 16) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """torchtitan's LLaMA-3.1-8B (dim 4096, 32/8 heads, FFN 14336, vocab 128256) in bf16 with its
    loss, and (tokens, labels) of ``batch`` x ``seq``, on meta."""
    with torch.device("meta"):
        model = Transformer(layers, 4096, 32, 8, 14336, 128256, seq).to(torch.bfloat16)
    model.cos, model.sin = model.cos.float(), model.sin.float()
    tokens = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return model, (tokens, tokens.clone())


def titan_llama3_405b(layers: int = 126, seq: int = 8192, batch: int = 256) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """torchtitan's LLaMA-3.1-405B (dim 16384, 128/8 heads, FFN 53248, vocab 128256) in bf16 with
    its loss, and (tokens, labels) of ``batch`` x ``seq`` (torchtitan's Table 5: 256 x 8192), on meta."""
    with torch.device("meta"):
        model = Transformer(layers, 16384, 128, 8, 53248, 128256, seq).to(torch.bfloat16)
    model.cos, model.sin = model.cos.float(), model.sin.float()
    tokens = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return model, (tokens, tokens.clone())
