"""Layer 1: which roots each target's cache holds and what a new root would push out
(``pharos.retention``): LRU order, retention learned from replies (a hit raises it, a miss
lowers it), roots beyond it taken as gone, unknown retention pricing nothing, liveness and
holders, bounds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pharos.retention import LIVE_SEC, RootCaches


def test_sent_reports_the_roots_used_since() -> None:
    """``sent`` answers the tokens of the other roots sent to the target since this root
    was last used there, None for a root it never had, and makes the root the newest."""
    rc = RootCaches()
    assert rc.sent(0, 1, 500, 0.0) is None
    assert rc.sent(0, 2, 300, 1.0) is None
    assert rc.sent(0, 3, 200, 2.0) is None
    assert rc.sent(0, 1, 500, 3.0) == 500  # roots 2 and 3 since
    assert list(rc.held(0)) == [2, 3, 1]
    assert rc.sent(0, 1, 500, 4.0) == 0
    assert rc.sent(1, 1, 500, 4.0) is None  # per target


def test_unknown_retention_prices_nothing() -> None:
    """Before any reply taught the target's retention, ``evicts`` is None (unknown)."""
    rc = RootCaches()
    rc.sent(0, 1, 500, 0.0)
    assert rc.evicts(0, 9, 500) is None


def test_a_hit_raises_and_a_miss_lowers_retention() -> None:
    """A root found cached behind ``ahead`` tokens proves at least ahead + its tokens
    retained; one found evicted proves fewer, and the roots beyond are dropped as gone."""
    rc = RootCaches()
    for root in (1, 2, 3, 4):
        rc.sent(0, root, 500, float(root))
    ahead = rc.sent(0, 1, 500, 5.0)
    assert ahead == 1500
    rc.learn(0, 500, ahead, cached=496)
    assert rc.retained[0] == 2000
    ahead = rc.sent(0, 2, 500, 6.0)  # 3, 4, 1 since: 1500 ahead
    rc.learn(0, 500, ahead, cached=0)
    assert rc.retained[0] == 1999
    assert [r for r, _ in rc.resident(0)] == [2, 1, 4]  # 3 is taken as gone...
    assert rc.sent(0, 3, 500, 7.0) == 1500  # ...but remembered: a hit there raises it
    rc.learn(0, 500, 1500, cached=500)
    assert rc.retained[0] == 2000
    rc.learn(0, 500, None, cached=0)  # not held before: teaches nothing
    rc.learn(0, 500, 0, cached=None)  # unknown usage: nothing
    assert rc.retained[0] == 2000


def test_evicts_the_oldest_roots_that_do_not_fit() -> None:
    """With the retention known, a new root pushes out the least recently used roots until
    it fits, the last of them only in part; a root already held, or one that fits, pushes
    out nothing."""
    rc = RootCaches()
    for root in (1, 2, 3):
        rc.sent(0, root, 500, float(root))
    rc.retained[0] = 1500
    assert rc.evicts(0, 9, 500) == [(1, 500)]
    assert rc.evicts(0, 9, 900) == [(1, 500), (2, 400)]  # the second loses its tail
    assert rc.evicts(0, 2, 500) == []
    rc.retained[0] = 3000
    assert rc.evicts(0, 9, 500) == []


def test_liveness_and_holders() -> None:
    """A root is live while it was asked for within LIVE_SEC; holders counts the targets
    that hold it; forget empties one target."""
    rc = RootCaches()
    rc.sent(0, 1, 500, 0.0)
    rc.sent(1, 1, 500, 1.0)
    rc.sent(2, 2, 500, 1.0)
    assert rc.live(1, 1.0 + LIVE_SEC) and not rc.live(1, 1.1 + LIVE_SEC)
    assert not rc.live(7, 0.0)
    assert rc.holders(1, [0, 1, 2]) == 2 and rc.holders(1, [2]) == 0
    rc.forget(1)
    assert rc.holders(1, [0, 1, 2]) == 1


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(1, 900),
                          st.booleans()), max_size=200))
def test_bounded_and_consistent(ops: list[tuple[int, int, int, bool]]) -> None:
    """Under any sequence of sends and replies: at most ``roots_per_target`` roots a target,
    retention never below one root's tokens, resident roots within the retention (but the
    newest one), and ``evicts`` only ever names resident roots, oldest first."""
    rc = RootCaches(roots_per_target=8)
    for i, (target, root, tokens, hit) in enumerate(ops):
        ahead = rc.sent(target, root, tokens, float(i))
        rc.learn(target, tokens, ahead, cached=tokens if hit else 0)
        assert len(rc.held(target)) <= 8
        resident = rc.resident(target)
        known = rc.retained.get(target)
        if known is not None:
            assert known >= 1
            assert len(resident) == 1 or sum(n for _, n in resident) <= known
        pushed = rc.evicts(target, 1000 + i, tokens)
        if pushed:
            oldest_first = [r for r, _ in reversed(resident)]
            assert [r for r, _ in pushed] == oldest_first[: len(pushed)]


def test_pushed_out_only_when_known() -> None:
    """A root is taken as pushed out only when it was sent to the target and more root tokens
    went there since than the learned retention keeps; never while the retention or the root
    is unknown there, and never the newest root."""
    rc = RootCaches()
    for root in (1, 2, 3):
        rc.sent(0, root, 500, float(root))
    assert not rc.pushed_out(0, 1)  # retention unknown
    rc.retained[0] = 1000
    assert rc.pushed_out(0, 1) and not rc.pushed_out(0, 2) and not rc.pushed_out(0, 3)
    assert not rc.pushed_out(0, 9) and not rc.pushed_out(1, 1)
    rc.retained[0] = 100  # smaller than one root: the newest is still held
    assert not rc.pushed_out(0, 3)
