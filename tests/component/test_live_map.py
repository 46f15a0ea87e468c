"""Layer 3: the live map's event stream (issue 12 item 3) over loopback: lifecycle events
with target, reason, status and tokens, JSON on single data lines whatever the names hold, no
prompt text (item 8), keepalives, a stuck reader dropped at its byte bound and a reader that
leaves removed."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlparse

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure

from tests.support.fleet import eventually, sleep
from tests.support.pages import ADMIN, EVIL, MARKER, PagesRig, start_pages


class RawReader(Protocol):
    """An HTTP/1.0 client of ``/live/events`` (no chunking: the bytes are the stream)."""

    def __init__(self) -> None:
        self.data = b""
        self.closed = False

    def connectionMade(self) -> None:
        self.transport.write(b"GET /live/events HTTP/1.0\r\nHost: x\r\n"  # type: ignore[union-attr]
                             b"Authorization: Bearer " + ADMIN.encode() + b"\r\n\r\n")

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.closed = True

    def events(self) -> list[dict[str, Any]]:
        body = self.data.split(b"\r\n\r\n", 1)[-1]
        out = []
        for line in body.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(json.loads(line[6:]))
            else:
                assert line == b"" or line.startswith((b":", b"retry: ")), line
        return out


async def reader(rig: PagesRig) -> RawReader:
    u = urlparse(rig.url)
    assert u.port is not None
    proto = RawReader()
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", u.port), proto)
    return proto


@pytest_twisted.ensureDeferred
async def test_events_carry_the_lifecycle_without_prompts() -> None:
    """A reader gets the fleet first (every backend), then per request admitted, routed
    (target and reason), first_byte and done (status and tokens); names with markup, quotes
    and newlines stay inside one JSON data line; the prompts' marker is never sent."""
    rig = await start_pages()
    try:
        r = await reader(rig)
        await eventually(lambda: b"fleet" in r.data)
        assert r.data.startswith(b"HTTP/1.0 200") or r.data.startswith(b"HTTP/1.1 200")
        assert b"text/event-stream" in r.data
        for stream in (False, True):
            assert (await rig.chat(stream=stream))[0] == 200
        assert (await rig.chat(model=EVIL))[0] == 404
        await eventually(lambda: sum(e["type"] == "done" for e in r.events()) == 3)
        events = r.events()
        fleet = events[0]
        assert fleet["type"] == "fleet"
        assert {b["url"] for b in fleet["backends"]} == set(rig.fleet.pharos.state.backends)
        urls = set(rig.fleet.pharos.state.backends)
        routed = [e for e in events if e["type"] == "routed"]
        assert len(routed) == 2 and all(e["target"] in urls and e["reason"] for e in routed)
        assert sum(e["type"] == "first_byte" for e in events) == 2
        # Admitted: the two served requests (the unknown model is refused at the scheduler,
        # after admission, so it is admitted too), each before its routed event.
        admitted = [i for i, e in enumerate(events) if e["type"] == "admitted"]
        assert len(admitted) == 3
        assert admitted[0] < next(i for i, e in enumerate(events) if e["type"] == "routed")
        done = [e for e in events if e["type"] == "done"]
        assert [e["status"] for e in done] == [200, 200, 404]
        assert all(e["completion_tokens"] and e["prompt_tokens"] for e in done[:2])
        assert done[2]["model"] == EVIL and done[2]["key"] == EVIL  # intact, inside JSON
        assert MARKER.encode() not in r.data
        assert b"<script>" not in r.data  # escaped as \\u003c inside the JSON
    finally:
        await rig.close()


@pytest_twisted.ensureDeferred
async def test_keepalive_comments_on_an_idle_stream() -> None:
    """With nothing happening, the stream carries keepalive comments."""
    rig = await start_pages()
    try:
        rig.pages.live.keepalive = 0.1
        r = await reader(rig)
        await eventually(lambda: r.data.count(b": keepalive") >= 2)
    finally:
        await rig.close()


@pytest_twisted.ensureDeferred
async def test_a_stuck_reader_is_dropped_at_its_bound() -> None:
    """A reader that stops reading is cut rather than queue past its bound: its queued bytes
    never exceed the bound, then it is removed and its connection closed; a reader that keeps
    up is unaffected. (Bursts stay under the bound, ~47 KB, so the reader that keeps up is
    never a burst behind, however loaded the machine.)"""
    rig = await start_pages()
    live = rig.pages.live
    live.max_buffer = 64 * 1024
    try:
        stuck = await reader(rig)
        ok = await reader(rig)
        await eventually(lambda: len(live.readers) == 2 and b"fleet" in stuck.data)
        stuck.transport.pauseProducing()  # type: ignore[union-attr]
        event = {"type": "done", "key": "k" * 200, "model": "m" * 200}
        most = 0
        for _ in range(2000):
            for _ in range(100):
                live.emit(event)
                most = max([most, *(x.pending_bytes for x in live.readers)])
            await sleep(0.005)
            most = max([most, *(x.pending_bytes for x in live.readers)])
            if live.dropped:
                break
        assert live.dropped == 1
        assert most <= live.max_buffer
        stuck.transport.resumeProducing()  # type: ignore[union-attr]
        await eventually(lambda: stuck.closed)  # it reads what was sent, then the reset
        assert len(live.readers) == 1 and not ok.closed
        n = len(ok.data)
        live.emit({"type": "done", "key": "after"})
        await eventually(lambda: len(ok.data) > n)
    finally:
        await rig.close()


@pytest_twisted.ensureDeferred
async def test_a_reader_that_leaves_is_removed() -> None:
    """Closing the connection removes the reader; stopping Pharos closes the rest."""
    rig = await start_pages()
    live = rig.pages.live
    try:
        r1 = await reader(rig)
        r2 = await reader(rig)
        await eventually(lambda: len(live.readers) == 2)
        r1.transport.loseConnection()  # type: ignore[union-attr]
        await eventually(lambda: len(live.readers) == 1)
        live.emit({"type": "done"})
    finally:
        await rig.close()
    assert not live.readers
    await eventually(lambda: r2.closed)


@pytest_twisted.ensureDeferred
async def test_a_burst_of_events_is_one_write() -> None:
    """Events emitted together reach a reader in one write (batched, not one write per
    event), in order."""
    rig = await start_pages()
    live = rig.pages.live
    try:
        r = await reader(rig)
        await eventually(lambda: len(live.readers) == 1 and b"fleet" in r.data)
        [conn] = live.readers
        writes: list[bytes] = []
        write = conn.request.write

        def counted(data: bytes) -> None:
            writes.append(data)
            write(data)

        conn.request.write = counted  # type: ignore[method-assign]
        for i in range(10):
            live.emit({"type": "done", "key": f"k{i}"})
        await eventually(lambda: sum(e.get("key", "").startswith("k") for e in r.events()) == 10)
        assert len(writes) == 1
        assert [e["key"] for e in r.events() if e["type"] == "done"] == [f"k{i}" for i in range(10)]
    finally:
        await rig.close()
