"""``stream_body.BodyPipe`` on a clock (issue 17 item 7): a request body passed to the engine
as it arrives, the client's socket held while the engine's is full or not open yet, the end,
a cut and a stall each reaching the engine request; and which requests are piped."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.interfaces import IConsumer, IPushProducer
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from zope.interface import implementer

from pharos.proxy.stream_body import BodyCut, BodyPipe, streams


@implementer(IPushProducer)
class Client:
    """The client connection's transport: paused or reading, abortable."""

    def __init__(self) -> None:
        self.paused = False
        self.pauses = 0
        self.aborted = False
        self.pipe: BodyPipe | None = None

    def pauseProducing(self) -> None:
        self.paused = True
        self.pauses += 1

    def resumeProducing(self) -> None:
        self.paused = False

    def stopProducing(self) -> None:
        self.paused = True

    def abortConnection(self) -> None:
        self.aborted = True
        if self.pipe is not None:
            self.pipe.cut(Failure(ConnectionError("aborted")))


@implementer(IConsumer)
class Engine:
    """The engine request's consumer: takes ``room`` bytes, then pauses the pipe."""

    def __init__(self, pipe: BodyPipe, room: int = 1 << 30) -> None:
        self.pipe = pipe
        self.room = room
        self.got = bytearray()

    def write(self, data: bytes) -> None:
        self.got += data
        if len(self.got) >= self.room:
            self.pipe.pauseProducing()

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        pass

    def unregisterProducer(self) -> None:
        pass


def pipe(length: int | None = 10, stall: float = 60.0) -> tuple[BodyPipe, Client, Clock]:
    clock, client = Clock(), Client()
    p = BodyPipe(client, length, clock.callLater, stall)
    client.pipe = p
    return p, client, clock


def test_bytes_before_the_engine_connection_hold_the_client() -> None:
    """A chunk that comes before the engine request is open is kept and the client's socket
    is no longer read; once the engine takes it, the client is read again."""
    p, client, _ = pipe()
    p.write(b"abc")
    assert client.paused
    engine = Engine(p)
    d = p.startProducing(engine)
    assert bytes(engine.got) == b"abc" and not d.called
    assert not client.paused
    p.write(b"defghij")
    p.finish()
    assert bytes(engine.got) == b"abcdefghij" and d.called


def test_a_full_engine_socket_holds_the_client_until_it_drains() -> None:
    """The engine pausing the pipe stops the client's reads; what still arrives is kept (at
    most a read or two) and passed on when the engine drains, in order."""
    p, client, _ = pipe(length=None)
    engine = Engine(p, room=4)
    d = p.startProducing(engine)
    p.write(b"1234")  # fills the engine
    assert client.paused and client.pauses == 1
    p.write(b"56")  # a read already under way
    assert bytes(engine.got) == b"1234"
    engine.room = 1 << 30
    p.resumeProducing()
    assert bytes(engine.got) == b"123456" and not client.paused
    p.finish()
    assert d.called and p.length is not None


def test_the_end_fires_only_after_what_is_kept_was_passed() -> None:
    """A body that ends while the engine is paused completes once the engine took the rest."""
    p, _, _ = pipe()
    engine = Engine(p, room=2)
    d = p.startProducing(engine)
    p.write(b"ab")
    p.write(b"cd")
    p.finish()
    assert not d.called
    engine.room = 1 << 30
    p.resumeProducing()
    assert d.called and bytes(engine.got) == b"abcd"


def test_a_client_cut_fails_the_engine_request() -> None:
    """The client's connection lost mid-body errbacks the engine request's body (Agent then
    aborts the engine connection mid-body)."""
    p, _, _ = pipe(length=100)
    d = p.startProducing(Engine(p))
    p.write(b"x" * 40)
    p.cut(Failure(ConnectionError("gone")))
    failures: list[Failure] = []
    d.addErrback(failures.append)
    assert failures and failures[0].check(BodyCut)
    assert "after 40 bytes" in failures[0].getErrorMessage()


def test_a_cut_before_the_engine_connection_fails_at_once() -> None:
    """A client gone before the engine request opened: its body fails when it starts."""
    p, _, _ = pipe()
    p.write(b"abc")
    p.cut(Failure(ConnectionError("gone")))
    failures: list[Failure] = []
    p.startProducing(Engine(p)).addErrback(failures.append)
    assert failures and failures[0].check(BodyCut)


def test_a_stalled_client_is_cut_but_not_while_held() -> None:
    """No body byte for the stall time aborts the client's connection (and so the engine
    request); time spent held back by the engine does not count."""
    p, client, clock = pipe(length=100, stall=5.0)
    engine = Engine(p, room=10)
    d = p.startProducing(engine)
    failures: list[Failure] = []
    d.addErrback(failures.append)
    p.write(b"x" * 10)  # the engine is full: the client is held
    clock.advance(60)
    assert not client.aborted
    engine.room = 1 << 30
    p.resumeProducing()
    clock.advance(4.9)
    p.write(b"y")
    clock.advance(4.9)
    assert not client.aborted
    clock.advance(0.2)
    assert client.aborted and failures and failures[0].check(BodyCut)


def test_a_stopped_engine_request_never_fires() -> None:
    """The engine request gone (stopProducing): nothing more is passed, the Deferred never
    fires, the client stays held."""
    p, client, _ = pipe()
    engine = Engine(p)
    d = p.startProducing(engine)
    p.stopProducing()
    p.write(b"more")
    p.finish()
    assert not d.called and engine.got == bytearray() and client.paused


@pytest.mark.parametrize(("command", "path", "piped"), [
    (b"POST", b"/api/blobs/sha256:abc", True),
    (b"POST", b"/api/pull", True),
    (b"POST", b"/api/create?x=1", True),
    (b"DELETE", b"/api/delete", True),
    (b"HEAD", b"/api/blobs/sha256:abc", False),
    (b"POST", b"/api/chat", False),
    (b"POST", b"/v1/chat/completions", False),
    (b"GET", b"/api/pull", False),
])
def test_only_management_bodies_are_piped(command: bytes, path: bytes, piped: bool) -> None:
    """Bodies of the management routes are piped; generation routes keep twisted.web's."""
    assert streams(command, path) is piped
