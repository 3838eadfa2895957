"""How an ``autoshard`` command-line process ends: flush, then ``os._exit``, skipping interpreter
finalization.

Two reasons, both about what finalization would do after the answer is out. The solver CLI holds
the Python objects of a 65k-node problem, whose teardown takes seconds. The torchrun entry points
(``autoshard.train``, ``autoshard.run``) have gloo worker threads that can still be dropping the
last collective's tensors after ``destroy_process_group``; a thread that needs the GIL while the
interpreter finalizes aborts the process (SIGABRT, "terminate called without an active
exception"), turning a finished run into a failed one.
"""

from __future__ import annotations

import os
import sys


def is_cli_process() -> bool:
    """True when this process runs as ``python -m autoshard...`` (not tests or notebooks)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and str(spec.name).startswith("autoshard.")


def exit_now(code: int) -> None:
    """Flush and end the process at once; in-process callers (tests) get a normal SystemExit instead."""
    if not is_cli_process():
        raise SystemExit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
