"""toulbar2 (cost-function-network branch and bound) on the reduced core.

The core is a weighted CSP as it stands: one variable per node (its local strategies), a unary
cost function per node and a binary one per edge (forbidden entries at toulbar2's top cost), and
each memory row r a knapsack constraint

    sum_{i live on r} usage_{i,r}[x_i] <= capacity_r        (written as  sum -usage >= -capacity)

so toulbar2's optimum is the core's (``exact``); cores with more row terms than MAX_ROW_TERMS are
not given to it. Its search (hybrid best-first with soft arc consistency bounds, dead-end
elimination, variable elimination of small degree) is what our TRW-S / elimination / z3 portfolio
approximates, and it is much faster on every core that fits (measured: see benchmarks/README.md,
"Measurements behind the design").

It runs in a child process (run/workers.py), which calls ``solve_cfn``; the second-search engine there
also calls ``solve_penalised`` on its Lagrangian subproblems (costs plus multipliers times
usage, no rows), which toulbar2 minimises far better than TRW-S's rounded plan on wide cores.
Large-neighbourhood search (lns.py, in either process) calls ``improve`` on restricted problems.
"""

from __future__ import annotations

import os

import numpy as np

from autoshard.solver.core.flat_core import views
from autoshard.solver.core.reduced import INF, FrozenCore
from autoshard.solver.procs.silence import silenced

MAX_ROW_TERMS = 100_000
"""Cores whose memory rows hold more (row, node, strategy) terms in total are not given to
toulbar2: beyond this its knapsack constraints find no plan in minutes where HiGHS proves the
core in seconds (measured: see benchmarks/README.md, "Measurements behind the design")."""
MAX_EXACT_COST = 2**53
"""toulbar2 reads costs as doubles: a core with a finite cost at or above this stays ours."""


MAX_TABLE_ENTRIES = 100_000_000
"""Cores whose cost tables hold more entries are not given to toulbar2: its network copies every
table (a core of LLaMA-3.1-405B on 8x8x8, ~400M entries, took a child past 10 GiB)."""


def row_terms(comp: FrozenCore) -> int:
    """Total (row, node, strategy) terms the knapsack rows of ``comp`` would hold."""
    if comp.capacity is None:
        return 0
    return sum((stop - start) * int(np.count_nonzero(u)) for segs in comp.segments for start, stop, u in segs)


def table_entries(comp: FrozenCore) -> int:
    """Entries of the cost tables toulbar2's network of ``comp`` would hold (each its own copy)."""
    return sum(len(c) for c in comp.costs) + sum(m.size for _, _, m in comp.edges)


def can_take(comp: FrozenCore, rows: bool = True) -> bool:
    """True when toulbar2 can solve ``comp`` exactly and well (rows small, tables that fit in
    memory, costs exact in doubles); with ``rows`` False, the core without its memory rows."""
    if comp.n == 0 or (rows and row_terms(comp) > MAX_ROW_TERMS) or table_entries(comp) > MAX_TABLE_ENTRIES:
        return False
    top = max((int(np.where(c < INF, c, 0).max()) for c in comp.costs), default=0)
    top = max([top] + [int(np.where(m < INF, m, 0).max()) for _, _, m in comp.edges])
    return top < MAX_EXACT_COST


def solve_cfn(comp: FrozenCore, upper: int | None, seed: int, vns: bool = False,
              rows: bool = True) -> list[int] | None:
    """Build the network of ``comp`` and let toulbar2 search it, printing each better plan and
    bound as it goes: hybrid best-first branch and bound (exact), or with ``vns`` variable-
    neighbourhood search from its first depth-first plan (plans only); without ``rows`` the
    memory rows are left out (a relaxation). Returns the best plan (local strategies) when the
    search ends, or None when it found none cheaper than ``upper`` (none at all without it).
    A relative gap is the caller's to watch: pytoulbar2 sets ``relgap`` only to whole numbers."""
    ub = None if upper is None else float(upper - comp.const)
    cfn = _solver(ub, seed, vns, verbose=0)
    cfn.Option.showSolutions = 1
    _network(cfn, comp, comp.costs, rows)
    found = cfn.Solve(showSolutions=1)
    os.write(1, b"\n")  # ends toulbar2's last progress line
    return None if found is None else [int(v) for v in found[0]]


def solve_penalised(comp: FrozenCore, penalty: np.ndarray, seconds: int, seed: int) -> np.ndarray | None:
    """The best plan toulbar2's neighbourhood search finds in ``seconds`` (CPU) for the core's
    costs plus ``penalty`` (per strategy, flat as in ``FrozenCore.arrays``), memory rows left out:
    the Lagrangian subproblem of lagrangian.py solved as a cost-function network (the contest
    winner's method), or None when it found none in time. No upper bound is given (the best
    fitting plan's penalised cost as one did worse; measured: see benchmarks/README.md,
    "Measurements behind the design")."""
    a = comp.arrays
    unary = views(np.where(a.costs < INF, np.round(a.costs.astype(np.float64) + penalty), INF), a.c_off)
    with silenced():
        cfn = _solver(None, seed, vns=True)
        _network(cfn, comp, unary)
        found = _timed_solve(cfn, seconds)
    return None if found is None else np.asarray(found[0], dtype=np.int64)


def prove_penalised(comp: FrozenCore, penalty: np.ndarray, seconds: int, seed: int) -> tuple[np.ndarray, bool] | None:
    """toulbar2's branch and bound (HBFS) on the core's costs plus ``penalty`` (integers, flat as
    in ``FrozenCore.arrays``), memory rows left out, for up to ``seconds`` (CPU): its best plan
    and whether it proved it minimal, or None when it found none."""
    unary = _penalised(comp, penalty)
    return None if unary is None else _proved_minimum(comp, unary, None, False, seconds, seed)


def prove_below(comp: FrozenCore, penalty: np.ndarray, upper: float, seconds: int,
                seed: int) -> tuple[np.ndarray | None, bool] | None:
    """As ``prove_penalised``, for plans whose penalised cost (constant included) is below
    ``upper`` (a known plan's: the search prunes by it from the start): (the cheapest such plan,
    True) when proved, (None, True) when proved that none is, (plan or None, False) when the time
    ran out; None when the costs are not exact in doubles."""
    unary = _penalised(comp, penalty)
    return None if unary is None else _search(comp, unary, float(upper - comp.const), False, seconds, seed)


def _penalised(comp: FrozenCore, penalty: np.ndarray) -> list[np.ndarray] | None:
    """The core's node costs plus ``penalty`` (flat as in ``FrozenCore.arrays``) in doubles, per
    node; None where doubles no longer hold them exactly."""
    a = comp.arrays
    flat = np.where(a.costs < INF, a.costs.astype(np.float64) + penalty, INF)
    if np.where(flat < INF, flat, 0).max(initial=0) >= MAX_EXACT_COST:
        return None
    return views(flat, a.c_off)


def prove_among(comp: FrozenCore, allowed: list[np.ndarray], upper: int, seconds: int,
                seed: int) -> tuple[np.ndarray, bool] | None:
    """toulbar2's branch and bound on the core (memory rows as knapsack constraints) with only
    the ``allowed`` strategies of each node, for plans costing at most ``upper``, for up to
    ``seconds`` (CPU): its best plan and whether it proved it the cheapest such plan, or None
    when it found none."""
    unary = [np.where(np.isin(np.arange(len(c)), keep), c, INF) for c, keep in zip(comp.costs, allowed)]
    return _proved_minimum(comp, unary, float(upper + 1 - comp.const), True, seconds, seed)


def _proved_minimum(comp: FrozenCore, unary: list[np.ndarray], ub: float | None, rows: bool, seconds: int,
                    seed: int) -> tuple[np.ndarray, bool] | None:
    """toulbar2's branch and bound (HBFS) on ``comp`` with node costs ``unary``, plans below
    ``ub`` (the network's own units, constant left out; None: any), ``rows`` its memory rows as
    knapsack constraints, for up to ``seconds`` (CPU): its best plan and whether its search ended
    unlimited (proved minimal), or None when it found none."""
    found, proved = _search(comp, unary, ub, rows, seconds, seed)
    return None if found is None else (found, proved)


def _search(comp: FrozenCore, unary: list[np.ndarray], ub: float | None, rows: bool, seconds: int,
            seed: int) -> tuple[np.ndarray | None, bool]:
    """``_proved_minimum``'s search: its best plan (None when it found none) and whether the search
    ended unlimited; a network closed in preprocessing has no plan below ``ub``, proved.

    The proof is toulbar2's own verdict (``option.limited`` false after the solve: no time,
    discrepancy or restart limit cut the search), not ``GetDDualBound``, which is its gap
    display's bookkeeping and is left unset by a network closed in preprocessing."""
    import pytoulbar2

    with silenced():
        cfn = _solver(ub, seed, vns=False)
        _network(cfn, comp, unary, rows=rows)
        try:
            found = _timed_solve(cfn, seconds)
        except pytoulbar2.Contradiction:  # every plan forbidden, or none below ub
            return None, True
    proved = not cfn.Option.limited  # type: ignore[attr-defined]
    return (None if found is None else np.asarray(found[0], dtype=np.int64)), proved


def improve(comp: FrozenCore, x: np.ndarray, seconds: int, seed: int) -> np.ndarray | None:
    """A plan of ``comp`` that fits and costs less than x, by toulbar2's branch and bound with the
    memory rows as knapsack constraints and x's cost as the upper bound, within ``seconds`` (CPU);
    None when there is none or none was found in time. Large-neighbourhood search (lns.py) calls
    it on restricted problems, which ``can_take`` far more often than the whole core."""
    with silenced():
        cfn = _solver(float(comp.cost(x) - comp.const), seed, vns=False)
        _network(cfn, comp, comp.costs, rows=True)
        found = _timed_solve(cfn, seconds)
    return None if found is None else np.asarray(found[0], dtype=np.int64)


def _solver(ub: float | None, seed: int, vns: bool, verbose: int = -1) -> object:
    """A pytoulbar2 network whose search is the one asked for, whatever this process solved
    before: toulbar2's options are process-wide, ``CFN`` sets the neighbourhood search's
    (``lds``, ``restart``, ``searchMethod``) only when asked for it and never clears them, and
    its solver object is chosen by ``searchMethod`` when it is built, so they are reset first;
    a branch and bound built after a neighbourhood search would otherwise be one and never
    prove. Also clears ``limited``, which a network closed in preprocessing never clears, and
    the relative gap (0: prove)."""
    import pytoulbar2

    option = pytoulbar2.pytb2.option
    option.lds, option.restart, option.searchMethod = 0, -1, 0  # HBFS, toulbar2's defaults
    option.relgap = 0
    option.limited = False
    return pytoulbar2.CFN(ub, verbose=verbose, seed=seed, vns=-4 if vns else None)


def _timed_solve(cfn: object, seconds: float) -> tuple | None:
    """``cfn.Solve`` within ``seconds`` of CPU time, its timer stopped after: toulbar2's timer is
    process-wide and ``Solve`` leaves it armed, so a solve that ended early must not leave it to
    fire during a later one in the same process."""
    try:
        return cfn.Solve(timeLimit=max(1, int(seconds)))  # type: ignore[attr-defined]
    finally:
        cfn.CFN.timerStop()  # type: ignore[attr-defined]


def _network(cfn: object, comp: FrozenCore, unary: list[np.ndarray], rows: bool = False) -> None:
    """Variables, unary costs ``unary`` (entries at INF forbidden) and the edges of ``comp`` in a
    pytoulbar2 CFN, with ``rows`` its memory rows as knapsack constraints too."""
    wcsp = cfn.CFN.wcsp  # type: ignore[attr-defined]
    for i, c in enumerate(unary):
        wcsp.makeEnumeratedVariable(f"x{i}", 0, len(c) - 1)
    for i, c in enumerate(unary):
        if len(c) > 1 or c[0] >= INF:
            wcsp.postUnaryConstraint(i, _doubles(c), False)
        else:
            wcsp.postNullaryConstraint(float(c[0]))
    for u, v, m in comp.edges:
        wcsp.postBinaryConstraint(u, v, _doubles(m.ravel()), False)
    for scope, params in knapsack_rows(comp) if rows else []:
        wcsp.postKnapsackConstraint(scope, params, kp=True)


def _doubles(costs: np.ndarray) -> list[float]:
    return np.where(costs < INF, costs.astype(np.float64), np.inf).tolist()


def knapsack_rows(comp: FrozenCore) -> list[tuple[list[int], str]]:
    """Every distinct memory row as toulbar2's knapsack parameters: ``-capacity`` then, per node
    of the scope, the number of strategies with usage and (strategy, -usage) pairs.

    A node's usage is the same on every row between two of its segments' ends, so its text is
    written once per such piece and shared by the piece's rows: far fewer pieces than (row, node)
    pairs, the same rows to the character, and every toulbar2 neighbourhood builds them
    (measured: see benchmarks/README.md, "Solver throughput")."""
    if comp.capacity is None or not len(comp.capacity):
        return []
    per_row: list[list[tuple[int, str]]] = [[] for _ in comp.capacity]
    for i, segs in enumerate(comp.segments):
        ends = sorted({a for a, _, _ in segs} | {b for _, b, _ in segs})
        for lo, hi in zip(ends[:-1], ends[1:]):
            covering = [usage for a, b, usage in segs if a <= lo and hi <= b]
            if not covering:
                continue
            usage = np.sum(covering, axis=0)
            nz = np.flatnonzero(usage)
            pairs = np.column_stack([nz, -usage[nz]]).ravel().tolist()
            text = " ".join(map(str, [len(nz), *pairs]))
            for r in range(lo, hi):
                per_row[r].append((i, text))  # nodes in increasing order: the scope comes sorted
    out, seen = [], set()
    for r, row in enumerate(per_row):
        if not row:
            continue
        scope = [i for i, _ in row]
        params = " ".join([str(-int(comp.capacity[r]))] + [text for _, text in row])
        key = (tuple(scope), params)
        if key not in seen:
            seen.add(key)
            out.append((scope, params))
    return out
