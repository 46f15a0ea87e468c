"""Layer 3 (issue 16 item 3): a pair of peers on one Clock over the in-memory transport,
ticking at the workers' 50 ms. Idle, they exchange only a keep-alive every ``KEEPALIVE``
seconds (no cells, no retention), which keeps each one live in the other's eyes; a change
(a prefix op, a gauge, a reservation against a budget) still reaches the peer, a
reservation on the next reactor turn; a peer that goes silent is still taken for gone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from pharos.peer.node import KEEPALIVE
from pharos.peer.wire import decode
from pharos.prefix import PrefixOp
from pharos.sched import PEER_SILENCE_SEC, Lease, SchedRequest
from pharos.usage import Refusal, Reservation
from tests.support.peer_mesh import Instance, MemoryNetwork, instance, llamacpp, stop

MEMBERS = ["a:1", "b:1"]
URL = "http://engine:1"
DAY = 86400.0
WORKER_TICK = 0.05


@pytest.fixture
def pair() -> Iterator[tuple[Instance, Instance, MemoryNetwork, Clock]]:
    """Two started instances ticking every 50 ms over one 4-slot llama.cpp double, after
    their first round and a second of exchanges."""
    clock = Clock()
    clock.advance(DAY * 20_000 + 3600)
    net = MemoryNetwork()
    engines = {URL: llamacpp(slots=4)}
    a, b = (instance(m, MEMBERS, net, clock, engines) for m in MEMBERS)
    for inst in (a, b):
        inst.node.tick = WORKER_TICK
        inst.node.startService()
    clock.advance(0.6)
    for _ in range(20):
        clock.advance(WORKER_TICK)
    yield a, b, net, clock
    for inst in (a, b):
        stop(inst)


def sent_by(net: MemoryNetwork, inst: Instance) -> list[bytes]:
    return [body for _, body in net.delivered if decode(body).origin == inst.ledger.origin]


def got(d: Deferred[Lease]) -> Lease:
    out: list[Lease] = []
    d.addCallback(out.append)
    assert out, "not granted"
    return out[0]


def test_an_idle_pair_sends_only_keepalives_without_cells_or_retention(
        pair: tuple[Instance, Instance, MemoryNetwork, Clock]) -> None:
    """30 s idle at a 50 ms tick (600 ticks each) sends at most one delta per KEEPALIVE per
    direction, each a keep-alive carrying gauges but no cells."""
    a, b, net, clock = pair
    spend_ok = a.ledger.reserve("k", "t", 10, None)  # some usage, so cells exist
    assert isinstance(spend_ok, Reservation)
    a.ledger.settle(spend_ok, "m", 5, 0, 5)
    for _ in range(10):
        clock.advance(WORKER_TICK)  # the change goes out
    assert a.ledger.export_recent()
    net.delivered.clear()
    for _ in range(600):
        clock.advance(WORKER_TICK)
    for inst in (a, b):
        bodies = sent_by(net, inst)
        assert 0 < len(bodies) <= 30 / KEEPALIVE + 1
        for body in bodies:
            d = decode(body)
            assert not d.cells and not d.prefix and "reserved" in d.gauges
    assert a.node.peers["b:1"].idle > 500
    assert a.node.peers["b:1"].keepalives >= len(sent_by(net, a))


def test_keepalives_keep_a_live_idle_peers_gauges_past_the_silence_window(
        pair: tuple[Instance, Instance, MemoryNetwork, Clock]) -> None:
    """A holds a lease and then does nothing: B still counts it after several silence
    windows (keep-alives refresh it), and B's status shows A heard within KEEPALIVE."""
    a, b, net, clock = pair
    lease = got(a.sched.acquire("k", 1, SchedRequest("m", 100, 1)))
    for _ in range(int(3 * PEER_SILENCE_SEC / WORKER_TICK)):
        clock.advance(WORKER_TICK)
        assert b.sched.peer_inflight(lease.target.id) == 1
    heard = b.node.origins[a.ledger.origin].heard_at
    assert clock.seconds() - heard <= KEEPALIVE + WORKER_TICK + 1e-9
    lease.release(None)


def test_a_silent_peer_is_still_taken_for_gone(
        pair: tuple[Instance, Instance, MemoryNetwork, Clock]) -> None:
    """A holds a lease and a reservation, then is cut off: once PEER_SILENCE_SEC passes,
    B no longer counts either; A's link to B fails and A marks B disconnected."""
    a, b, net, clock = pair
    lease = got(a.sched.acquire("k", 1, SchedRequest("m", 100, 1)))
    held = a.ledger.reserve("k", "t", 50, 100)
    assert isinstance(held, Reservation)
    clock.advance(0)
    assert b.sched.peer_inflight(lease.target.id) == 1
    assert b.ledger.peers_reserved(key="k") == 50
    net.cut.add("a:1")
    for _ in range(int(PEER_SILENCE_SEC / WORKER_TICK) + 2):
        clock.advance(WORKER_TICK)
    assert b.sched.peer_inflight(lease.target.id) == 0
    assert b.ledger.peers_reserved(key="k") == 0
    clock.advance(KEEPALIVE + 0.5)
    assert a.node.peers["b:1"].failing is not None
    assert not a.node.peers["b:1"].connected


def test_a_reservation_reaches_the_peer_on_the_next_turn(
        pair: tuple[Instance, Instance, MemoryNetwork, Clock]) -> None:
    """A reserves against a daily budget between ticks: B counts it after one reactor turn,
    no tick later, and refuses what would pass the budget; a reservation without a limit
    waits for the tick (nothing is pushed for it)."""
    a, b, net, clock = pair
    held = a.ledger.reserve("k", "t", 700, 1000)
    assert isinstance(held, Reservation)
    before = len(sent_by(net, a))
    clock.advance(0)
    assert len(sent_by(net, a)) == before + 1
    assert b.ledger.peers_reserved(key="k") == 700
    assert isinstance(b.ledger.reserve("k", "t", 400, 1000), Refusal)
    free = a.ledger.reserve("u", "t", 5, None)
    assert isinstance(free, Reservation)
    clock.advance(0)
    assert len(sent_by(net, a)) == before + 1
    clock.advance(WORKER_TICK)
    assert b.ledger.peers_reserved(key="u") == 5


def test_a_change_goes_at_the_next_tick_and_only_then(
        pair: tuple[Instance, Instance, MemoryNetwork, Clock]) -> None:
    """A prefix op and an in-flight gauge each go out at A's next tick even when a
    keep-alive is not due; the tick after, with nothing new, sends nothing."""
    a, b, net, clock = pair
    clock.advance(WORKER_TICK)
    before = len(sent_by(net, a))
    a.node.push(PrefixOp(f"{URL}#m", (7, 8), clock.seconds()))
    clock.advance(WORKER_TICK)
    assert len(sent_by(net, a)) == before + 1
    assert decode(sent_by(net, a)[-1]).prefix
    lease = got(a.sched.acquire("k", 1, SchedRequest("m", 100, 2)))
    clock.advance(WORKER_TICK)
    assert len(sent_by(net, a)) == before + 2
    assert b.sched.peer_inflight(lease.target.id) == 1
    clock.advance(WORKER_TICK)
    assert len(sent_by(net, a)) == before + 2
    lease.release(None)
    clock.advance(WORKER_TICK)
    assert b.sched.peer_inflight(lease.target.id) == 0


def test_a_delta_carries_only_the_cells_that_changed_and_all_after_a_failure(
        pair: tuple[Instance, Instance, MemoryNetwork, Clock]) -> None:
    """With usage for three keys acknowledged, a request for one key sends only that key's
    cells; after a delta that failed, the next one carries every cell again, and B's totals
    match A's throughout."""
    a, b, net, clock = pair
    for key in ("k1", "k2", "k3"):
        held = a.ledger.reserve(key, "t", 10, None)
        assert isinstance(held, Reservation)
        a.ledger.settle(held, "m", 5, 0, 5)
    clock.advance(2 * WORKER_TICK)
    held = a.ledger.reserve("k2", "t", 10, None)
    assert isinstance(held, Reservation)
    a.ledger.settle(held, "m", 7, 0, 3)
    net.delivered.clear()
    clock.advance(WORKER_TICK)
    [body] = sent_by(net, a)
    assert {c["key"] for c in decode(body).cells} == {"k2"}
    assert b.ledger.spent_today(key="k2") == 20
    net.cut.add("b:1")
    held = a.ledger.reserve("k1", "t", 10, None)
    assert isinstance(held, Reservation)
    a.ledger.settle(held, "m", 1, 0, 1)
    clock.advance(WORKER_TICK)
    net.cut.discard("b:1")
    net.delivered.clear()
    clock.advance(WORKER_TICK)
    full = decode(sent_by(net, a)[0])
    assert {c["key"] for c in full.cells} == {"k1", "k2", "k3"}
    for key in ("k1", "k2", "k3"):
        assert b.ledger.spent_today(key=key) == a.ledger.spent_today(key=key)
