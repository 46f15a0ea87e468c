"""Layer 3 (spec §14, issue 13 item 6): three instances in one process over an in-memory
transport that can cut one off, ticks stepped by hand on one Clock. Shared occupancy, quotas
over every origin, a partition that lowers routing quality but never stops serving, a heal
that merges usage exactly, deltas in any order and repetition giving the same state."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from pharos.peer.node import DELTA_TIMEOUT, KEEPALIVE, TICK, PeerNode
from pharos.peer.wire import decode
from pharos.prefix import EMPTY, Chain, PrefixOp
from pharos.sched import Lease, SchedRequest
from pharos.state.stats import Sample
from pharos.usage import Refusal, Reservation
from tests.support.peer_mesh import Instance, MemoryNetwork, instance, llamacpp, stop

MEMBERS = ["a:1", "b:1", "c:1"]
URL = "http://engine:1"
DAY = 86400.0


def got(d: Deferred[Lease]) -> Lease:
    out: list[Lease] = []
    d.addCallback(out.append)
    assert out, "not granted"
    return out[0]


def req(seed: int = 1, chain: Chain = EMPTY) -> SchedRequest:
    return SchedRequest("m", 100, seed, chain=chain)


@pytest.fixture
def mesh() -> Iterator[tuple[list[Instance], MemoryNetwork, Clock]]:
    """Three started instances over one 4-slot llama.cpp double, after their first round."""
    clock = Clock()
    clock.advance(DAY * 20_000 + 3600)
    net = MemoryNetwork()
    engines = {URL: llamacpp(slots=4)}
    insts = [instance(m, MEMBERS, net, clock, engines) for m in MEMBERS]
    for inst in insts:
        inst.node.startService()
    clock.advance(0.6)  # first scrape round
    tick(clock)
    yield insts, net, clock
    for inst in insts:
        stop(inst)


def tick(clock: Clock, n: int = 1) -> None:
    for _ in range(n):
        clock.advance(TICK)


def test_each_instance_skips_itself_and_hears_the_others(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """Every member list names all three; the one that answers with our own origin is us."""
    insts, net, clock = mesh
    for inst in insts:
        me = inst.node.peers[inst.member]
        assert me.myself and me.loop is None
        others = [p for m, p in inst.node.peers.items() if m != inst.member]
        assert all(p.connected and not p.myself for p in others)
        assert set(inst.node.origins) == {f"o-{m}" for m in MEMBERS} - {inst.ledger.origin}


def test_occupancy_is_shared_and_a_peer_release_serves_the_queue(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """Two leases on A and two on B fill the 4-slot engine for C within one tick; C's
    request waits, and A's release reaches C in the next delta and serves it."""
    insts, net, clock = mesh
    a, b, c = insts
    held = [got(a.sched.acquire("k", 1, req(i))) for i in range(2)]
    held += [got(b.sched.acquire("k", 1, req(i))) for i in range(2)]
    tick(clock)
    assert c.sched.peer_inflight(0) == 4
    waiting = c.sched.acquire("k", 1, req(9))
    assert not waiting.called
    tick(clock)
    assert a.sched.peer_waiting("m") == 1  # C's waiter is seen by its peers
    held[0].release()
    assert not waiting.called  # C learns it at A's next tick
    tick(clock)
    assert got(waiting).target.key == f"{URL}#m"


def test_prefix_records_reach_the_peers(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """A success on A is recorded in B's and C's index as a peer slot within one tick."""
    insts, net, clock = mesh
    a, b, c = insts
    chain = Chain((101, 202), (4000, 8000))
    lease = got(a.sched.acquire("k", 1, req(1, chain)))
    lease.release(Sample(True, False, 0.1, 0.2, prompt_tokens=2000, cached_tokens=0))
    tick(clock)
    for inst in (b, c):
        assert [s[3] for s in inst.sched.index.slots(202)] == ["peer"]
        match = inst.sched.index.lookup(chain, inst.sched.learning.gen)
        assert match[0].matched_bytes == 8000


def spend(inst: Instance, tokens: int, key: str = "k") -> None:
    """One admitted, finished request of ``tokens`` tokens for ``key``."""
    held = inst.ledger.reserve(key, "t", tokens, None)
    assert isinstance(held, Reservation)
    assert inst.ledger.admit_rpm(key, "t", None) is None
    inst.ledger.settle(held, "m", tokens // 2, 0, tokens - tokens // 2)


def test_quotas_count_every_origin_and_in_flight_reservations(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """A's spent tokens and B's open reservation both count against the key's budget on C
    after one tick, so C refuses what would overspend; RPM counts every origin's
    admissions."""
    insts, net, clock = mesh
    a, b, c = insts
    spend(a, 600)
    held = b.ledger.reserve("k", "t", 300, 1000)
    assert isinstance(held, Reservation)
    tick(clock)
    assert c.ledger.spent_today(key="k") == 600
    assert isinstance(c.ledger.reserve("k", "t", 200, 1000), Refusal)
    assert isinstance(c.ledger.reserve("k", "t", 100, 1000), Reservation)
    assert c.ledger.admit_rpm("k", "t", 1) is not None  # A's admission fills a limit of 1


def test_partition_lowers_quality_but_never_stops_serving_and_heal_merges_usage_exactly(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """C is cut off: every instance keeps granting and counting on what it sees; after the
    silence A and B no longer count C's in-flight requests (occupancy falls back to their
    own and the engine's); on heal, C reconnects, and every instance's usage is the exact
    sum of what each counted."""
    insts, net, clock = mesh
    a, b, c = insts
    c_lease = got(c.sched.acquire("k", 1, req(1)))
    tick(clock)
    assert a.sched.peer_inflight(0) == 1
    net.cut.add("c:1")
    spent = {"a:1": 0, "b:1": 0, "c:1": 0}
    for i in range(10):
        for inst, n in ((a, 100 + i), (b, 200 + i), (c, 300 + i)):
            lease = got(inst.sched.acquire("k", 1, req(i)))  # serving never stops
            spend(inst, n)
            spent[inst.member] += n
            lease.release(Sample(True, False, 0.1, 0.2))
        tick(clock, 2)
    assert a.sched.peer_inflight(0) == 0  # C silent past PEER_SILENCE_SEC: not counted
    assert c.sched.peers == {}
    assert not c.node.peers["a:1"].connected
    assert a.ledger.spent_today(key="k") == spent["a:1"] + spent["b:1"]
    assert c.ledger.spent_today(key="k") == spent["c:1"]
    net.cut.clear()
    tick(clock, 2)
    total = sum(spent.values())
    for inst in insts:
        assert inst.ledger.spent_today(key="k") == total
        assert inst.ledger.export(minutes=False) == a.ledger.export(minutes=False)
    assert a.sched.peer_inflight(0) == 1  # C's lease counts again
    c_lease.release()


def test_a_slow_peer_delays_only_itself(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """C takes A's delta and never answers: A skips C's ticks (no delta piles up) while B
    keeps getting every delta (A has a prefix op for each tick); after the delta timeout A
    sends C a fresh one."""
    insts, net, clock = mesh
    a, b, c = insts
    net.hold.add("c:1")

    def tick(clock: Clock, n: int = 1) -> None:
        for i in range(n):
            a.node.push(PrefixOp(f"{URL}#m", (i + 1,), clock.seconds()))
            clock.advance(TICK)

    tick(clock)

    def to_b() -> int:
        return sum(1 for m, body in net.delivered
                   if m == "b:1" and decode(body).origin == a.ledger.origin)

    before = to_b()
    tick(clock, 5)
    assert to_b() == before + 5
    assert a.node.peers["c:1"].skipped >= 4
    outstanding = len(net.held)
    clock.advance(DELTA_TIMEOUT)
    tick(clock)
    assert len(net.held) > outstanding  # a fresh one after the timeout


def test_leaving_drops_gauges_at_once_and_keeps_the_last_cells(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """A's last delta marked Leaving: B and C drop A's in-flight at once and hold the usage
    A counted up to its last moment."""
    insts, net, clock = mesh
    a, b, c = insts
    got(a.sched.acquire("k", 1, req(1)))
    tick(clock)
    assert b.sched.peer_inflight(0) == 1
    spend(a, 500)
    a.node.leave()
    for inst in (b, c):
        assert inst.sched.peer_inflight(0) == 0
        assert inst.ledger.spent_today(key="k") == 500
        assert inst.node.origins[a.ledger.origin].leaving


def test_proto_and_fingerprint_mismatches_are_flagged(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """A delta of another proto is answered 409 and the sender flags the peer; a delta with
    another fingerprint is merged but flagged on the receiver."""
    insts, net, clock = mesh
    a, b, c = insts
    code, body = b.node.receive_bytes(b'{"proto": 99, "origin": "x", "fingerprint": ""}')
    assert code == 409 and b"99" in body
    real = b.node.receive_bytes

    def mismatch(body: bytes) -> tuple[int, bytes]:
        return 409, b"peer proto 2, this instance speaks 1"

    b.node.receive_bytes = mismatch  # type: ignore[method-assign]
    clock.advance(KEEPALIVE + TICK)  # idle: a keep-alive goes within this
    assert a.node.peers["b:1"].proto_mismatch
    b.node.receive_bytes = real  # type: ignore[method-assign]
    tick(clock)
    assert not a.node.peers["b:1"].proto_mismatch
    a.node.fingerprint = lambda: "ffffffffffffffff"
    tick(clock)
    assert a.ledger.origin in b.node.fingerprint_mismatch
    assert b.node.status()["origins"][a.ledger.origin]["fingerprint_mismatch"]


@pytest.mark.parametrize("body", [
    b"", b"garbage", b"[]", b'{"proto": "1"}', b'{"proto": 1}',
    b'{"proto": 1, "origin": "x", "fingerprint": "", "cells": "no"}',
    b'{"proto": 1, "origin": "x", "fingerprint": "", "prefix": [{"target": 1}]}',
    b'{"proto": 1, "origin": "x", "fingerprint": "", "prefix": [{"target": "t", '
    b'"hashes": [-1], "last_used": 0}]}',
    b'{"proto": 1, "origin": "x", "fingerprint": "", "gauges": {"inflight": {"k": -1}}}',
    b'{"proto": 1, "origin": "x", "fingerprint": "", "cells": [{"kind": "day"}]}',
    b'{"proto": 1, "origin": "x", "fingerprint": "", "leaving": "yes"}',
    b"\xff\xfe", b"[" * 100_000, b'{"proto": NaN}',
])
def test_garbage_is_refused_without_a_crash_or_a_wrong_merge(
        mesh: tuple[list[Instance], MemoryNetwork, Clock], body: bytes) -> None:
    """A peer sending garbage gets a 400 (or 409 for a proto it names) naming the problem;
    nothing of it merges and the node keeps working."""
    insts, net, clock = mesh
    a, b, c = insts
    before = (b.ledger.export(), dict(b.sched.peers))
    code, reply = b.node.receive_bytes(body)
    assert code in (400, 409) and reply
    assert b.ledger.export() == before[0]
    assert b.sched.peer_inflight(0) == 0
    tick(clock)
    assert b.node.origins[a.ledger.origin].seq > 0


def test_unknown_targets_and_a_newer_delta_with_unknown_fields_merge_the_rest(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """A delta naming targets this instance has never seen, with fields a later release may
    add, merges what it can: its cells and its known targets; nothing else."""
    insts, net, clock = mesh
    a, b, c = insts
    body = (b'{"proto": 1, "origin": "z", "fingerprint": "0123456789abcdef", "seq": 1, '
            b'"future": {"x": 1}, "gauges": {"inflight": {"http://nowhere:1#m": 3, '
            b'"http://engine:1#m": 1}, "extra": 5}, "prefix": [{"target": "http://nowhere:1#m",'
            b' "hashes": [1, 2], "last_used": 1e12, "more": true}]}')
    code, _ = b.node.receive_bytes(body)
    assert code == 200
    assert b.sched.peer_inflight(0) == 1
    assert 2 not in b.sched.index


def test_a_clock_jump_loses_no_usage(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """The clock jumps a day ahead with A's usage not yet sent: the delta after the jump
    still carries it (a delta carries today's and yesterday's cells), and gauges carry on."""
    insts, net, clock = mesh
    a, b, c = insts
    net.cut.add("a:1")
    spend(a, 700)
    got(a.sched.acquire("k", 1, req(1)))
    clock.advance(DAY)
    assert b.sched.peer_inflight(0) == 0  # silent for a "day"
    net.cut.clear()
    tick(clock)
    rows = b.ledger.rows(a.ledger.today().fromordinal(a.ledger.today().toordinal() - 1),
                         a.ledger.today())
    assert sum(int(r["prompt_tokens"]) + int(r["completion_tokens"]) for r in rows) == 700
    assert b.sched.peer_inflight(0) == 1


def state_of(inst: Instance) -> tuple[object, ...]:
    """What deltas replicate that must not depend on their order: usage cells, peers'
    gauges and reservations (prefix ops are hints applied in arrival order)."""
    s = inst.sched
    return (inst.ledger.export(),
            {o: (g.inflight, g.waiting) for o, g in sorted(s.peers.items())},
            {o: (r.day, r.keys, r.tenants) for o, r in sorted(inst.ledger.peers.items())})


def recorded_deltas() -> list[bytes]:
    """The delta bodies that reached C during a run with traffic on A and B."""
    clock = Clock()
    clock.advance(DAY * 20_000 + 59)
    net = MemoryNetwork()
    engines = {URL: llamacpp(slots=4)}
    insts = [instance(m, MEMBERS, net, clock, engines) for m in MEMBERS]
    for inst in insts:
        inst.node.startService()
    clock.advance(0.6)
    rng = random.Random(7)
    leases: list[Lease] = []
    for step in range(12):
        for inst in insts[:2]:
            if rng.random() < 0.6:
                spend(inst, rng.randrange(1, 500), key=rng.choice("kl"))
            if rng.random() < 0.5:
                d = inst.sched.acquire("k", 1, req(step))
                if d.called:
                    leases.append(got(d))
            if leases and rng.random() < 0.4:
                leases.pop(rng.randrange(len(leases))).release()
        tick(clock)
    for inst in insts:
        stop(inst)
    return [body for member, body in net.delivered if member == "c:1"]


RECORDED = recorded_deltas()


def receiver() -> Instance:
    clock = Clock()
    clock.advance(DAY * 20_000 + 59 + 0.6 + 12 * TICK)
    net = MemoryNetwork()
    inst = instance("c:1", [], net, clock, {URL: llamacpp(slots=4)})
    clock.advance(0.01)
    return inst


@settings(max_examples=40, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(0, 20))
def test_deltas_in_any_order_and_repetition_give_the_same_state(
        rnd: random.Random, extra: int) -> None:
    """Applying the recorded deltas shuffled, with any of them repeated, leaves the receiver
    in the same replicated state as applying them once in order."""
    assert len(RECORDED) > 10
    ordered = receiver()
    for body in RECORDED:
        assert ordered.node.receive_bytes(body)[0] == 200
    shuffled = receiver()
    bodies = RECORDED + [rnd.choice(RECORDED) for _ in range(extra)]
    rnd.shuffle(bodies)
    for body in bodies:
        shuffled.node.receive_bytes(body)
    assert state_of(shuffled) == state_of(ordered)
    stop(ordered)
    stop(shuffled)


def test_recorded_deltas_decode() -> None:
    """The recorded run's deltas decode; C's own first delta to itself (before its reply
    told it so) is among them, and merges nothing."""
    origins = {decode(b).origin for b in RECORDED}
    assert origins == {"o-a:1", "o-b:1", "o-c:1"}


def test_node_never_sends_to_itself_nor_queues_ops_for_itself(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """push appends to the other peers' lists only, and a full list drops new ops."""
    insts, net, clock = mesh
    a = insts[0]
    node: PeerNode = a.node
    node.max_pending = 2
    for i in range(5):
        node.push(PrefixOp(f"{URL}#m", (i,), 1.0))
    assert node.peers["a:1"].pending == []
    assert [len(node.peers[m].pending) for m in ("b:1", "c:1")] == [2, 2]
    assert node.peers["b:1"].dropped_ops == 3


def test_metrics_and_status_show_each_peer(
        mesh: tuple[list[Instance], MemoryNetwork, Clock]) -> None:
    """/metrics has each other member's last-heard time and mismatch flags (none for the
    member that is this instance); a partition stops the heard time; /status lists them."""
    from twisted.web.template import flattenString

    from pharos.obs.metrics import Metrics
    from pharos.obs.status import StatusPage

    insts, net, clock = mesh
    a = insts[0]
    families = {m.name: m for m in Metrics._peers(a.node)}
    heard = {s.labels["peer"]: s.value for s in
             families["pharos_peer_last_heard_timestamp_seconds"].samples}
    assert set(heard) == {"b:1", "c:1"}
    net.cut.add("c:1")
    tick(clock, 5)
    families = {m.name: m for m in Metrics._peers(a.node)}
    later = {s.labels["peer"]: s.value for s in
             families["pharos_peer_last_heard_timestamp_seconds"].samples}
    assert later["c:1"] == heard["c:1"] and later["b:1"] > heard["b:1"]
    assert all(s.value == 0 for s in families["pharos_peer_proto_mismatch"].samples)
    out: list[bytes] = []
    flattenString(None, StatusPage.peer_section(a.node, clock.seconds())[-1]).addCallback(
        out.append)
    assert b"c:1" in out[0] and b"this instance" in out[0]


def test_reconnect_pulls_a_snapshot_that_heals_what_deltas_do_not_carry() -> None:
    """C is cut off while A records prompts (their ops to C are lost) and holds the cells of
    an instance that is gone (deltas carry only their sender's cells). When C is heard
    again after more than RECONNECT_AFTER, A's delta succeeds, A pulls C's snapshot and C
    pulls A's: C ends with A's prefix entries and the departed instance's usage."""
    from twisted.internet.defer import succeed

    from pharos.peer.snapshot import Replicas, build_now, restore
    from pharos.peer.snapshot import decode as decode_snapshot

    clock = Clock()
    clock.advance(DAY * 20_000 + 3600)
    net = MemoryNetwork()
    engines = {URL: llamacpp(slots=4)}

    def replicas(inst: Instance) -> Replicas:
        return Replicas(inst.state, inst.sched.index, inst.ledger)

    def merge(inst: Instance, data: bytes) -> object:
        return restore(replicas(inst), decode_snapshot(data), clock.seconds())

    insts = [instance(m, MEMBERS, net, clock, engines, restore=merge) for m in MEMBERS]
    for inst in insts:
        net.snapshots[inst.member] = (
            lambda inst=inst: succeed(build_now(replicas(inst), clock)))  # type: ignore[misc]
        inst.node.startService()
    clock.advance(0.6)
    tick(clock)
    a, b, c = insts
    net.cut.add("c:1")
    tick(clock, 15)  # 3 s: past RECONNECT_AFTER
    assert not a.node.peers["c:1"].connected
    chain = Chain((7001, 7002), (4000, 8000))
    lease = got(a.sched.acquire("k", 1, req(1, chain)))
    lease.release(Sample(True, False, 0.1, 0.2, prompt_tokens=2000, cached_tokens=0))
    gone = {"origin": "o-gone", "kind": "day", "bucket": a.ledger._today(), "key": "k",
            "tenant": "t", "model": "m", "requests": 3, "prompt_tokens": 30, "cached_tokens": 0,
            "completion_tokens": 12, "unmetered": 0}
    a.ledger.merge([gone])
    tick(clock, 2)
    assert 7002 not in c.sched.index and c.ledger.spent_today(key="k") == 0
    pulls = a.node.peers["c:1"].pulls
    net.cut.clear()
    tick(clock, 2)
    assert a.node.peers["c:1"].pulls == pulls + 1
    assert c.node.peers["a:1"].pulls >= 1
    assert c.ledger.spent_today(key="k") == 42
    assert [s[3] for s in c.sched.index.slots(7002)] == ["restored"]
    for inst in insts:
        stop(inst)
