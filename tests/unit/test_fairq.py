"""Layer 1: the two-level fair queue (issue 11 item 4): tenants by virtual time, then keys by
their head's virtual finish, costs over weights; idle keys bank no credit."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from pharos.fairq import FairQueue


@dataclass(eq=False)
class W:
    key: str
    tenant: str = "t"
    weight: int = 1
    tenant_weight: int = 1
    cost: float = 1.0


def serve(q: FairQueue[W], n: int) -> list[W]:
    """Serve ``n`` waiters in the queue's order (every head placeable)."""
    out = []
    for _ in range(n):
        w = next(q.heads())
        q.served(w)
        out.append(w)
    return out


def test_weights_share_grants_in_proportion() -> None:
    """Two backlogged keys of weight 2 and 1 with equal costs get 2:1 of the grants."""
    q: FairQueue[W] = FairQueue()
    for _ in range(300):
        q.push(W("a", weight=2))
        q.push(W("b", weight=1))
    got = Counter(w.key for w in serve(q, 300))
    assert got["a"] == 200 and got["b"] == 100


def test_cost_not_count_is_shared() -> None:
    """A key whose requests cost ten times as much gets a tenth of the requests: the share is
    of work, not of requests."""
    q: FairQueue[W] = FairQueue()
    for _ in range(200):
        q.push(W("long", cost=10.0))
        q.push(W("short", cost=1.0))
    got = Counter(w.key for w in serve(q, 110))
    assert got["short"] == 100 and got["long"] == 10


def test_a_light_key_is_served_within_a_grant_of_arriving() -> None:
    """A flood from one key (1,000 queued) does not delay a light key's request that arrives
    behind it: it is served next or the one after."""
    q: FairQueue[W] = FairQueue()
    for _ in range(1000):
        q.push(W("heavy"))
    serve(q, 500)
    light = W("light")
    q.push(light)
    assert light in serve(q, 2)


def test_an_idle_key_banks_no_credit() -> None:
    """A key served 100 times while the other was idle keeps that debt but the newcomer does
    not get 100 grants in a row: once both are backlogged they alternate."""
    q: FairQueue[W] = FairQueue()
    for _ in range(200):
        q.push(W("a"))
    serve(q, 100)
    for _ in range(50):
        q.push(W("b"))
    order = [w.key for w in serve(q, 20)]
    assert order.count("b") in (10, 11), order
    assert "aaa" not in "".join(order) and "bbb" not in "".join(order), order


def test_tenants_first_then_keys() -> None:
    """100 keys of one tenant get together what one key of another tenant of the same weight
    gets alone."""
    q: FairQueue[W] = FairQueue()
    for _ in range(10):
        for i in range(100):
            q.push(W(f"many-{i}", tenant="crowd"))
    for _ in range(1000):
        q.push(W("solo", tenant="alone"))
    got = Counter(w.tenant for w in serve(q, 400))
    assert got["crowd"] == 200 and got["alone"] == 200


def test_tenant_weights() -> None:
    """A tenant of weight 3 gets three times another's share whatever its keys' count."""
    q: FairQueue[W] = FairQueue()
    for _ in range(400):
        q.push(W("x", tenant="big", tenant_weight=3))
        q.push(W("y", tenant="small", tenant_weight=1))
        q.push(W("z", tenant="small", tenant_weight=1))
    got = Counter(w.tenant for w in serve(q, 400))
    assert got["big"] == 300 and got["small"] == 100


def test_fifo_within_a_key_and_front_for_a_retry() -> None:
    """A key's waiters leave in arrival order; a retry pushed to the front leaves first."""
    q: FairQueue[W] = FairQueue()
    first, second, retry = W("k"), W("k"), W("k")
    q.push(first)
    q.push(second)
    q.push(retry, front=True)
    assert serve(q, 3) == [retry, first, second]


def test_remove_and_counts() -> None:
    """A waiter whose client left is removed (once); counts and backlog follow."""
    q: FairQueue[W] = FairQueue()
    a, b = W("a"), W("b", tenant="u")
    q.push(a)
    q.push(b)
    assert q.backlog() == {"t": {"a": 1}, "u": {"b": 1}}
    assert q.remove(a) and not q.remove(a)
    assert len(q) == 1 and list(q.heads()) == [b]
    q.served(b)
    assert len(q) == 0 and list(q.heads()) == [] and q.backlog() == {}


def test_heads_lists_every_backlogged_key_for_work_conservation() -> None:
    """Heads of every backlogged key are offered, best first, so a caller that cannot place
    the best one serves the next (nobody idles while someone could run)."""
    q: FairQueue[W] = FairQueue()
    for key in ("a", "a", "b", "c"):
        q.push(W(key))
    q.served(next(q.heads()))  # a served once: its second waiter goes last
    assert [w.key for w in q.heads()] == ["b", "c", "a"]


def test_room_is_left_only_by_keys_over_their_share_for_keys_under_theirs() -> None:
    """With the room (2 of 16 slots) free: a key over its share waits if another active key
    is under its own; a key within its share, a key alone, or with more slots free, goes; a
    fleet of fewer than 8 slots keeps no room."""
    from pharos.fairq import ACTIVE_SEC, Shares

    s = Shares()
    s.seen("heavy", 1, 0.0)
    for _ in range(15):
        s.started("heavy")
    assert not s.must_leave_room("heavy", 1, 1, 16, 1.0)  # alone
    s.seen("light", 1, 1.0)
    assert s.must_leave_room("heavy", 1, 1, 16, 2.0)
    assert s.must_leave_room("heavy", 1, 2, 16, 2.0)
    assert not s.must_leave_room("heavy", 1, 3, 16, 2.0)  # three free: more than the room
    assert not s.must_leave_room("heavy", 1, 1, 7, 2.0)  # a small fleet keeps no room
    assert not s.must_leave_room("light", 1, 1, 16, 2.0)  # under its share
    assert not s.must_leave_room("heavy", 1, 1, 16, 2.0 + ACTIVE_SEC)  # light went quiet
    for _ in range(8):
        s.started("light")
    assert not s.must_leave_room("heavy", 1, 1, 16, 2.0)  # nobody under share to serve
    for _ in range(8):
        s.ended("light")
    assert s.inflight == {"heavy": 15}


def test_room_follows_tenant_shares() -> None:
    """Two tenants of equal weight on 16 slots: tenant b's one key at its tenant's 8 leaves
    the room to tenant a, whose key a2 is under its share; a1, at its key share of a's 8,
    leaves it too; a2 goes. Without tenants every key's share would be 16/3, and b's key
    would be held back against a's many keys however little a used."""
    from pharos.fairq import Shares

    s = Shares()
    for key, tenant in (("a1", "a"), ("a2", "a"), ("b", "b")):
        s.seen(key, 1, 0.0, tenant, 1)
    for key, n in (("a1", 4), ("a2", 3), ("b", 8)):
        for _ in range(n):
            s.started(key)
    assert s.must_leave_room("b", 1, 1, 16, 1.0)
    assert s.must_leave_room("a1", 1, 1, 16, 1.0)
    assert not s.must_leave_room("a2", 1, 1, 16, 1.0)
    s.ended("b")
    s.ended("b")  # b at 6 of its 8: b goes, and a1 still waits for a2
    assert not s.must_leave_room("b", 1, 1, 16, 1.0)


def test_room_for_keeps_enough_slots_for_poisson_arrivals_within_the_window() -> None:
    """``room_for``: the fewest slots whose overflow (that many arrivals or more within the
    window) has probability at most ``ROOM_RISK``: 3 for 1.1 req/s over 0.5 s (P(N >= 2) is
    10 %, P(N >= 3) 1.9 %), 1 for a slow key, never more than the limit, never below 1."""
    from pharos.fairq import ROOM_RISK, room_for

    assert room_for(1.1, 0.5, 8) == 3
    assert room_for(0.02, 0.5, 8) == 1
    assert room_for(0.0, 0.5, 8) == 1
    assert room_for(10.0, 0.5, 8) == 8  # wants more than the limit
    assert room_for(10.0, 0.5, 1) == 1
    mean = 4.0 * 0.5
    for r in range(1, 12):  # the returned room is the first whose overflow is within the risk
        over = 1.0 - sum(math.exp(-mean) * mean ** i / math.factorial(i) for i in range(r))
        assert (room_for(4.0, 0.5, 99) <= r) == (over <= ROOM_RISK), r


def test_a_keys_rate_is_its_recent_arrivals_a_second() -> None:
    """``Shares.rate``: a key arriving twice a second for a minute reads about 2/s; one that
    just came with three requests in a second reads 3/s, not a tenth of that (no time
    constant's worth of history yet); an unknown key reads 0; a key silent for a minute
    reads under a tenth of its rate."""
    from pharos.fairq import Shares

    s = Shares()
    for i in range(120):
        s.seen("steady", 1, i * 0.5)
    assert 1.8 <= s.rate("steady", 60.0) <= 2.2
    for t in (100.0, 100.4, 100.9):
        s.seen("new", 1, t)
    assert 2.5 <= s.rate("new", 101.0) <= 3.1
    assert s.rate("unknown", 101.0) == 0.0
    assert s.rate("steady", 120.0) < 0.2


def test_the_room_grows_with_the_entitled_keys_rates() -> None:
    """With the fleet's release interval known (16 slots, one release every 25 ms, the room's
    window 0.1 s): a light key at 0.1 req/s is kept one slot, so the heavy key goes with two
    free; at 10 req/s it is kept four (a quarter of the fleet, the limit), so the heavy key
    waits with four free and goes with five; with the interval unknown, the fixed room of 2."""
    from pharos.fairq import Shares

    s = Shares()
    s.seen("heavy", 1, 0.0)
    for _ in range(14):
        s.started("heavy")
    for i in range(6):
        s.seen("slow", 1, i * 10.0)
    assert s.must_leave_room("heavy", 1, 1, 16, 55.0, release_sec=0.025)
    assert not s.must_leave_room("heavy", 1, 2, 16, 55.0, release_sec=0.025)
    for i in range(300):
        s.seen("fast", 1, 60.0 + i * 0.1)
    assert s.must_leave_room("heavy", 1, 4, 16, 90.0, release_sec=0.025)
    assert not s.must_leave_room("heavy", 1, 5, 16, 90.0, release_sec=0.025)
    assert s.must_leave_room("heavy", 1, 2, 16, 90.0, release_sec=None)
    assert not s.must_leave_room("heavy", 1, 3, 16, 90.0, release_sec=None)
