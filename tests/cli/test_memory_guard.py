"""A solve that outgrows its memory ends in one line and status 2, not in the out-of-memory killer's silence."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from autoshard.cli import memory_guard

ROOT = Path(__file__).resolve().parents[2]


def test_past_the_limit_the_solver_prints_one_line_and_exits_2() -> None:
    env = dict(os.environ, AUTOSHARD_MEMORY_LIMIT="100e6")
    done = subprocess.run([sys.executable, "-m", "autoshard.solve", "examples/mlp.py", "--quiet"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line]
    assert len(errors) == 1 and errors[0].startswith("error: solving needs more memory")
    assert "AUTOSHARD_MEMORY_LIMIT" in errors[0] and "smaller mesh" in errors[0]


def test_held_bytes_counts_forked_children_and_the_limit_reads_the_machine() -> None:
    before = memory_guard.held_bytes()
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(200 * 2**20); time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while memory_guard.held_bytes() < before + 150 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert child.pid in memory_guard.descendants(os.getpid())
        held = memory_guard.held_bytes()
        assert held >= before + 150 * 2**20
        assert memory_guard.resident_bytes() >= held  # the guard's cheap first test never misses a PSS past the limit
    finally:
        child.kill()
        child.wait()
    limit = memory_guard.memory_limit()
    assert limit is None or limit > 2**30


_LARGE_BLOCKS = """
import ctypes

from autoshard.cli import memory_guard


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
assert memory_guard.return_freed_blocks()
free = libc.malloc(1 << 24)  # raises glibc's dynamic threshold past 4 MiB once freed, unless it is fixed
libc.free(free)
before = libc.mallinfo2().hblkhd
block = libc.malloc(1 << 22)
assert libc.mallinfo2().hblkhd >= before + (1 << 22), "the 4 MiB block came from the heap"  # mapped: its free returns it
libc.free(block)
"""


def test_large_blocks_get_mappings_of_their_own_after_return_freed_blocks():
    """In a fresh process: glibc serves a request from a free chunk of the heap before it maps one,
    so a heap that earlier tests left with large free chunks would prove nothing."""
    done = subprocess.run([sys.executable, "-c", _LARGE_BLOCKS], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
