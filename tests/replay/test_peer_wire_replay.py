"""Layer 2: peer wire samples recorded by the release that introduced each proto
(``tests/replay/peer/proto<N>/``) still decode and merge, so a rolling update between
releases keeps sharing state (spec §14 ``TestWireFormatDecodes``)."""

from __future__ import annotations

from pathlib import Path

from twisted.internet.task import Clock

from pharos.peer.wire import decode
from tests.support.peer_mesh import MemoryNetwork, instance, llamacpp, stop

SAMPLES = Path(__file__).parent / "peer"
#: When proto 1's delta sample was recorded (its cells' minute and day are current then).
RECORDED_AT = 1764637200.8


def test_proto1_delta_decodes_and_merges() -> None:
    """The proto-1 delta (recorded from an instance with one request in flight, one
    finished, one reservation open and one prefix record) merges into a current instance:
    its usage, gauges, reservation and prefix record all land."""
    delta = decode((SAMPLES / "proto1" / "delta.json").read_bytes())
    assert (delta.proto, delta.origin, delta.seq, delta.leaving) == (1, "o-a:1", 4, False)
    clock = Clock()
    clock.advance(RECORDED_AT - 0.8)
    net = MemoryNetwork()
    b = instance("b:1", [], net, clock, {"http://engine:1": llamacpp(4)})
    clock.advance(0.8)
    assert b.node.receive(delta) == []
    assert b.ledger.spent_today(key="alice") == 150
    assert b.ledger.peers_reserved(key="alice") == 300
    assert b.sched.peer_inflight(0) == 1
    assert [s[3] for s in b.sched.index.slots(33)] == ["peer"]
    assert delta.dispatched is None  # recorded before dispatches were told
    stop(b)


def test_proto1_delta_with_dispatches_decodes_and_merges() -> None:
    """The proto-1 delta with ``dispatch`` and ``retention`` parts (recorded from an
    instance that had learned the engine retains 6,000 root tokens and had just sent a
    request with a new 512-token root there, before any byte came back) merges into a
    current instance: the root is noted as sent to that engine, the prompt is predicted
    there as a peer slot, and the retention is taken. No prompt text: hashes only."""
    from pharos.config import Backend as BackendSpec
    from tests.support.peer_mesh import vllm

    raw = (SAMPLES / "proto1" / "delta-dispatch.json").read_bytes()
    delta = decode(raw)
    assert delta.dispatched is not None
    (op,) = delta.dispatched
    assert (op.dispatched, op.root_tokens, op.moved, len(op.hashes)) == (True, 512, True, 2)
    clock = Clock()
    clock.advance(RECORDED_AT - 0.8)
    url = "http://engine:1"
    b = instance("b:1", [], MemoryNetwork(), clock, {url: vllm()},
                 specs={url: BackendSpec(url=url, kind="vllm", capacity=8)})
    clock.advance(0.8)
    assert b.node.receive(delta) == []
    assert b.sched.roots.held(0) == {op.hashes[0]: 512}
    assert [s[3] for s in b.sched.index.slots(op.hashes[1])] == ["peer"]
    assert b.sched.peer_inflight(0) == 1
    assert b.sched.roots.retained == {0: 6000}
    stop(b)


def test_proto1_snapshot_decodes_and_restores() -> None:
    """The proto-1 snapshot (newline-delimited JSON parts in gzip: an instance with one
    finished request, a departed instance's cells and a learned target) decodes whole, and
    merged in steps from its bytes (as a peer pull and the state file do) restores into a
    current instance: both origins' usage, the prefix entries and the target's stats."""
    from pharos.peer.snapshot import Replicas, Restored, restore_bytes
    from pharos.peer.snapshot import decode as decode_snapshot

    data = (SAMPLES / "proto1" / "snapshot.ndjson.gz").read_bytes()
    snap = decode_snapshot(data)
    assert (snap.proto, snap.origin, snap.taken_at) == (1, "o-a:1", 1764637200.6)
    assert [e.key for e in snap.prefix] == [11, 33]
    clock = Clock()
    clock.advance(RECORDED_AT - 0.8)
    b = instance("b:1", [], MemoryNetwork(), clock, {"http://engine:1": llamacpp(4)})
    clock.advance(0.8)
    out: list[object] = []
    restore_bytes(Replicas(b.state, b.sched.index, b.ledger), data, clock,
                  steps_per_turn=1).addBoth(out.append)
    for _ in range(100):
        if out:
            break
        clock.advance(0.001)
    (done,) = out
    assert isinstance(done, Restored)
    assert (done.cells_changed, done.prefix_merged, done.stats_taken) == (2, 2, 1)
    assert b.ledger.spent_today(key="alice") == 150
    assert [r["unmetered"] for r in b.ledger.export() if r["origin"] == "o-gone"] == [1]
    assert [s[3] for s in b.sched.index.slots(33)] == ["restored"]
    assert b.state.targets[0].stats.prefill_sec_per_token.value is not None
    stop(b)
