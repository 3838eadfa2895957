"""How an ``autoshard`` command-line process ends: flush, then ``os._exit``, skipping interpreter
finalization; and how a torchrun worker refuses bad input (:func:`refuse`).

Two reasons, both about what finalization would do after the answer is out. The solver CLI holds
the Python objects of a 65k-node problem, whose teardown takes seconds. The torchrun entry points
(``autoshard.train``, ``autoshard.run``) have gloo worker threads that can still be dropping the
last collective's tensors after ``destroy_process_group``; a thread that needs the GIL while the
interpreter finalizes aborts the process (SIGABRT, "terminate called without an active
exception"), turning a finished run into a failed one.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Mapping

from autoshard.errors import AutoshardError

FIRST_RANK_WAIT_S = 15.0
"""How long a refusing torchrun worker other than local rank 0 waits for torchrun to end it."""


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


def refuse(command: str, error: AutoshardError, rank: int, environ: Mapping[str, str] = os.environ) -> int:
    """A torchrun worker's answer to bad input: exit status 2 and one line ``command: error: ...``.

    Rank 0 prints the line on stderr. Under torchrun (``TORCHELASTIC_ERROR_FILE`` set) the line also
    goes to that error file, which torchrun's failure report shows as the root cause's traceback.
    As soon as one worker exits torchrun kills the others, so a worker other than local rank 0
    first waits (at most ``FIRST_RANK_WAIT_S``) to be killed: rank 0 exits first, its line printed,
    and the report names it once. A worker still alive after the wait (rank 0 did not refuse)
    prints its own line.
    """
    line = f"{command}: error: {error}"
    error_file = environ.get("TORCHELASTIC_ERROR_FILE")
    waited = bool(error_file) and environ.get("LOCAL_RANK", "0") != "0"
    if waited:
        time.sleep(FIRST_RANK_WAIT_S)
    if rank == 0 or waited:
        print(line, file=sys.stderr, flush=True)
    if error_file:
        stamp = str(int(time.time()))
        with open(error_file, "w") as f:
            json.dump({"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": stamp}}}, f)
    return 2
