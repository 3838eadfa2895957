"""Example models loaded and traced once per test session (HF traces cost about a second each)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from autoshard.frontend.load import LoadedModel, load_model

from autoshard.frontend.trace import trace
from autoshard.frontend.graph import OpGraph

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FX_EXAMPLES = ["mlp", "attention", "cnn", "cnn_loss"]
EXAMPLE_NAMES = [*FX_EXAMPLES, "gpt2", "bert", "llama"]


@cache
def loaded(name: str) -> LoadedModel:
    """The example ``examples/<name>.py`` loaded by the frontend's own loader."""
    return load_model(str(EXAMPLES / f"{name}.py"))


@cache
def traced(name: str, frontend: str = "auto") -> OpGraph:
    """The example traced with ``frontend`` (cached: tests do not mutate graphs)."""
    example = loaded(name)
    return trace(example.model, example.example_inputs, frontend)


@cache
def eager_outputs(name: str) -> tuple[torch.Tensor, ...]:
    """The tensors ``model(*example_inputs)`` returns, flattened."""
    example = loaded(name)
    with torch.no_grad():
        result = example.model(*example.example_inputs)
    return tuple(leaf for leaf in pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor))
