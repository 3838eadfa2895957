"""Large-neighbourhood search: re-solve part of the core exactly (toulbar2 or HiGHS), the rest fixed.

When the Lagrangian plans stop improving (and the bound is too far below them for z3 to prove
anything), a fitting plan x is improved by picking
a neighbourhood N of nodes, fixing every other node at x, and solving the problem restricted to
N exactly: N's costs absorb the edges to fixed nodes, and each memory row's capacity loses the
fixed nodes' usage. x restricted to N is feasible there, so the result is never worse; a better
one is a better plan. Neighbourhoods are grown breadth-first through the graph from a random
node or from the nodes live on the tightest memory row (memory couples nodes that share no
edge), up to ``size`` nodes and MAX_COLUMNS ILP variables. The size adapts: it grows while
neighbourhoods are solved quickly and shrinks when the solver runs out of time. Two exact
solvers take turns, each with its own size: toulbar2 (branch and bound with x's cost as its
bound, the rows as knapsacks) and HiGHS, each for a share of the time that follows what it has
been gaining per second (``NeighbourhoodSearch.pick``). Strategies are not filtered: the
improving moves use strategies that look expensive one node at a time (measured: see
benchmarks/README.md, "Measurements behind the design" and "Tried and dropped").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from numba import njit

from autoshard.solver.procs.clock import MONOTONIC, Clock
from autoshard.solver.procs.call_server import CallServer
from autoshard.solver.core.flat_core import offsets, views
from autoshard.solver.core.reduced import INF, FrozenCore
from autoshard.solver.core.local_search import segment_index
from autoshard.solver.core.rows import merge_rows
from autoshard.solver.engines.milp import solve_core_milp
from autoshard.solver.search.time_shares import Shares
from autoshard.solver.engines.toulbar import can_take, improve

LNS_AFTER_STEPS = 30
"""Lagrangian steps without a better plan before a slice of neighbourhood search (both Lagrangian
searches hand over to it: run/handover.py and search/turns.py) ..."""
LNS_SLICE = 5.0
"""... of at least this many seconds."""

MIN_SIZE = 6
"""Smallest neighbourhood (nodes)."""
MAX_COLUMNS = 100_000
"""Largest ILP (variables) a neighbourhood may make."""
MAX_SOLVE = 20.0
"""Longest HiGHS time limit per neighbourhood (seconds)."""
HIGHS_GRACE = 1.0
"""Seconds HiGHS's child gets past its time limit before it is killed: setting its model up runs
past the limit (measured: see benchmarks/README.md, "Measurements behind the design")."""
TOULBAR_SECONDS = 2
"""toulbar2's CPU-time limit per neighbourhood (whole seconds); the size adapts to it."""


@dataclass
class SubSolver:
    """One exact solver of neighbourhoods with its own neighbourhood size."""

    name: str
    size: int
    rounds: int = 0


class NeighbourhoodSearch:
    """Re-solves neighbourhoods of a fitting plan of ``comp`` with toulbar2 or HiGHS, each for
    the share of the time its gains per second of late earn (adaptive LNS, Ropke and Pisinger
    2006; ``pick``); ``run`` improves a plan. The two taking turns beat either alone (measured: see
    benchmarks/README.md, "Measurements behind the design")."""

    def __init__(self, comp: FrozenCore, rng: np.random.Generator, size: int = 16, clock: Clock = MONOTONIC) -> None:
        self.clock = clock  # deadlines and the time each neighbourhood took are its readings
        self.comp = comp
        self.rng = rng
        size = max(MIN_SIZE, min(size, comp.n))
        self.solvers = [SubSolver("toulbar2", size), SubSolver("highs", size)]
        self.shares = Shares([0.5, 0.5], clock)
        self.rounds = 0
        self.took = 0.0  # seconds the last neighbourhood took
        # who is live on a row, found when asked: a list per row would hold every row term
        self.owner, self.starts, self.stops = segment_index(comp)
        self.server = CallServer(clock)  # the exact solvers' child, kept while ``run`` runs

    def run(
        self,
        x: np.ndarray,
        deadline: float,
        found: Callable[[np.ndarray], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> np.ndarray:
        """Neighbourhood after neighbourhood until ``deadline`` or until ``stop()`` (asked between
        neighbourhoods) is True; the best plan found (x if none), each better one also handed to
        ``found`` as it comes. The solvers run in one child process for the whole call
        (procs/call_server.py), which ends with it."""
        with self.server:
            return self._run(x, deadline, found, stop)

    def _run(
        self,
        x: np.ndarray,
        deadline: float,
        found: Callable[[np.ndarray], None] | None,
        stop: Callable[[], bool] | None,
    ) -> np.ndarray:
        """``run``'s loop, its server's child started on the first neighbourhood."""
        comp = self.comp
        x = np.asarray(x, dtype=np.int64).copy()
        cost = comp.cost(x)
        # HiGHS takes at least a second's limit and runs past it (setting its model up): a
        # neighbourhood starts only while the last one's time is left, so a slice ends by its
        # deadline
        while comp.n and self.clock() < deadline - max(1.0, self.took):
            if stop is not None and stop():
                break
            solver, nodes, sub = self.pose(x)
            began = self.clock()
            choice, finished = self.solve(solver, sub, x[nodes], deadline - began)
            took = self.took = self.clock() - began
            self.rounds += 1
            solver.rounds += 1
            gain = 0.0
            if choice is not None:
                y = x.copy()
                y[nodes] = choice
                new = comp.cost(y)
                if new < cost and comp.is_feasible(y):
                    gain = (cost - new) / max(abs(cost), 1)
                    x, cost = y, new
                    if found is not None:
                        found(x)
            self.shares.record(self.solvers.index(solver), took, gain)
            if finished and took < 1.0:
                solver.size = min(comp.n, int(solver.size * 1.2) + 1)
            elif not finished:
                solver.size = max(MIN_SIZE, int(solver.size * 0.7))
        return x

    def pick(self) -> SubSolver:
        """The solver furthest behind its share of the search's time (``time_shares.Shares``: even
        while neither gained in the last WINDOW seconds, else by relative gain per second,
        floored). Shares of time, not of picks: a HiGHS neighbourhood takes about ten times as
        long as toulbar2's, so picks by rate gave HiGHS most of the time even where toulbar2
        gained more per second (measured: see benchmarks/README.md, "Measurements behind the
        design")."""
        return self.solvers[self.shares.next()]

    def pose(self, x: np.ndarray) -> tuple[SubSolver, np.ndarray, FrozenCore]:
        """The solver picked, its neighbourhood of x and the restricted problem. toulbar2's
        neighbourhood shrinks until its rows are small enough for it (``toulbar.can_take``);
        HiGHS takes it where even MIN_SIZE nodes are too many."""
        solver = self.pick()
        while True:
            nodes = self.neighbourhood(x, solver.size)
            sub = restrict(self.comp, x, nodes)
            if solver.name != "toulbar2" or can_take(sub):
                return solver, nodes, sub
            if solver.size == MIN_SIZE:
                solver = self.solvers[1]
            else:
                solver.size = max(MIN_SIZE, int(solver.size * 0.7))

    def solve(self, solver: SubSolver, sub: FrozenCore, start: np.ndarray, left: float) -> tuple[np.ndarray | None, bool]:
        """A better plan of the restricted problem ``sub`` than ``start`` by ``solver`` (or None,
        or no better one), and whether the solver finished (proved it) rather than ran out of time."""
        if solver.name == "toulbar2":
            # in the server's child, killed by the wall clock: toulbar2 counts CPU seconds, and
            # in this process a neighbourhood could end the process itself (exit status 0, the
            # answer never written), which a child's end cannot do
            seconds, seed = max(1, min(TOULBAR_SECONDS, int(left))), int(self.rng.integers(1, 2**31))
            began = self.clock()
            choice = self.server.call(improve, (sub, start, seconds, seed), began + min(left, 2 * seconds + 1))
            return choice, self.clock() - began < 0.75 * seconds
        # also in the child, killed at its time: HiGHS runs past its own limit, and in this
        # process its fds 1 and 2 would be on /dev/null while it runs (silence.silenced), taking the
        # status lines other threads print with them
        limit = max(1.0, min(MAX_SOLVE, 0.5 * left))
        result = self.server.call(solve_core_milp, (sub, limit), self.clock() + min(left, limit + HIGHS_GRACE))
        return (None, False) if result is None else (result.choice, result.optimal)

    def neighbourhood(self, x: np.ndarray, size: int) -> np.ndarray:
        """Up to ``size`` nodes (and MAX_COLUMNS ILP variables) grown breadth-first from a random
        node or a tight memory row."""
        comp = self.comp
        if len(self.owner) and self.rng.random() < 0.5:
            slack = comp.capacity - comp.profile(x)
            tight = np.flatnonzero(slack <= np.quantile(slack, 0.1))
            row = int(self.rng.choice(tight))
            live = np.unique(self.owner[(self.starts <= row) & (row < self.stops)])
            seeds = [int(i) for i in self.rng.permutation(live)]
        else:
            seeds = []
        if not seeds:  # where the plan's cost concentrates, or anywhere
            share = node_costs(comp, x)
            if share.sum() > 0 and self.rng.random() < 0.5:
                seeds = [int(self.rng.choice(comp.n, p=share / share.sum()))]
            else:
                seeds = [int(self.rng.integers(comp.n))]
        a = comp.arrays
        first = np.array(seeds[: max(1, size // 2)], dtype=np.int64)
        order = self.rng.random(len(a.nb_other))  # each node's neighbours are queued in this order
        return np.sort(_grow(first, size, MAX_COLUMNS, order, a.c_off, a.nb_ptr, a.nb_other))


@njit(cache=True)
def _grow(first, size, max_columns, order, c_off, nb_ptr, nb_other):  # pragma: no cover
    """``neighbourhood``'s breadth-first growth from the queue ``first``: a node is taken unless
    it would bring the ILP past ``max_columns`` variables (its strategies plus its edges to nodes
    taken), and its neighbours not yet taken are queued by ``order`` (one random key per entry
    of the neighbour lists); at most ``size`` nodes, in the order taken."""
    n = len(c_off) - 1
    taken = np.zeros(n, dtype=np.bool_)
    queue = np.empty(len(first) + len(nb_other), dtype=np.int64)  # every node is queued by each
    queue[: len(first)] = first  # neighbour taken before it, at most once per list entry
    head, tail = 0, len(first)
    out = np.empty(min(size, n), dtype=np.int64)
    count = columns = 0
    while head < tail and count < size:
        i = queue[head]
        head += 1
        if taken[i]:
            continue
        k = c_off[i + 1] - c_off[i]
        more = k
        for p in range(nb_ptr[i], nb_ptr[i + 1]):
            j = nb_other[p]
            if taken[j]:
                more += k * (c_off[j + 1] - c_off[j])
        if count > 0 and columns + more > max_columns:
            continue
        columns += more
        taken[i] = True
        out[count] = i
        count += 1
        lo, hi = nb_ptr[i], nb_ptr[i + 1]
        for q in np.argsort(order[lo:hi]):
            j = nb_other[lo + q]
            if not taken[j]:
                queue[tail] = j
                tail += 1
    return out[:count]


def node_costs(comp: FrozenCore, x: np.ndarray) -> np.ndarray:
    """Each node's cost in x plus half of its edges', at most 1e30 (float: only for sampling).
    Compiled: in Python the loop over the edges was a visible share of a slice (measured: see
    benchmarks/README.md, "Solver throughput")."""
    a = comp.arrays
    return _node_costs(np.asarray(x, dtype=np.int64), *a.neighbour_args())


@njit(cache=True)
def _node_costs(x, c_off, costs, nb_ptr, nb_other, nb_moff, nb_own, nb_their, nb_mats):  # pragma: no cover
    """``node_costs`` over the flat arrays: every edge is seen from both ends, half each time."""
    n = len(c_off) - 1
    share = np.empty(n)
    for i in range(n):
        total = float(costs[c_off[i] + x[i]])
        for p in range(nb_ptr[i], nb_ptr[i + 1]):
            total += 0.5 * float(nb_mats[nb_moff[p] + x[i] * nb_own[p] + x[nb_other[p]] * nb_their[p]])
        share[i] = min(total, 1e30)
    return share


def restrict(comp: FrozenCore, x: np.ndarray, nodes: np.ndarray) -> FrozenCore:
    """The problem over ``nodes`` with every other node fixed at x: edges to fixed nodes become
    costs, memory rows keep what the fixed nodes leave free, merged where they see the same
    nodes and dropped where they cannot overflow (``memory.merge_rows``), which leaves few enough
    rows for toulbar2's knapsack constraints."""
    index = {int(v): i for i, v in enumerate(nodes)}
    a = comp.arrays
    nodes = np.asarray(nodes, dtype=np.int64)
    inside = np.zeros(comp.n, dtype=np.bool_)
    inside[nodes] = True
    starts = offsets(a.c_off[nodes + 1] - a.c_off[nodes])
    flat = _absorbed_costs(np.asarray(x, dtype=np.int64), nodes, inside, starts, *a.neighbour_args())
    costs = views(flat, starts)
    # each edge inside once, from its end of lower index (oriented that way in its neighbour list)
    edges = [(i, index[j], m) for i, v in enumerate(nodes.tolist()) for j, m in comp.nbrs[v] if index.get(j, -1) > i]
    capacity, segments = None, [[] for _ in nodes]
    if comp.capacity is not None and len(comp.capacity):
        own = np.zeros(len(comp.capacity) + 1, dtype=np.int64)
        for v in nodes:
            for start, stop, usage in comp.segments[v]:
                own[start] += usage[x[v]]
                own[stop] -= usage[x[v]]
        free = comp.capacity - (comp.profile(x) - np.cumsum(own[:-1]))
        spans = [(start, stop) for v in nodes for start, stop, _ in comp.segments[v]]
        if spans:
            lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
            segments = [[(start - lo, stop - lo, usage) for start, stop, usage in comp.segments[v]] for v in nodes]
            capacity, segments, _ = merge_rows(free[lo:hi], segments)
    return FrozenCore(nodes=[comp.nodes[v] for v in nodes], costs=costs, edges=edges, capacity=capacity,
                   segments=segments)


@njit(cache=True)
def _absorbed_costs(x, nodes, inside, starts, c_off, costs, nb_ptr, nb_other, nb_moff, nb_own, nb_their,
                    nb_mats):  # pragma: no cover
    """``restrict``'s costs, flat at ``starts``: each node's own plus, for every edge to a node
    outside (not ``inside``), the edge's column at that node's strategy in x, saturated at INF
    after each addition (both terms are at most INF, so no sum overflows)."""
    out = np.empty(starts[-1], dtype=np.int64)
    for a in range(len(nodes)):
        v = nodes[a]
        k = c_off[v + 1] - c_off[v]
        base = starts[a]
        for s in range(k):
            out[base + s] = costs[c_off[v] + s]
        for p in range(nb_ptr[v], nb_ptr[v + 1]):
            j = nb_other[p]
            if inside[j]:
                continue
            at = nb_moff[p] + x[j] * nb_their[p]
            for s in range(k):
                out[base + s] = min(out[base + s] + nb_mats[at + s * nb_own[p]], INF)
    return out
