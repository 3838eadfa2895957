"""Forked children and the pipes between them and the parent: the one place the solver forks.

C code (toulbar2, HiGHS) holds the GIL, runs past its own limits and prints to the C stdout; in
a forked child it can be killed at a wall-clock deadline and its prints sent nowhere. Every
fork is ``fork_child``'s; its users: ``call_forked`` (one call, abandoned at a deadline),
call_server.py (a child kept for call after call) and run/workers.py (the engines). Messages on a
pipe are pickles behind their length (8 bytes, little endian): ``send_frame`` and ``read_frame``.
"""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import select
import signal
import struct
import threading
from typing import Any, Callable, Sequence, TypeVar

from autoshard.solver.procs.clock import MONOTONIC, Clock

T = TypeVar("T")
LENGTH = struct.Struct("<Q")
"""The length prefix of a frame."""


def send_frame(fd: int, value: Any) -> None:
    """``value`` pickled behind its length, all of it, to the pipe fd."""
    body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    write_all(fd, LENGTH.pack(len(body)) + body)


def read_frame(fd: int) -> tuple[bool, Any]:
    """(True, the next frame's value), or (False, None) when the pipe closes before a whole frame."""
    head = read_exactly(fd, LENGTH.size)
    body = None if head is None else read_exactly(fd, LENGTH.unpack(head)[0])
    return (False, None) if body is None else (True, pickle.loads(body))


def read_exactly(fd: int, size: int) -> bytes | None:
    """``size`` bytes from fd, or None when it closes first."""
    chunks, have = [], 0
    while have < size:
        chunk = os.read(fd, min(1 << 20, size - have))
        if not chunk:
            return None
        chunks.append(chunk)
        have += len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to fd (a pipe takes it in pieces)."""
    view = memoryview(data)
    while len(view):
        view = view[os.write(fd, view):]


def fork_child(child: Callable[[], object], parent_ends: Sequence[int | None] = (),
               child_ends: Sequence[int | None] = ()) -> int:
    """Fork: the child closes the pipe ends the parent keeps (``parent_ends``), runs ``child()``
    and exits without returning (status 0, or 1 when it raised); the parent closes the child's
    ends (``child_ends``) and gets the child's pid. None entries are skipped. The child's garbage
    collector never visits the objects the parent had at the fork (``gc.freeze``): a collection
    writes to every object it visits, and each page it writes stops being shared with the parent."""
    ours = gc.get_freeze_count() == 0  # a caller's own frozen objects stay frozen
    if ours:
        gc.freeze()  # the parent's objects out of the child's collections: they stay shared pages
    pid = os.fork()
    if pid != 0 and ours:
        gc.unfreeze()
    if pid == 0:
        status = 1
        try:
            for fd in parent_ends:
                if fd is not None:
                    os.close(fd)
            child()
            status = 0
        finally:
            os._exit(status)
    for fd in child_ends:
        if fd is not None:
            os.close(fd)
    return pid


def call_forked(fn: Callable[[], T], until: float | None, idle: Callable[[], bool] | None = None,
                clock: Clock = MONOTONIC) -> T | None:
    """``fn()`` in a forked child (fds 0-2 on /dev/null), its result pickled back through a pipe:
    a call the caller can abandon at ``until`` (a reading of ``clock``), for C code (HiGHS) that runs
    past its own time limit and cannot be interrupted. None when the child failed, ``until``
    came first or ``idle()`` (called every 50 ms of waiting) returned True; the child is then
    killed."""
    read, write = os.pipe()
    pid = fork_child(lambda: _call_child(fn, write), [read], [write])
    chunks: list[bytes] = []
    try:
        while True:
            left = None if until is None else until - clock()
            if left is not None and left <= 0:
                return None
            ready, _, _ = select.select([read], [], [], 0.05 if left is None else min(0.05, left))
            if ready:
                chunk = os.read(read, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
            elif idle is not None and idle():
                return None
    finally:
        os.close(read)
        kill_and_reap(pid)
    try:
        return pickle.loads(b"".join(chunks)) if chunks else None
    except (pickle.UnpicklingError, EOFError):
        return None  # the child died while writing


def _call_child(fn: Callable[[], object], write: int) -> None:
    """The child of ``call_forked``: run ``fn`` and write its pickle."""
    quiet_child()
    write_all(write, pickle.dumps(fn(), protocol=pickle.HIGHEST_PROTOCOL))


def quiet_child() -> None:
    """A forked child's set-up for calls whose prints must go nowhere: it dies with its parent
    and its fds 0-2 are on /dev/null (``call_forked``, call_server.py)."""
    die_with_parent()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)


def kill_and_reap(pid: int) -> None:
    """SIGKILL a child and reap it in a daemon thread: waiting here would take as long as the
    kernel needs to free the child's memory."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    threading.Thread(target=_reap, args=(pid,), daemon=True).start()


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent ends (an os._exit at the deadline)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        os._exit(1)
