"""A tiny torchtitan-style LLaMA (benchmarks/titan_llama.py's modules) traced for pipeline tests."""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from titan_llama import Transformer  # noqa: E402

from autoshard.frontend.graph import OpGraph  # noqa: E402
from autoshard.frontend.trace import trace  # noqa: E402


def tiny_llama(layers: int = 4) -> Transformer:
    """4 layers of dim 64 (4 heads, 2 K/V heads), vocabulary 256, 32 tokens."""
    torch.manual_seed(0)
    return Transformer(layers, 64, 4, 2, 128, 256, 32)


def traced(model: Transformer, batch: int) -> OpGraph:
    """The model with its loss traced on ``batch`` sequences."""
    tokens = torch.randint(0, 256, (batch, 32), generator=torch.Generator().manual_seed(0))
    return trace(model, (tokens, tokens.clone()))


@functools.lru_cache(maxsize=None)
def _tiny_llama_trace(layers: int, batch: int) -> OpGraph:
    return traced(tiny_llama(layers), batch)


def tiny_llama_graph(layers: int, batch: int) -> OpGraph:
    """``traced(tiny_llama(layers), batch)``, traced once per process (a trace takes seconds, a
    copy milliseconds): each call returns a copy of its own, so no test sees another's changes."""
    return copy.deepcopy(_tiny_llama_trace(layers, batch))
