"""graph_table: one row per op with parameter rows under their users."""

from __future__ import annotations

from rich.console import Console

from autoshard.frontend.table import graph_table
from tests.frontend.helpers import traced


def render(name: str) -> str:
    console = Console(record=True, width=160)
    console.print(graph_table(traced(name)))
    return console.export_text()


def test_mlp_table_lists_ops_and_their_parameters() -> None:
    text = render("mlp")
    assert "fx graph: 3 ops, 4 parameters" in text
    lines = [line for line in text.splitlines() if "linear" in line or "|-" in line]
    assert "|-fc1.weight" in lines[1] and "[4096, 1024]" in lines[1]
    assert "torch.nn.functional.linear" in lines[0] and "[8, 1024, 4096]" in lines[0]


def test_large_graph_table_renders_every_op() -> None:
    text = render("gpt2")
    graph = traced("gpt2")
    assert f"{sum(node.kind.value == 'op' for node in graph)} ops" in text
    assert "|-transformer.h.1.attn.c_attn.weight" in text
    assert text.count("|-transformer.wte.weight") == 2  # tied: under the embedding and the LM head
