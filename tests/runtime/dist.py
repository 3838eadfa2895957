"""Fork-based multi-rank gloo harness: ``run_ranks(n, fn, *args)`` runs ``fn(rank, n, *args)`` on n CPU ranks.

Forked workers start in ~0.1 s where torchrun / mp.spawn cost seconds, so a test can afford a
fresh process group per case batch. Each worker pins torch to one thread (two cores, up to 8
ranks: more threads oversubscribe and collectives stall), joins gloo through a TCP store on a
free localhost port, and sends back its result or its traceback. When a rank fails its peers
are killed at once (they would only wait in a collective), and a run over ``timeout`` kills
everything, so a hang fails fast with the names of the ranks that were stuck.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

import torch
# Tensor.backward(grad) imports this (and sympy) lazily, ~1 s of CPU; importing it once here
# means forked workers inherit it instead of each paying for it on two shared cores.
import torch.fx.experimental.symbolic_shapes  # noqa: F401

from autoshard.runtime.groups import destroy_gloo, init_gloo


class RankError(RuntimeError):
    """A worker rank raised, died or hung; the message carries its traceback."""


def free_port() -> int:
    """A localhost TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int | None, timeout: float, conn: Connection,
            fn: Callable[..., Any], args: tuple) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    try:
        if port is not None:
            init_gloo(rank, world_size, port, timeout_s=timeout)
        result = fn(rank, world_size, *args)
        destroy_gloo()
        conn.send(("ok", result))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def run_ranks(world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 60.0,
              connect: bool = True) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` forked gloo ranks; return results by rank.

    ``fn`` and ``args`` reach the workers by fork (no pickling); results must be picklable.
    ``connect=False`` skips the gloo group (for work that makes its own, keeping this process clean).
    Raises :class:`RankError` with the worker traceback if any rank fails, dies or times out.
    """
    ctx = mp.get_context("fork")
    port = free_port() if connect else None
    procs, conns = [], {}
    for rank in range(world_size):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_worker, args=(rank, world_size, port, timeout, send, fn, args), daemon=True)
        p.start()
        send.close()
        procs.append(p)
        conns[recv] = rank
    results: dict[int, Any] = {}
    failure: str | None = None
    deadline = time.monotonic() + timeout
    try:
        while conns and failure is None:
            left = deadline - time.monotonic()
            if left <= 0:
                failure = f"ranks {sorted(conns.values())} of {world_size} did not finish within {timeout:.0f} s"
                break
            for conn in wait(list(conns), timeout=left):
                rank = conns.pop(conn)
                try:
                    status, value = conn.recv()
                except EOFError:
                    procs[rank].join(1)
                    status, value = "error", f"rank {rank} died with exit code {procs[rank].exitcode}"
                if status == "ok":
                    results[rank] = value
                else:
                    failure = f"rank {rank} failed:\n{value}"
                    break
    finally:
        for p in procs:
            p.join(0 if failure is not None else 5)
            if p.is_alive():
                p.kill()
                p.join()
    if failure is not None:
        raise RankError(failure)
    return [results[r] for r in range(world_size)]
