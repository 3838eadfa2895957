"""LLaMA-3.1-405B as torchtitan defines and benchmarks it (126 layers, dim 16384, 128/8 heads, FFN
53248, vocab 128256, bf16; 256 sequences of 8192 tokens, its loss in the model), on meta.

For solving only, e.g. torchtitan's Table 5 machine (512 H100 as 8x8x8) with a pipeline over
the outer axis:
``python -m autoshard.solve examples/llama3_405b.py --mesh 8x8x8 --pipeline 0 --mode training
--device h100-hbm2e --precision bf16-mixed --memory-budget 95GiB --recompute full``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from titan_llama import titan_llama3_405b  # noqa: E402


def build():
    """The model on meta and (tokens, labels)."""
    return titan_llama3_405b()
