"""Layer 2: peer wire samples recorded by the release that introduced each proto
(``tests/replay/peer/proto<N>/``) still decode and merge, so a rolling update between
releases keeps sharing state (spec §14 ``TestWireFormatDecodes``)."""

from __future__ import annotations

from pathlib import Path

from twisted.internet.task import Clock

from pharos.peer.wire import decode
from tests.component.peer_mesh import MemoryNetwork, instance, llamacpp, stop

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
    stop(b)
