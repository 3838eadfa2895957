"""End with one line before the out-of-memory killer ends the solver silently.

A problem too large for the machine (a 405B model on a 3-D mesh) used to grow until the kernel
killed the process: no plan, no message. :func:`start` runs a daemon thread that sums the
proportional set size (PSS: shared pages split among their sharers, so forked engines are not
counted twice) of this process and its descendants every half second, once their resident
sizes' sum (an upper bound of it, cheap to read) passes the limit. Past the limit — 90% of
the memory this process may use, the smaller of the machine's and its cgroup's, or
``AUTOSHARD_MEMORY_LIMIT`` bytes — it kills the descendants, prints one line naming what it
held and what to change, and exits with status 2. :func:`return_freed_blocks` makes the C
allocator give large freed blocks back to the system, so that what is resident is what is held.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

from autoshard.cost.units import format_bytes

LIMIT_ENV = "AUTOSHARD_MEMORY_LIMIT"
SHARE = 0.9
"""Fraction of the available memory the solver may hold."""
POLL_S = 0.5
PAGE = os.sysconf("SC_PAGE_SIZE")


def memory_limit() -> int | None:
    """Bytes this process tree may hold: ``AUTOSHARD_MEMORY_LIMIT``, else 90% of the smaller of
    MemTotal and the cgroup's memory.max (None where neither can be read)."""
    if os.environ.get(LIMIT_ENV):
        return int(float(os.environ[LIMIT_ENV]))
    bounds = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                bounds.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            bounds.append(int(text))
    return int(SHARE * min(bounds)) if bounds else None


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rindex(")") + 2:].split()[1])
            tree.setdefault(parent, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``."""
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _pss(pid: int) -> int:
    """Proportional set size of one process in bytes (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def held_bytes() -> int:
    """PSS of this process and all its descendants."""
    me = os.getpid()
    return sum(_pss(pid) for pid in [me, *descendants(me)])


def _rss(pid: int) -> int:
    """Resident set size of one process in bytes (0 once it is gone), from /proc/PID/statm."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def resident_bytes() -> int:
    """RSS of this process and all its descendants: at least :func:`held_bytes` (no process's PSS
    exceeds its RSS), read in constant time per process where PSS walks every mapping."""
    me = os.getpid()
    return sum(_rss(pid) for pid in [me, *descendants(me)])


def _watch(limit: int, started: float, advice: str) -> None:
    while True:
        time.sleep(POLL_S)
        if resident_bytes() <= limit:  # the PSS sum is no more
            continue
        held = held_bytes()
        if held <= limit:
            continue
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        sys.stdout.flush()
        sys.stderr.write(f"error: solving needs more memory than this machine lends it: {format_bytes(held)} "
                         f"held after {time.monotonic() - started:.0f} s, past the limit of {format_bytes(limit)} "
                         f"({LIMIT_ENV} sets it); {advice}\n")
        sys.stderr.flush()
        os._exit(2)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""glibc's ``mallopt`` parameters (malloc.h)."""
LARGE_BLOCK = 128 * 1024
"""Bytes from which an allocation gets a mapping of its own (glibc's initial default)."""


def return_freed_blocks() -> bool:
    """Have glibc give every freed block of at least LARGE_BLOCK bytes back to the system: by
    default it raises its mapping threshold to the largest block freed so far (up to 32 MiB), and
    from then on such blocks come from the heap, where freed ones stay resident. The solver frees
    arrays of megabytes by the thousand (the reductions' matrices); on 405B's core this kept
    0.5 GiB more resident at the search's peak. Process-wide; True where glibc took both settings."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK)) and bool(libc.mallopt(M_TRIM_THRESHOLD, LARGE_BLOCK))


def start(advice: str) -> None:
    """Watch this process tree's memory from now on (no-op where /proc cannot tell)."""
    limit = memory_limit()
    if limit is None or not Path(f"/proc/{os.getpid()}/smaps_rollup").exists():
        return
    threading.Thread(target=_watch, args=(limit, time.monotonic(), advice), daemon=True,
                     name="autoshard-memory-guard").start()
