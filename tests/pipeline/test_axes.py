"""``--pipeline auto``: whether to pipeline and over which axis, searched with the rest, and why."""

from __future__ import annotations

import re
from pathlib import Path

from autoshard.cli.solve import main

ROOT = Path(__file__).resolve().parents[2]
META_MODEL = f'''import sys
sys.path.insert(0, {str(ROOT / "benchmarks")!r})
import torch
from titan_llama import Transformer

with torch.device("meta"):
    model = Transformer(4, 64, 4, 2, 128, 256, 32)
tokens = torch.zeros(8, 32, dtype=torch.long, device="meta")
example_inputs = (tokens, tokens.clone())
'''


UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def _seconds(text: str) -> float:
    number, unit = text.split()
    return float(number) * UNITS[unit]


def _why(out: str) -> dict[str, str]:
    line = next(line for line in out.splitlines() if line.startswith("Why this degree: "))
    return dict(part.split(": ", 1) for part in line.removeprefix("Why this degree: ").split("; "))


def test_auto_picks_an_axis_or_none_and_bounds_every_other(tmp_path: Path, capsys) -> None:
    """A meta-device LLaMA on 2x4 h100 under a budget: both axes and no pipeline are candidates;
    the chosen one's step is at most the least bound of every other (the claim is proved)."""
    path = tmp_path / "meta_llama.py"
    path.write_text(META_MODEL)
    code = main([str(path), "--mesh", "2x4", "--device", "h100", "--mode", "training", "--pipeline", "auto",
                 "--schedule", "1f1b", "--microbatches", "4", "--memory-budget", "3GiB", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    why = _why(out)
    assert set(why) == {"pipeline over axis 0 (2 devices)", "pipeline over axis 1 (4 devices)", "no pipeline"}
    chosen = [name for name, text in why.items() if text.startswith("chosen")]
    assert len(chosen) == 1 and "proved optimal over the 4 pipeline options" in out
    step = _seconds(re.search(r"chosen, step ([\d.]+ \w+)", why[chosen[0]]).group(1))
    for name, text in why.items():
        if name != chosen[0]:
            assert _seconds(re.search(r"least bound ([\d.]+ \w+) >= the chosen step", text).group(1)) >= step
