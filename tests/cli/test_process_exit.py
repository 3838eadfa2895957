"""The command-line entry points end without interpreter finalization (autoshard/cli/process.py).

Under torchrun, finalization raced gloo's worker threads still dropping the last collective's
tensors and aborted finished runs (SIGABRT in about one run in twelve); the abort itself is
timing-dependent, so this checks the deterministic part: an atexit handler never runs.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import atexit, runpy, sys
atexit.register(lambda: print("finalized", flush=True))
sys.argv = [{module!r}, *{args!r}]
runpy.run_module({module!r}, run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module, args", [
    ("autoshard.train", ["model.py", "--plan", "plan.json", "--steps", "1"]),
    ("autoshard.run", ["model.py", "--plan", "plan.json"]),
])
def test_torchrun_entry_points_skip_finalization(module: str, args: list[str]) -> None:
    """Outside torchrun each entry point refuses in one line with exit code 2, and leaves
    through os._exit: the atexit handler registered before it never prints."""
    done = subprocess.run([sys.executable, "-c", PROBE.format(module=module, args=args)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().startswith(f"{module}: error: RANK and WORLD_SIZE are not set"), done.stderr
    assert "finalized" not in done.stdout


def test_in_process_callers_get_a_normal_exit() -> None:
    """Tests and notebooks calling exit_now get SystemExit, so their own process goes on."""
    from autoshard.cli.process import exit_now

    with pytest.raises(SystemExit) as raised:
        exit_now(3)
    assert raised.value.code == 3
