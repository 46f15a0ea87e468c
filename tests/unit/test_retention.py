"""Layer 1: which roots each target's cache holds and what a new root would push out
(``pharos.retention``): LRU order, retention learned from replies (a hit raises it, a miss
lowers it), roots beyond it taken as gone, unknown retention pricing nothing, liveness and
holders, bounds."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pharos.retention import LIVE_SEC, RootCaches, parse_roots_row


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


# --- replication (export / merge) ----------------------------------------------------------

KEYS = {0: "a/m", 1: "b/m", 2: "c/m"}
IDS = {k: i for i, k in KEYS.items()}


def picture(rc: RootCaches) -> tuple[dict[int, list[tuple[int, int]]], dict[int, int]]:
    """Every target's roots in LRU order with their tokens, and the retentions."""
    return ({t: list(rc.held(t).items()) for t in KEYS if rc.held(t)}, dict(rc.retained))


def test_export_merge_round_trip_rebuilds_order_sizes_and_retention() -> None:
    """A fresh cache merging another's export holds the same roots in the same LRU order
    with the same sizes and the same retention, so it answers ``pushed_out`` alike; targets
    it does not know are dropped and counted."""
    rc = RootCaches()
    for i, (t, root, n) in enumerate([(0, 1, 500), (0, 2, 300), (1, 1, 500), (0, 3, 200),
                                      (0, 1, 500)]):
        rc.sent(t, root, n, float(i))
    rc.learn(0, 500, 500, cached=500, now=5.0)
    other = RootCaches()
    assert other.merge(rc.export(KEYS.get), IDS.get) == (4, 0)
    assert picture(other) == picture(rc)
    assert list(other.held(0)) == [2, 3, 1]
    assert other.tokens_of(3) == 200
    assert all(other.pushed_out(0, r) == rc.pushed_out(0, r) for r in (1, 2, 3))
    assert RootCaches().merge(rc.export(KEYS.get), {"a/m": 0}.get) == (3, 1)  # b/m unknown
    # A later send here still counts the merged roots as gone ahead.
    assert other.sent(0, 2, 300, 9.0) == 700


def test_merge_is_idempotent_and_any_order_gives_the_same_picture() -> None:
    """Three instances' pictures of the same targets, merged into fresh caches in every
    order and each twice, give one picture: per root the latest send, retention the one
    learned last; merging one's own export changes nothing."""
    a, b, c = RootCaches(), RootCaches(), RootCaches()
    a.sent(0, 1, 500, 1.0)
    b.sent(0, 2, 300, 2.0)
    c.sent(0, 1, 500, 3.0)  # root 1 again, later: the newest at target 0
    b.sent(1, 4, 100, 4.0)
    a.learn(0, 500, 300, cached=0, now=10.0)  # taught less, later
    b.sent(0, 1, 500, 2.5)
    b.learn(0, 500, 300, cached=500, now=5.0)
    exports = [x.export(KEYS.get) for x in (a, b, c)]
    pictures = []
    for order in ((0, 1, 2), (2, 1, 0), (1, 0, 2), (0, 2, 1, 0, 1, 2)):
        m = RootCaches()
        for i in order:
            m.merge(exports[i], IDS.get)
        pictures.append(picture(m))
    assert all(p == pictures[0] for p in pictures)
    assert pictures[0] == ({0: [(2, 300), (1, 500)], 1: [(4, 100)]}, {0: 799})
    for x, rows in zip((a, b, c), exports, strict=True):
        before = picture(x)
        assert x.merge(rows, IDS.get) == (0, 0) and picture(x) == before


def test_merge_keeps_the_newest_roots_within_the_bound() -> None:
    """Merged pictures keep the ``roots_per_target`` most recently sent roots, whatever the
    order of the merges."""
    a, b = RootCaches(roots_per_target=3), RootCaches(roots_per_target=3)
    for i in range(3):
        a.sent(0, 10 + i, 100, float(2 * i))
        b.sent(0, 20 + i, 100, float(2 * i + 1))
    ab, ba = RootCaches(roots_per_target=3), RootCaches(roots_per_target=3)
    ab.merge(a.export(KEYS.get), IDS.get)
    ab.merge(b.export(KEYS.get), IDS.get)
    ba.merge(b.export(KEYS.get), IDS.get)
    ba.merge(a.export(KEYS.get), IDS.get)
    assert list(ab.held(0)) == list(ba.held(0)) == [21, 12, 22]


def test_merge_does_not_bring_back_roots_of_a_cache_that_started_empty() -> None:
    """After ``forget`` (a new engine process), a peer's roots sent there before are not
    taken back; those sent after are."""
    rc, peer = RootCaches(), RootCaches()
    peer.sent(0, 1, 500, 1.0)
    rc.forget(0, now=2.0)
    peer.sent(0, 2, 300, 3.0)
    rc.merge(peer.export(KEYS.get), IDS.get)
    assert list(rc.held(0)) == [2]


def test_rows_off_the_wire_are_checked() -> None:
    """A row from the wire round-trips through JSON; unknown fields and trailing items are
    ignored; a bad one names what is wrong."""
    rc = RootCaches()
    rc.sent(0, 2**64 - 1, 500, 1.0)
    row = rc.export(KEYS.get)[0]
    raw = json.loads(json.dumps(row.to_json()))
    assert parse_roots_row(raw) == row
    raw["future"] = 1
    raw["roots"][0].append("more")
    assert parse_roots_row(raw) == row
    for bad, why in [([], "expected an object"), ({"target": 1}, "target"),
                     ({"target": "a", "retained": -1}, "retained"),
                     ({"target": "a", "learned_at": "x"}, "learned_at"),
                     ({"target": "a", "roots": {}}, "roots must be a list"),
                     ({"target": "a", "roots": [[2**64, 1, 0.0]]}, "a root"),
                     ({"target": "a", "roots": [[1, 1, float("nan")]]}, "a root")]:
        with pytest.raises(ValueError, match=why):
            parse_roots_row(bad)


def test_the_lru_order_survives_a_clock_that_stands_still_or_goes_back() -> None:
    """Send times strictly increase per target, so a merge rebuilds the LRU order even
    when the sends shared one clock reading or the clock went back."""
    rc = RootCaches()
    for root, now in ((3, 5.0), (1, 5.0), (2, 4.0), (3, 5.0)):
        rc.sent(0, root, 100, now)
    other = RootCaches()
    other.merge(rc.export(KEYS.get), IDS.get)
    assert list(other.held(0)) == list(rc.held(0)) == [1, 2, 3]
