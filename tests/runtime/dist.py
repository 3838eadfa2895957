"""Fork-based multi-rank gloo harness: ``run_ranks(n, fn, *args)`` runs ``fn(rank, n, *args)`` on n CPU ranks.

Forked workers start in ~0.1 s where torchrun / mp.spawn cost seconds, so a test can afford a
fresh process group per case batch. Each worker pins torch to one thread (two cores, up to 8
ranks: more threads oversubscribe and collectives stall), joins gloo through a TCP store that rank 0 serves on a
socket the parent bound before forking, and sends back its result or its traceback. When a rank fails its peers
get a few seconds to report and are then killed (they would only wait in a collective); the error
leads with the ranks that failed on their own, ahead of peers that only saw a rank leave. A run
over ``timeout`` kills everything, so a hang fails fast with the names of the ranks that were stuck.
Each rank writes its stderr to a file of its own: a rank killed by a signal (a native abort in gloo
or the allocator, which no Python code can catch) is reported with the last lines it printed, and
the whole group is run once more, with a warning carrying that report; a second such death fails.
So ``fn`` must be safe to run again: where it resumes from files it wrote, it starts by clearing them.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
import traceback
import warnings
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

import torch
# Tensor.backward(grad) imports this (and sympy) lazily, ~1 s of CPU; importing it once here
# means forked workers inherit it instead of each paying for it on two shared cores.
import torch.fx.experimental.symbolic_shapes  # noqa: F401

from autoshard.runtime.groups import destroy_gloo, init_gloo


class RankError(RuntimeError):
    """A worker rank raised, died or hung; the message carries its traceback.

    ``killed`` is true where a rank was killed by a signal rather than failing in Python."""

    def __init__(self, message: str, killed: bool = False) -> None:
        super().__init__(message)
        self.killed = killed


def free_port() -> int:
    """A localhost TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_on_a_free_port(world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 60.0,
                       attempts: int = 3) -> list[Any]:
    """``run_ranks(world_size, fn, port, *args, connect=False)`` on a port free a moment ago, for
    ranks that make their own group on it: choosing the port and binding it cannot be one step, so
    where another test bound it first (EADDRINUSE) the run is repeated on a fresh one."""
    for attempt in range(attempts):
        try:
            return run_ranks(world_size, fn, free_port(), *args, timeout=timeout, connect=False)
        except RankError as err:
            if "EADDRINUSE" not in str(err) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def _worker(rank: int, world_size: int, listener: socket.socket | None, timeout: float, conn: Connection,
            stderr_fd: int, fn: Callable[..., Any], args: tuple) -> None:
    # pytest holds sys.stderr in memory and points faulthandler at the terminal: both go to this
    # rank's own file, so a native abort's last words (all threads' stacks) reach the report.
    os.dup2(stderr_fd, 2)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the rank
    faulthandler.enable(sys.stderr, all_threads=True)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    _fresh_compile_pool()
    try:
        if listener is not None:
            init_gloo(rank, world_size, listener.getsockname()[1], _HOST, timeout, listener.fileno())
        result = fn(rank, world_size, *args)
        if listener is not None and torch.distributed.is_initialized():
            # rank 0 serves the store: no rank tears down before every rank is done with it (ranks
            # whose work ended early left their peers' subgroup set-up on a closed store)
            torch.distributed.barrier()
        destroy_gloo()
        conn.send(("ok", result))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _fresh_compile_pool() -> None:
    """Inductor's thread pool for compiling kernels, where this process inherited one, is dropped
    so that a compile makes its own: torch resets its process pool after a fork but not its thread
    pool, whose threads did not survive the fork (a rank compiling after a test that compiled in the
    parent waited forever on a kernel no thread would build)."""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    if async_compile is not None:
        async_compile.AsyncCompile.pool.cache_clear()


_HOST = "127.0.0.1"
_GRACE_S = 3.0
_KILLED_RUNS = 2  # a group whose rank a signal killed runs once more
_STDERR_HEAD = 6000  # characters of a killed rank's stderr in the report (faulthandler prints innermost frames first)
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def _listener() -> socket.socket:
    """A localhost socket listening on a port the OS picked, for rank 0's store to serve on."""
    sock = socket.socket()
    sock.bind((_HOST, 0))
    sock.listen(128)
    return sock


def _receive(conn: Connection, proc: mp.process.BaseProcess, rank: int, stderr: Any) -> tuple[str, Any]:
    """One worker's ``(status, value)``; a worker that closed its pipe without a word died, and its
    report ends with the start of what it wrote to stderr (last words, then faulthandler's stacks)."""
    try:
        return conn.recv()
    except EOFError:
        proc.join(1)
        stderr.seek(0)
        head = stderr.read(_STDERR_HEAD).decode(errors="replace")
        status = "killed" if proc.exitcode is not None and proc.exitcode < 0 else "error"
        return status, f"rank {rank} died with exit code {proc.exitcode}; its stderr:\n{head}"


def _failure_report(failures: dict[int, str]) -> str:
    """Every failed rank's traceback, those that failed on their own first, peers that only saw a rank leave last."""
    def secondary(item: tuple[int, str]) -> bool:
        return any(sign in item[1] for sign in _PEER_GONE)
    ordered = sorted(failures.items(), key=lambda item: (secondary(item), item[0]))
    return "\n".join(value if rank < 0 else f"rank {rank} failed:\n{value}" for rank, value in ordered)


def run_ranks(world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 60.0,
              connect: bool = True) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` forked gloo ranks; return results by rank.

    ``fn`` and ``args`` reach the workers by fork (no pickling); results must be picklable.
    ``connect=False`` skips the gloo group (for work that makes its own, keeping this process clean).
    Raises :class:`RankError` with the worker traceback if any rank fails, dies or times out; a
    group with a rank killed by a signal is run once more first (see the module's docstring).
    """
    for run in range(_KILLED_RUNS):
        try:
            return _run_once(world_size, fn, args, timeout, connect)
        except RankError as err:
            if not err.killed or run == _KILLED_RUNS - 1:
                raise
            warnings.warn(f"a rank was killed by a signal; running the group again:\n{err}", stacklevel=2)
    raise AssertionError("unreachable: the last run returns or raises")


def _run_once(world_size: int, fn: Callable[..., Any], args: tuple, timeout: float, connect: bool) -> list[Any]:
    """One forked group of ranks running ``fn``; see :func:`run_ranks`."""
    ctx = mp.get_context("fork")
    # Rank 0 serves the TCP store on a socket the parent bound and listens on before forking, so no
    # other test running at the same time can take the port between choosing and binding it.
    listener = _listener() if connect else None
    procs, conns, stderrs = [], {}, []
    for rank in range(world_size):
        recv, send = ctx.Pipe(duplex=False)
        stderrs.append(tempfile.TemporaryFile())
        p = ctx.Process(target=_worker, args=(rank, world_size, listener, timeout, send, stderrs[rank].fileno(),
                                              fn, args), daemon=True)
        p.start()
        send.close()
        procs.append(p)
        conns[recv] = rank
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    killed = False
    deadline = time.monotonic() + timeout
    try:
        while conns:
            left = deadline - time.monotonic()
            if left <= 0:
                if not failures:
                    failures[-1] = f"ranks {sorted(conns.values())} of {world_size} did not finish within {timeout:.0f} s"
                break
            for conn in wait(list(conns), timeout=left):
                rank = conns.pop(conn)
                status, value = _receive(conn, procs[rank], rank, stderrs[rank])
                if status == "ok":
                    results[rank] = value
                else:
                    failures[rank] = value
                    killed = killed or status == "killed"
            if failures:
                # The first rank to fail often only saw a peer leave; give the others a moment to
                # report, so the message leads with the rank that failed for a reason of its own.
                deadline = min(deadline, time.monotonic() + _GRACE_S)
    finally:
        for p in procs:
            p.join(0 if failures else 5)
            if p.is_alive():
                p.kill()
                p.join()
        if listener is not None:
            listener.close()
        for stderr in stderrs:
            stderr.close()
    if failures:
        raise RankError(_failure_report(failures), killed)
    return [results[r] for r in range(world_size)]
