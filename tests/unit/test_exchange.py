"""Layer 1: the exchange owns its lease, whatever the client and the engine do and when.

Real ``Request`` objects on real ``HTTPChannel``s over in-memory transports, a real
scheduler and state on a ``Clock``, and scripted engine calls: hypothesis draws interleavings
of client departures (with and without Klein's cancel), engine headers (200, 500, 503), body
bytes, clean ends, resets, refusals, backends going down and time passing (first-byte and
idle timeouts), and every run must end with no lease held, no waiter queued, every request
finished, and every engine call of a departed client stopped.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.error import ConnectionLost
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseNeverReceived

from tests.support.exchange import (
    EVENTS,
    Rig,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, min_size=1, max_size=40))
def test_every_lease_is_released_exactly_once(events: list[tuple[Any, ...]]) -> None:
    """Whatever the interleaving, each granted lease is released once, in-flight counts
    return to zero, nothing waits, every request's run ends, and the engine call of every
    client that left is stopped (or had ended) by the time it left."""
    rig = Rig()
    try:
        for e in events:
            kind = e[0]
            if kind == "request":
                rig.request()
            elif kind == "leave":
                rig.leave(e[1], e[2])
            elif kind == "headers":
                rig.headers(e[1], e[2])
            elif kind == "data":
                rig.data(e[1])
            elif kind == "end":
                rig.end(e[1], e[2])
            elif kind == "down":
                rig.down(e[1])
            else:
                rig.clock.advance(e[1])
            rig.reactor_turn()
            for request, _, _, ex in rig.requests:
                if getattr(request, "_disconnected", False):
                    # A departed client's exchange holds nothing and its engine call is over.
                    assert ex.lease is None
            for c in rig.calls:
                if c.exchange is not None and c.exchange.gone:
                    assert not c.open, "an engine call outlived its client"
        rig.finish()
        assert all(t.inflight == 0 for t in rig.state.targets)
        assert not rig.sched.leases
        assert rig.sched.waiting == 0
        assert all(d.called for _, _, d, _ in rig.requests)
        assert len(rig.released) == len(set(map(id, rig.released)))
        assert all(lease.released for lease in rig.released)
    finally:
        rig.close()


def test_a_granted_lease_is_counted_released() -> None:
    """The rig's bookkeeping sees a plain request through: one lease, released once."""
    rig = Rig()
    try:
        rig.request()
        assert len(rig.calls) == 1
        rig.headers(0, 200)
        rig.data(0)
        rig.end(0, clean=True)
        assert len(rig.released) == 1
        assert rig.requests[0][2].called
        assert all(t.inflight == 0 for t in rig.state.targets)
    finally:
        rig.close()


def test_a_dead_pooled_connection_is_retried_once_on_a_new_connection() -> None:
    """A send that dies before any answer (the engine had closed the pooled connection) goes
    once more to the same target on a new connection (its pooled siblings are as old); a
    second such death on that new connection is an upstream failure, tried elsewhere."""
    rig = Rig()
    try:
        rig.request()
        first = rig.calls[0]
        first.lost = True
        first.d.errback(ResponseNeverReceived([Failure(ConnectionLost())]))
        assert len(rig.calls) == 2 and rig.fresh == [False, True]
        second = rig.calls[1]
        assert second.target is first.target
        second.lost = True
        second.d.errback(ResponseNeverReceived([Failure(ConnectionLost())]))
        assert len(rig.calls) == 3
        assert rig.calls[2].target is not first.target
        rig.headers(0, 200)
        rig.data(0)
        rig.end(0, clean=True)
        assert rig.requests[0][2].called
        assert all(t.inflight == 0 for t in rig.state.targets)
    finally:
        rig.close()
