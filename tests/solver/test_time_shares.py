"""How kinds of work share the time (time_shares.py): the second engine's turns, neighbourhood
search's solvers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.solver.search.time_shares import behind


@settings(max_examples=100, deadline=None)
@given(st.floats(0.05, 0.95), st.lists(st.tuples(st.floats(0.01, 10.0), st.floats(0.01, 10.0)), min_size=1, max_size=200))
def test_each_kind_stays_within_one_turn_of_its_share(weight_share, lengths):
    """Turns of any lengths (the k-th turn of a kind lasting lengths[k] of that kind): after every
    turn, each kind's time is within its longest turn of its share of the total."""
    share = [1.0 - weight_share, weight_share]
    spent = [0.0, 0.0]
    count = [0, 0]
    longest = [0.0, 0.0]
    for _ in range(len(lengths)):
        k = behind(spent, share)
        turn = lengths[min(count[k], len(lengths) - 1)][k]
        spent[k] += turn
        count[k] += 1
        longest[k] = max(longest[k], turn)
        total = sum(spent)
        for j in (0, 1):
            assert spent[j] - share[j] * total <= longest[j] + 1e-9


def test_the_first_turn_is_the_first_kind_and_an_only_kind_always_turns():
    assert behind([0.0, 0.0], [0.5, 0.5]) == 0
    assert behind([3.0], [1.0]) == 0
    assert behind([5.0, 1.0], [0.5, 0.5]) == 1


def test_shares_follow_the_prior_until_a_kind_gains_then_favour_it_with_a_floor_while_it_lasts():
    from autoshard.solver.search.time_shares import RATE_FLOOR, WINDOW, Shares

    shares, now = Shares([0.75, 0.25]), 0.0
    for _ in range(20):  # nothing gains: the prior, and the time split by it
        now += 1.0
        shares.record(shares.next(now), 1.0, 0.0, now)
    assert shares.share(now) == [0.75, 0.25]
    assert abs(shares.spent[0] - 3 * shares.spent[1]) <= 1.0
    now += 5.0
    shares.record(1, 5.0, 0.01, now)  # the second kind gains: it leads, the first keeps its floor
    lead = shares.share(now)
    assert lead[1] > lead[0] and abs(lead[0] - RATE_FLOOR / (1 + RATE_FLOOR)) < 1e-12
    assert shares.next(now) == 1  # behind its new share
    now += 1.0
    shares.record(0, 1.0, 0.05, now)  # the first gains more per second: it leads
    assert shares.share(now)[0] > shares.share(now)[1]
    assert shares.share(now + WINDOW + 0.5) == [0.75, 0.25]  # gains older than the window are forgotten
