"""z3 counterexample-guided search on the reduced core: "is there any plan cheaper than B?"

Encoding (one-hot pseudo-Boolean, the best of the encodings measured: see benchmarks/README.md,
"Measurements behind the design"):

    x[i,s] Bool                         node i takes strategy s
    sum_s x[i,s] = 1                    one strategy per node                 (_nodes)
    not x[i,s]            if c_i[s] >= INF                                    (_nodes)
    not x[u,s] or not x[v,t]            if m_e[s,t] >= INF                     (_edges)
    not x[u,s] or not x[v,t] or y[e,s,t]  y[e,s,t] is forced on when both are   (_edges)
    sum_i sum_s usage_i,r[s] x[i,s] <= capacity[r]    each memory row r        (_memory)
    C + sum w_j lit_j <= B - 1          the bound (permanent: B only falls)    (tighten)
    L + sum w'_j lit'_j <= B - 1        a dual cut (dual_cut.py), optional          (add_cut)

Each edge matrix first has its row minima, then its column minima, moved into the node costs
(``shifted``), and each node's minimum into the constant C, so most weights w_j are small and
zero entries need no literal. A literal whose weight alone exceeds B - 1 - C is fixed false.
z3's pseudo-Boolean coefficients are C ints: weights and usages are divided by their gcd, and if
they are still too large the constraint is relaxed by rounding down (weights) — UNSAT stays a
proof; a plan that is then not really better is excluded by a blocking clause and z3 is asked
again. ``Z3Worker`` runs the loop in a background thread against the latest best cost.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import z3

from autoshard.solver.core.reduced import INF, FrozenCore
from autoshard.solver.core.dual_cut import DualCut
from autoshard.solver.engines.toulbar import row_terms

_CMAX = 2**31 - 1
_EXACT_ARITH_MAX_TERMS = 2000
"""Rows with weights beyond C ints and at most this many literals are encoded exactly (Int sum)."""


@dataclass
class CheckResult:
    """z3's answer: 'sat' with a plan (local strategies), 'unsat', or 'unknown' (timeout)."""

    result: str
    choice: list[int] | None = None


def shifted(comp: FrozenCore) -> tuple[list[np.ndarray], list[tuple[int, int, np.ndarray]], int]:
    """Costs with every edge's row then column minima moved into its nodes, and node minima into
    the constant: the same total for every assignment, and small, sparse weights."""
    costs = [c.copy() for c in comp.costs]
    edges = []
    for u, v, m in comp.edges:
        finite = m < INF
        row = np.where(finite, m, INF).min(axis=1)
        m = np.where(finite, m - row[:, None], INF)
        col = np.where(finite, m, INF).min(axis=0)
        m = np.where(finite, m - col[None, :], INF)
        costs[u] = np.minimum(costs[u] + row, INF)
        costs[v] = np.minimum(costs[v] + col, INF)
        edges.append((u, v, m))
    const = comp.const
    for i, c in enumerate(costs):
        low = int(c.min())
        if low < INF:
            const += low
            costs[i] = np.where(c < INF, c - low, INF)
    return costs, edges, const


class Z3Search:
    """An incremental z3 solver over a FrozenCore; ``check(bound)`` asks for a plan with cost < bound.

    The formula is written as SMT-LIB2 text and parsed by z3 in one call, much faster than
    building it through the Python API object by object (measured: see benchmarks/README.md,
    "Measurements behind the design").
    """

    def __init__(self, comp: FrozenCore) -> None:
        self.comp = comp
        self.ctx = z3.Context()  # own context: safe to run in a thread, and to interrupt
        costs, edges, self.const = shifted(comp)
        self.names = [[f"x{i}_{s}" for s in range(len(c))] for i, c in enumerate(costs)]
        self.terms: list[tuple[str, int]] = []
        lines = [f"(declare-const {v} Bool)" for row in self.names for v in row]
        lines += self._nodes(costs)
        lines += self._edges(edges)
        lines += self._memory()
        # The finite-domain solver is fastest on pseudo-Boolean rows; an objective that needs an
        # exact integer sum (see _pb_le) runs far faster under the general solver.
        self.solver = z3.Solver(ctx=self.ctx) if _needs_arith(self.terms) else z3.SolverFor("QF_FD", ctx=self.ctx)
        self.solver.from_string("\n".join(lines))
        self.x = [[z3.Bool(v, ctx=self.ctx) for v in row] for row in self.names]
        self.fixed_false: set[int] = set()
        self.budget: int | None = None
        self.cuts: list[tuple[int, list[tuple[str, int]], set[int]]] = []

    @property
    def size(self) -> int:
        """Number of weighted literals in the objective."""
        return len(self.terms)

    def _nodes(self, costs: list[np.ndarray]) -> list[str]:
        out = []
        for names, c in zip(self.names, costs):
            out.append(_assert(_pb(names, [1] * len(names), 1, "pbeq")))
            for name, w in zip(names, c.tolist()):
                if w >= INF:
                    out.append(f"(assert (not {name}))")
                elif w > 0:
                    self.terms.append((name, w))
        return out

    def _edges(self, edges: list[tuple[int, int, np.ndarray]]) -> list[str]:
        out = []
        for e, (u, v, m) in enumerate(edges):
            for s, t in zip(*np.nonzero(m)):
                a, b = self.names[u][s], self.names[v][t]
                w = int(m[s, t])
                if w >= INF:
                    out.append(f"(assert (or (not {a}) (not {b})))")
                else:
                    y = f"y{e}_{s}_{t}"
                    out.append(f"(declare-const {y} Bool)(assert (or (not {a}) (not {b}) {y}))")
                    self.terms.append((y, w))
        return out

    def _memory(self) -> list[str]:
        comp = self.comp
        if comp.capacity is None:
            return []
        rows: list[list[tuple[str, int]]] = [[] for _ in comp.capacity]
        for i, segs in enumerate(comp.segments):
            for start, stop, usage in segs:
                for s in np.flatnonzero(usage):
                    for r in range(start, stop):
                        rows[r].append((self.names[i][s], int(usage[s])))
        out, seen = [], set()
        for r, row in enumerate(rows):
            key = (tuple(sorted(row)), int(comp.capacity[r]))
            if row and key not in seen:
                seen.add(key)
                out.append(_assert(_pb_le(row, int(comp.capacity[r]))))
        return out

    def add_cut(self, cut: DualCut) -> None:
        """Add a valid lower-bound cut (dual_cut.DualCut): from now on it is tightened with the bound."""
        lines, terms = [], []
        for i, s, w, positive in cut.node_terms:
            name = self.names[i][s]
            terms.append((name if positive else f"(not {name})", w))
        for e, s, t, w, positive in cut.pair_terms:
            u, v, _ = self.comp.edges[e]
            a, b, y = self.names[u][s], self.names[v][t], f"p{len(self.cuts)}_{e}_{s}_{t}"
            lines.append(f"(declare-const {y} Bool)(assert (or (not {a}) (not {b}) {y}))")
            if not positive:  # (1 - y) needs y to be the exact indicator
                lines.append(f"(assert (=> {y} {a}))(assert (=> {y} {b}))")
            terms.append((y if positive else f"(not {y})", w))
        self.solver.from_string("\n".join(lines))
        self.cuts.append((cut.const, terms, set()))
        if self.budget is not None:
            self._tighten_cut(self.cuts[-1], self.budget + 1 + self.const)

    def _tighten_cut(self, cut: tuple[int, list[tuple[str, int]], set[int]], bound: int) -> None:
        const, terms, fixed = cut
        budget = bound - 1 - const
        if budget < 0:
            self.solver.add(z3.BoolVal(False, ctx=self.ctx))
            return
        lines, keep = [], []
        for j, (lit, w) in enumerate(terms):
            if w > budget:
                if j not in fixed:
                    fixed.add(j)
                    lines.append(f"(assert (not {lit}))")
            else:
                keep.append((lit, w))
        lines.append(_assert(_pb_le(keep, budget)))
        self.solver.from_string("\n".join(lines))

    def tighten(self, bound: int) -> None:
        """From now on only plans with cost < bound are wanted (permanent: bounds only fall)."""
        budget = bound - 1 - self.const
        if self.budget is not None and budget >= self.budget:
            return
        self.budget = budget
        if budget < 0:
            self.solver.add(z3.BoolVal(False, ctx=self.ctx))
            return
        lines, keep = [], []
        for j, (lit, w) in enumerate(self.terms):
            if w > budget:
                if j not in self.fixed_false:
                    self.fixed_false.add(j)
                    lines.append(f"(assert (not {lit}))")
            else:
                keep.append((lit, w))
        lines.append(_assert(_pb_le(keep, budget)))
        self.solver.from_string("\n".join(lines))
        for cut in self.cuts:
            self._tighten_cut(cut, bound)

    def check(self, bound: int | None, timeout: float | None) -> CheckResult:
        """Any plan with cost < bound (any plan at all when bound is None), within timeout seconds."""
        if bound is not None:
            self.tighten(bound)
        return self._check([], bound, timeout)

    def interrupt(self) -> None:
        """Make a running check return 'unknown' soon (callable from another thread)."""
        self.ctx.interrupt()

    def _check(self, assumptions: list, bound: int | None, timeout: float | None) -> CheckResult:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return CheckResult("unknown")
                self.solver.set("timeout", max(1, int(left * 1000)))
            answer = self.solver.check(*assumptions)
            if answer == z3.unsat:
                return CheckResult("unsat")
            if answer != z3.sat:
                return CheckResult("unknown")
            model = self.solver.model()
            choice = [
                next((s for s, b in enumerate(xs) if z3.is_true(model.eval(b, model_completion=True))), 0)
                for xs in self.x
            ]
            fits = self.comp.overflow(choice) == 0
            if fits and (bound is None or self.comp.cost(choice) < bound):
                return CheckResult("sat", choice)
            # a rounded constraint let a plan through that is not really better: exclude it exactly
            self.solver.add(z3.Or([z3.Not(self.x[i][s]) for i, s in enumerate(choice)]))


class Z3Worker(threading.Thread):
    """z3 CEGIS in the background: checks with growing time slices against the latest bound."""

    def __init__(self, comp: FrozenCore, deadline: float | None, cut: DualCut | None) -> None:
        super().__init__(daemon=True)
        self.comp, self.deadline, self.cut = comp, deadline, cut
        self.bound: int | None = None
        self.results: queue.Queue = queue.Queue()
        self.done = False
        self.search: Z3Search | None = None
        self._stop_flag = threading.Event()

    def run(self) -> None:
        """The thread body: CEGIS until UNSAT, the deadline or stop()."""
        try:
            self._loop()
        except z3.Z3Exception:
            pass  # interrupted by stop()
        finally:
            self.done = True

    def _loop(self) -> None:
        self.search = z3s = Z3Search(self.comp)
        if self.cut is not None:
            z3s.add_cut(self.cut)
        if self._stop_flag.is_set():
            return
        slice_ = 2.0
        while not self._stop_flag.is_set():
            left = None if self.deadline is None else self.deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            bound = self.bound
            result = z3s.check(bound, slice_ if left is None else min(slice_, left))
            if result.result != "unknown":
                self.results.put((bound, result))
            if result.result == "unsat":
                break
            if result.result == "unknown":
                slice_ = min(slice_ * 2, 60.0)

    def stop(self, until: float | None = None) -> None:
        """Interrupt the running check and wait (at most about a second, and not past ``until``)
        for the thread to end; a thread still building its formula notices the flag and ends
        right after (it is a daemon: nothing waits for it)."""
        self._stop_flag.set()
        for _ in range(20):
            if not self.is_alive():
                return
            if self.search is not None:
                self.search.interrupt()
            if until is not None and time.monotonic() >= until:
                return
            self.join(0.05 if until is None else max(0.0, min(0.05, until - time.monotonic())))

    def join_until(self, deadline: float | None) -> None:
        """Wait for the thread (until ``deadline``)."""
        self.join(None if deadline is None else max(0.0, deadline - time.monotonic()))


def _assert(expr: str) -> str:
    return f"(assert {expr})"


def _pb(lits: list[str], weights: list[int], rhs: int, kind: str) -> str:
    """A z3 pseudo-Boolean term in SMT-LIB2: ((_ pble rhs w1 .. wn) l1 .. ln)."""
    if len(lits) == 1 and kind == "pbeq" and weights[0] == 1 and rhs == 1:
        return lits[0]
    return f"((_ {kind} {rhs} {' '.join(map(str, weights))}) {' '.join(lits)})"


def _needs_arith(row: list[tuple[str, int]]) -> bool:
    """True when _pb_le may write this row as an exact integer sum (beyond C ints, few literals)."""
    if not row or len(row) > _EXACT_ARITH_MAX_TERMS:
        return False
    g = 0
    for _, w in row:
        g = math.gcd(g, w)
    return sum(w for _, w in row) // max(g, 1) > _CMAX  # budgets range up to the sum of the weights


def _pb_le(row: list[tuple[str, int]], rhs: int) -> str:
    """sum w*lit <= rhs as a z3 pseudo-Boolean term, scaled to C ints.

    Divides by the gcd of the weights (exact); if weights or rhs are still beyond C ints, rounds
    weights down and rhs down after dividing by d — a relaxation, so every plan z3 returns is
    re-checked exactly by the caller. Short rows are written as an exact integer sum instead.
    """
    if not row or sum(w for _, w in row) <= rhs:
        return "true" if rhs >= 0 else "false"
    g = 0
    for _, w in row:
        g = math.gcd(g, w)
    row = [(lit, w // g) for lit, w in row]
    rhs //= g
    top = max(max(w for _, w in row), rhs)
    if top > _CMAX and len(row) <= _EXACT_ARITH_MAX_TERMS:
        # Small rows stay exact as integer arithmetic: z3 decides these in milliseconds, while the
        # rounded pseudo-Boolean row let through plan after plan that the exact check rejected.
        total = " ".join(f"(ite {lit} {w} 0)" for lit, w in row)
        return f"(<= (+ 0 {total}) {rhs})"
    if top > _CMAX:
        d = -(-top // _CMAX)
        row = [(lit, w // d) for lit, w in row if w // d > 0]
        rhs //= d
        if not row:
            return "true"
    return _pb([lit for lit, _ in row], [w for _, w in row], rhs, "pble")


def objective_size(comp: FrozenCore, limit: int | None = None) -> int:
    """Weighted literals z3 would need: nonzero edge entries, strategies and the memory rows'
    terms (a small core can have millions of row terms, and z3's formula grows with them).
    Counting stops once past ``limit``: the answer is then some count above it."""
    total = sum(len(c) for c in comp.costs)
    for _, _, m in comp.edges:
        total += int(np.count_nonzero(m))
        if limit is not None and total > limit:
            return total
    return total + row_terms(comp)
