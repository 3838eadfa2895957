"""Compiled exact evaluation of core plans on the original problem: what every ``offer`` pays.

A plan found on the reduced core is reported only after it has been expanded to every original
node (the reductions' records, replayed backwards) and evaluated on the original problem (cost,
forbidden terms, peak memory). In Python both walk every original node and edge for each better
plan, which on large problems costs more than neighbourhood search takes to find one (measured:
see benchmarks/README.md, "Solver throughput"). Here both are loops over flat arrays built once:

- ``Expansion``: the records as flat arrays; a removed node's strategy is its table entry at the
  positions of its scope's strategies in the snapshots taken when it was removed.
- ``FlatProblem``: node costs and usages flat, each distinct vector stored once (a model's repeated
  layers repeat them: ``core/pool.py``), and the memory intervals; the edges grouped by their matrix object
  (the problem's own arrays, not copied: a large model's are gigabytes, shared by its repeated
  layers), each group's entries read at once by numpy; the cost is exact in int64 while no term is
  forbidden and the sum stays below 2**62, else ``ShardingProblem.evaluate`` decides (Python
  ints); the peak is the largest prefix sum of usage changes on the sorted times.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from autoshard.solver.model.problem import FORBIDDEN, Evaluation, ShardingProblem
from autoshard.solver.core.flat_core import flat, offsets
from autoshard.solver.core.pool import vector_pool
from autoshard.solver.core.reduced import Core


def _flat(arrays: list[np.ndarray]) -> np.ndarray:
    """The arrays raveled and joined as int64 (``core.flat`` of their raveled views)."""
    return flat([np.ravel(a) for a in arrays])


@dataclass
class Expansion:
    """``Core.expand`` over flat arrays: the alive nodes' original strategies, then the records
    (last first), each with its scope, the scope's snapshots and its table (row-major)."""

    num_original: int
    nodes: np.ndarray  # the alive nodes, in the order of the plans' entries
    strat_off: np.ndarray  # alive node a's original strategies: strats[strat_off[a]:strat_off[a+1]]
    strats: np.ndarray
    rec_node: np.ndarray
    scope_off: np.ndarray  # record r's scope: scope[scope_off[r]:scope_off[r+1]], each with a snapshot
    scope: np.ndarray
    snap_off: np.ndarray  # scope entry q's snapshot: snaps[snap_off[q]:snap_off[q+1]]
    snaps: np.ndarray
    table_off: np.ndarray
    tables: np.ndarray

    @classmethod
    def of(cls, core: Core, nodes: list[int]) -> Expansion:
        """The expansion of ``core``'s records, for plans over the alive ``nodes`` (in this order)."""
        records = core.records
        scopes = [rec.scope for rec in records]
        snapshots = [snap for rec in records for snap in rec.snapshots]
        return cls(
            num_original=core.num_original,
            nodes=np.array(nodes, dtype=np.int64),
            strat_off=offsets([len(core.strategies[v]) for v in nodes]),
            strats=_flat([core.strategies[v] for v in nodes]),
            rec_node=np.array([rec.node for rec in records], dtype=np.int64),
            scope_off=offsets([len(s) for s in scopes]),
            scope=np.array([u for s in scopes for u in s], dtype=np.int64),
            snap_off=offsets([len(s) for s in snapshots]),
            snaps=_flat(snapshots),
            table_off=offsets([rec.table.size for rec in records]),
            tables=_flat([rec.table for rec in records]),
        )

    def expand(self, local: np.ndarray) -> np.ndarray:
        """Original strategy of every original node, from the alive nodes' local strategies."""
        return _expand(self.nodes, np.asarray(local, dtype=np.int64), self.num_original,
                       self.strat_off, self.strats, self.rec_node, self.scope_off, self.scope, self.snap_off,
                       self.snaps, self.table_off, self.tables)


@njit(cache=True)
def _expand(nodes, local, n, strat_off, strats, rec_node, scope_off, scope, snap_off, snaps,
            table_off, tables):  # pragma: no cover
    """``Expansion.expand``: records replayed last first, each table read at its scope's positions
    (the strides are the later snapshots' lengths, row-major)."""
    choice = np.full(n, -1, dtype=np.int64)
    for a in range(len(nodes)):
        choice[nodes[a]] = strats[strat_off[a] + local[a]]
    for r in range(len(rec_node) - 1, -1, -1):
        flat = 0
        for q in range(scope_off[r], scope_off[r + 1]):
            snap = snaps[snap_off[q]:snap_off[q + 1]]
            flat = flat * len(snap) + np.searchsorted(snap, choice[scope[q]])
        choice[rec_node[r]] = tables[table_off[r] + flat]
    return choice


@dataclass
class FlatProblem:
    """A ShardingProblem's costs, edges and memory intervals as flat arrays, for ``evaluate``."""

    problem: ShardingProblem
    k: np.ndarray  # strategies per node
    c_off: np.ndarray  # node i's costs start at costs[c_off[i]]
    costs: np.ndarray
    edges: tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]  # per matrix object: it, its edges' ends
    u_off: np.ndarray  # node i's usages start at usages[u_off[i]]
    usages: np.ndarray
    t_start: np.ndarray  # each node's interval as positions in the sorted distinct times
    t_end: np.ndarray
    times: int
    compiled: bool  # every array signed integer, no usage sum past int64; else Python evaluates

    @classmethod
    def of(cls, problem: ShardingProblem) -> FlatProblem:
        """Flatten ``problem`` (once per solve, at the first offer)."""
        k = np.array([len(c) for c in problem.node_costs], dtype=np.int64)
        bounds = np.array(problem.intervals, dtype=np.int64).reshape(-1, 2)
        live = bounds[:, 0] < bounds[:, 1]  # an empty interval holds no memory
        times = np.unique(bounds[live])
        t_start = np.where(live, np.searchsorted(times, bounds[:, 0]), 0).astype(np.int64)
        t_end = np.where(live, np.searchsorted(times, bounds[:, 1]), 0).astype(np.int64)
        arrays = [*problem.node_costs, *problem.node_usages, *problem.edge_costs]
        compiled = all(np.asarray(a).dtype.kind == "i" for a in arrays)
        if compiled:  # no usage sum past int64 (at most each node's largest usage at once)
            compiled = sum(int(np.max(u, initial=0)) for u in problem.node_usages) < 2**62
        none = np.zeros(0, dtype=np.int64)
        costs, c_off = vector_pool(problem.node_costs) if compiled else (none, none)
        usages, u_off = vector_pool(problem.node_usages) if compiled else (none, none)
        return cls(
            problem=problem, k=k, c_off=c_off, costs=costs, edges=_edge_groups(problem) if compiled else (),
            u_off=u_off, usages=usages,
            t_start=t_start, t_end=t_end, times=len(times), compiled=compiled,
        )

    def evaluate(self, choice: np.ndarray) -> Evaluation:
        """``ShardingProblem.evaluate(choice)``, the same answer, compiled where int64 is exact."""
        choice = np.asarray(choice, dtype=np.int64)
        found = self._compiled(choice)
        if found is None or found[0] is None:  # for an invalid choice: its one-line error
            return self.problem.evaluate(choice.tolist())
        cost, peak = found
        limit = self.problem.usage_limit
        return Evaluation(cost=cost, peak=peak, uses_forbidden=False, within_limit=limit is None or peak <= limit)

    def feasible_cost(self, choice: np.ndarray) -> int | None:
        """The exact cost of ``choice`` where it is feasible, else None: ``evaluate``'s verdict,
        without the exact cost and peak of a plan that uses a forbidden term (those ``evaluate``
        leaves to Python; candidate moves often are such plans)."""
        choice = np.asarray(choice, dtype=np.int64)
        found = self._compiled(choice)
        if found is not None:
            cost, peak = found
            limit = self.problem.usage_limit
            if cost is not None:
                return cost if limit is None or peak <= limit else None
            if self._uses_forbidden(choice):
                return None
        ev = self.evaluate(choice)  # past int64, or an invalid choice (its one-line error)
        return ev.cost if ev.feasible else None

    def _compiled(self, choice: np.ndarray) -> tuple[int | None, int] | None:
        """On the compiled path (a compiled problem and a valid ``choice``): the exact cost, None
        where a term is forbidden or the sum reaches 2**62, and the peak (meaningful with a cost);
        None off that path."""
        if not (self.compiled and len(choice) == len(self.k) and bool(((choice >= 0) & (choice < self.k)).all())):
            return None
        total, exact, peak = _evaluate(choice, self.c_off, self.costs, self.u_off, self.usages, self.t_start,
                                       self.t_end, self.times)
        cost = _edges_total(choice, self.edges, int(total)) if exact else None
        return (None if cost is None else int(cost)), int(peak)

    def _uses_forbidden(self, choice: np.ndarray) -> bool:
        """Whether a valid ``choice`` picks a forbidden node cost or edge pair (compiled problems)."""
        return bool((self.costs[self.c_off + choice] >= FORBIDDEN).any()) or any(
            int(matrix[choice[us], choice[vs]].max()) >= FORBIDDEN for matrix, us, vs in self.edges)


def _edge_groups(problem: ShardingProblem) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    """The problem's edges grouped by matrix object: (the matrix, its edges' first ends, their
    second ends)."""
    groups: dict[int, tuple[np.ndarray, list[int], list[int]]] = {}
    for (u, v), matrix in zip(problem.edges, problem.edge_costs):
        _, us, vs = groups.setdefault(id(matrix), (np.asarray(matrix), [], []))
        us.append(u)
        vs.append(v)
    return tuple((m, np.array(us, dtype=np.int64), np.array(vs, dtype=np.int64)) for m, us, vs in groups.values())


def _edges_total(choice: np.ndarray, groups: tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...],
                 total: int) -> int | None:
    """``total`` plus every edge's price under ``choice``, or None when a price is forbidden or the
    sum reaches 2**62 (then Python decides)."""
    for matrix, us, vs in groups:
        terms = matrix[choice[us], choice[vs]]
        if int(terms.max()) >= FORBIDDEN:
            return None
        # a group's int64 sum is exact while its largest magnitude times its size stays below 2**62
        exact = int(np.abs(terms).max()) * len(terms) < 2**62
        total += int(terms.sum()) if exact else sum(int(t) for t in terms)
        if total >= 2**62:
            return None
    return total


@njit(cache=True)
def _evaluate(choice, c_off, costs, u_off, usages, t_start, t_end, times):  # pragma: no cover
    """The node costs' sum, whether it is exact (no forbidden term, the sum below 2**62: every
    term is below FORBIDDEN < 2**60, so no addition overflows before the check), and peak memory."""
    total = 0
    for i in range(len(choice)):
        term = costs[c_off[i] + choice[i]]
        if term >= FORBIDDEN or total >= 2**62:
            return 0, False, 0
        total += term
    if total >= 2**62:
        return 0, False, 0
    change = np.zeros(times + 1, dtype=np.int64)
    for i in range(len(choice)):
        if t_start[i] < t_end[i]:
            use = usages[u_off[i] + choice[i]]
            change[t_start[i]] += use
            change[t_end[i]] -= use
    peak = level = 0
    for t in range(times):
        level += change[t]
        if level > peak:
            peak = level
    return total, True, peak
