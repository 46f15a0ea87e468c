"""Layer 1: readiness and drain (spec §9) on a Clock: /healthz 503 at once, requests still
served during the grace, the listener closed after it, a held stream waited for, cut at the
timeout; and PharosService's stop order (drain, on_leaving, the last state-file write)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from pharos.config import Config
from pharos.config import DrainConfig as DrainConfig
from pharos.peer.statefile import in_place, read_snapshot
from pharos.proxy.drain import Drain, Health
from pharos.service import PharosService


class FakeTransport:
    def __init__(self) -> None:
        self.disconnected = False
        self.aborted = False

    def abortConnection(self) -> None:
        self.aborted = True


class FakeChannel:
    def __init__(self) -> None:
        self.transport = FakeTransport()
        self.requests: list[Any] = []
        self.persistent = True
        self.closed = False

    def loseConnection(self) -> None:
        self.closed = True


class FakeRequest:
    """A request whose end (finish or client gone) the test decides."""

    def __init__(self, channel: FakeChannel | None = None) -> None:
        self.channel = channel or FakeChannel()
        self.channel.requests.append(self)
        self._finished: list[Deferred[None]] = []

    def notifyFinish(self) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        self._finished.append(d)
        return d

    def end(self) -> None:
        self.channel.requests.remove(self)
        for d in self._finished:
            d.callback(None)


def run(drain: Drain, events: list[str]) -> Deferred[None]:
    """Start the drain; the listener's closing is recorded in ``events``."""
    def stop_listening() -> Deferred[None]:
        events.append("listener closed")
        return succeed(None)

    return Deferred.fromCoroutine(drain.run(stop_listening))


def test_healthz_503_at_once_served_in_grace_then_closed_and_waits_for_a_held_stream() -> None:
    """/healthz is draining at once; a request arriving in the grace is tracked like any;
    the listener closes at the end of the grace (idle keep-alive connections close, busy ones
    after their reply); the drain ends when the last held stream ends, not before."""
    clock = Clock()
    health = Health()
    drain = Drain(clock, health, grace=5.0, timeout=600.0)
    held = FakeRequest()
    drain.track(held)  # type: ignore[arg-type]
    idle = FakeRequest()
    drain.track(idle)  # type: ignore[arg-type]
    idle.end()  # its connection stays open, idle (keep-alive)
    events: list[str] = []
    d = run(drain, events)
    assert health.status() == "draining"
    clock.advance(4.0)
    late = FakeRequest()
    drain.track(late)  # type: ignore[arg-type]
    assert events == [] and not late.channel.closed
    late.end()
    clock.advance(1.0)
    assert events == ["listener closed"]
    assert idle.channel.closed and late.channel.closed
    assert not held.channel.closed and held.channel.persistent is False
    clock.advance(300.0)
    assert not d.called
    held.end()
    assert d.called and drain.cut == 0 and not held.channel.transport.aborted


def test_streams_still_running_at_the_timeout_are_cut() -> None:
    """After grace + timeout the connections of requests still in flight are aborted (which
    cancels their engine requests); the drain ends once they report closed."""
    clock = Clock()
    drain = Drain(clock, Health(), grace=5.0, timeout=60.0)
    held = FakeRequest()
    drain.track(held)  # type: ignore[arg-type]
    d = run(drain, [])
    clock.advance(5.0)
    clock.advance(59.0)
    assert not held.channel.transport.aborted
    clock.advance(1.0)
    assert held.channel.transport.aborted and drain.cut == 1
    assert not d.called
    held.end()  # connectionLost
    assert d.called


def test_nothing_in_flight_drains_right_after_the_grace() -> None:
    """With nothing in flight the drain is the grace alone."""
    clock = Clock()
    drain = Drain(clock, Health(), grace=5.0, timeout=600.0)
    d = run(drain, [])
    clock.advance(4.9)
    assert not d.called
    clock.advance(0.1)
    assert d.called


class FakeListener(Service):
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def startService(self) -> None:
        super().startService()
        self.events.append("listener open")

    def stopService(self) -> None:
        super().stopService()
        self.events.append("listener closed")


def test_service_start_restores_before_opening_and_stops_in_order(tmp_path: Path) -> None:
    """PharosService: /healthz starting until the restore sources ran (in order), then the
    listener opens; on stop: draining at once, the listener closed after the grace, a held
    stream waited for, then the on_leaving hooks, then the last state-file write."""
    clock = Clock()
    path = tmp_path / "pharos.state"
    config = dataclasses.replace(Config(), state_file=str(path),
                                 drain=DrainConfig(grace=5.0, timeout=600.0))
    events: list[str] = []
    top = PharosService.from_config(clock, config,
                                    listen=lambda description, site: FakeListener(events))
    assert top.state_file is not None
    top.state_file.in_thread = in_place
    gate: Deferred[None] = Deferred()

    def peers_pull() -> Deferred[None]:
        events.append("peers pulled")
        return gate

    top.restore_sources.append(peers_pull)

    def leaving() -> Deferred[None]:
        events.append(f"leaving, state file written: {path.exists()}")
        return succeed(None)

    top.on_leaving.append(leaving)
    top.startService()
    assert events == ["peers pulled"]  # the state file (none yet) first, then peers
    assert top.health.status() == "starting"
    gate.callback(None)
    assert events == ["peers pulled", "listener open"]
    assert top.health.status() is None
    held = FakeRequest()
    top.drain.track(held)  # type: ignore[arg-type]
    stopped = top.stopService()
    assert top.health.status() == "draining"
    clock.advance(5.0)
    assert events[-1] == "listener closed"
    clock.advance(10.0)
    assert not stopped.called
    held.end()
    for _ in range(50):
        clock.advance(0.01)
    assert events[-1] == "leaving, state file written: False"
    assert stopped.called
    assert read_snapshot(str(path)) is not None  # written after the hooks
