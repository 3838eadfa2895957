"""Processor time for alternative kinds of work, following what each has been gaining lately.

Two places split one processor between ways of finding better plans whose worth differs from
core to core and over a run: the second engine's Lagrangian and usage-weight turns
(turns.py) and neighbourhood search's two exact solvers (lns.py). Both give each kind
the share of the time its recent gain per second earns, with a floor so that a kind that has
not gained lately is still tried.
"""

from __future__ import annotations

from collections import deque

from autoshard.solver.procs.clock import MONOTONIC, Clock

WINDOW = 30.0
"""Seconds of turns a kind's rate looks back over."""
RATE_FLOOR = 0.25
"""The kind gaining less still gets time as if it gained this share of the other's rate."""


class Shares:
    """Processor time per kind of turn, adapted to what each has been gaining lately: a kind's
    rate is its relative gain per second of its own turns over the last WINDOW seconds; its
    share is its rate, floored at RATE_FLOOR of the best rate, over their sum, or ``prior``
    while no kind gained in the window. The next turn goes to the kind furthest behind its share
    of the time spent so far (``behind``)."""

    def __init__(self, prior: list[float], clock: Clock = MONOTONIC) -> None:
        self.clock = clock
        self.prior = prior
        self.spent = [0.0] * len(prior)
        self.turns: deque[tuple[float, int, float, float]] = deque()  # (end, kind, seconds, gain)

    def share(self, now: float | None = None) -> list[float]:
        """Each kind's share of the time ``now`` (the clock's reading unless given)."""
        now = self.clock() if now is None else now
        while self.turns and self.turns[0][0] < now - WINDOW:
            self.turns.popleft()
        gain, seconds = [0.0] * len(self.prior), [0.0] * len(self.prior)
        for _, k, took, won in self.turns:
            gain[k] += won
            seconds[k] += took
        rate = [g / max(t, 0.01) for g, t in zip(gain, seconds)]
        top = max(rate)
        if top <= 0:
            return list(self.prior)
        weights = [max(r, RATE_FLOOR * top) for r in rate]
        total = sum(weights)
        return [w / total for w in weights]

    def next(self, now: float | None = None) -> int:
        """The kind that takes the next turn."""
        return behind(self.spent, self.share(now))

    def record(self, k: int, seconds: float, gain: float, now: float | None = None) -> None:
        """Kind k's turn ended at ``now`` after ``seconds``, its relative gain ``gain``."""
        self.spent[k] += seconds
        self.turns.append((self.clock() if now is None else now, k, seconds, gain))


def behind(spent: list[float], share: list[float]) -> int:
    """The kind furthest behind its share of the time spent so far (the first on a tie): so each
    kind's time stays within one of its turns of its share."""
    total = sum(spent)
    return min(range(len(spent)), key=lambda j: spent[j] - share[j] * total)
