"""``autoshard.run`` on a pipelined plan: one step of interleaved 1F1B with kept-gathered stages
(torchtitan's recipe on a 4-layer LLaMA, 2x2 gloo ranks) checked against the unsharded model."""

from __future__ import annotations

from pathlib import Path

from autoshard.runtime.kept import KeptParameters

from .dist import run_on_a_free_port
from .test_pipeline_interleaved import _plan_file
from .test_run import _main_on_ranks


def _losing_a_reduction(rank: int, world: int, port: int, argv: list[str]) -> int:
    """``main`` with a runtime that drops the first kept parameter's gradient reduction."""
    real = KeptParameters.reduce

    def reduce(self: KeptParameters) -> None:
        self.compute.get_parameter(self.names[0]).grad = None
        real(self)

    KeptParameters.reduce = reduce
    return _main_on_ranks(rank, world, port, argv)


def test_autoshard_run_checks_a_pipelined_plan_against_the_unsharded_model(tmp_path: Path) -> None:
    path, _ = _plan_file(tmp_path)
    argv = [str(path), "--plan", str(tmp_path / "interleaved.json")]
    assert run_on_a_free_port(4, _main_on_ranks, argv, timeout=180) == [0, 0, 0, 0]
    assert run_on_a_free_port(4, _losing_a_reduction, argv, timeout=180) == [1, 1, 1, 1]
