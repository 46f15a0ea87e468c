"""The exchange rig: a request's attempts over scripted engine calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.internet.error import ConnectionLost, ConnectionRefusedError
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseNeverReceived
from twisted.web.client import ResponseDone
from twisted.web.http import HTTPChannel
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH
from twisted.web.server import Request

from pharos.config import Backend as BackendSpec
from pharos.proxy.auth import Identity
from pharos.proxy.exchange import Exchange, Inflight, Limits
from pharos.proxy.parse import parse
from pharos.sched import Lease
from pharos.state.registry import Target
from tests.support.sched import fleet, llamacpp

BODY = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
LIMITS = Limits(first_byte=30.0, stream_idle=20.0)


class BodyTransport:
    """What ``deliverBody`` hands the body protocol: pause, resume, stop."""

    def __init__(self, call: EngineCall) -> None:
        self.call = call
        self.paused = False

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False

    def stopProducing(self) -> None:
        self.call.stopped = True
        self.call.lose(Failure(ConnectionLost()))

    def loseConnection(self) -> None:
        self.stopProducing()


@dataclass
class FakeResponse:
    """An engine's response: status, headers, and the body delivered on request."""

    call: EngineCall
    code: int
    headers: Headers = field(default_factory=lambda: Headers(
        {b"content-type": [b"text/event-stream"]}))
    length: Any = UNKNOWN_LENGTH
    phrase: bytes = b"OK"

    def deliverBody(self, protocol: Any) -> None:
        self.call.body = protocol
        protocol.makeConnection(BodyTransport(self.call))
        for chunk in self.call.early:
            protocol.dataReceived(chunk)
        if self.call.ended is not None:
            self.call.lose(self.call.ended)


@dataclass(eq=False)
class EngineCall:
    """One request sent to an engine, driven by the test."""

    target: Target
    d: Deferred[Any]
    exchange: Exchange | None = None
    response: FakeResponse | None = None
    body: Any = None
    early: list[bytes] = field(default_factory=list)
    ended: Failure | None = None
    stopped: bool = False  # the engine saw the request aborted
    lost: bool = False

    @property
    def open(self) -> bool:
        return not self.lost and not self.stopped and not (self.d.called and self.response is None)

    def lose(self, reason: Failure) -> None:
        if self.body is None:
            self.ended = self.ended or reason
            return
        if not self.lost:
            self.lost = True
            self.body.connectionLost(reason)


class Rig:
    """Scheduler, state and a scripted fleet of two llama.cpp backends (two slots each)."""

    def __init__(self) -> None:
        backends = {
            f"http://e{i}": (llamacpp(slots=2), BackendSpec(url=f"http://e{i}", kind="llamacpp"))
            for i in range(2)
        }
        self.sched, self.state, self.clock = fleet(backends)
        self.inflight = Inflight()
        self.state.on_down = self.inflight.backend_down
        self.calls: list[EngineCall] = []
        self.fresh: list[bool] = []  # each send's ``fresh`` flag, in order
        self.requests: list[tuple[Request, HTTPChannel, Deferred[None], Exchange]] = []
        self.granted = 0
        real = Lease.release
        rig = self

        def counted(lease: Lease, sample: Any = None) -> None:
            if not lease.released:
                rig.released.append(lease)
            real(lease, sample)

        self.released: list[Lease] = []
        self._patch = (Lease, "release", real)
        setattr(Lease, "release", counted)  # noqa: B010 - undone in close()

    def close(self) -> None:
        cls, name, real = self._patch
        setattr(cls, name, real)

    def send(self, target: Target, ex: Exchange) -> Deferred[Any]:
        call: EngineCall

        def cancel(d: Deferred[Any]) -> None:
            call.stopped = True
            d.errback(Failure(ResponseNeverReceived([Failure(CancelledError())])))

        d: Deferred[Any] = Deferred(cancel)
        call = EngineCall(target, d, ex)
        self.calls.append(call)
        return d

    def request(self) -> None:
        channel = HTTPChannel()
        channel.makeConnection(StringTransport())
        request = Request(channel, False, parsePOSTFormSubmission=False)
        channel.requests.append(request)
        request.method = b"POST"
        request.uri = request.path = b"/v1/chat/completions"
        request.clientproto = b"HTTP/1.1"
        parsed = parse(BODY, "/v1/chat/completions")
        holder: list[Exchange] = []

        rig = self

        class Engine:
            def send(self, target: Target, path: str, body: bytes,
                     fresh: bool = False) -> Deferred[Any]:
                rig.fresh.append(fresh)
                return rig.send(target, holder[0])

            def unload(self, target: Target, models: tuple[str, ...]) -> Deferred[int]:
                raise AssertionError("no cold load here")

            def start_reply(self, req: Request, resp: Any, target: Target, reason: str,
                            lease: Any = None) -> None:
                req.setResponseCode(resp.code)

        ex = Exchange(request, parsed, "/v1/chat/completions", None, sched=self.sched,
                      state=self.state, engine=Engine(), clock=self.clock, limits=LIMITS,
                      inflight=self.inflight, session=None, who=Identity("k"))
        holder.append(ex)
        d = ensureDeferred(ex.run())
        d.addErrback(lambda _: None)
        self.requests.append((request, channel, d, ex))

    def reactor_turn(self) -> None:
        """What the reactor would do next: a connection Pharos aborted is lost."""
        for request, channel, _, _ in self.requests:
            transport = channel.transport
            if isinstance(transport, StringTransport) and transport.disconnecting and not getattr(
                    request, "_disconnected", False):
                channel.connectionLost(Failure(ConnectionLost()))

    # --- events ---------------------------------------------------------------------------

    def leave(self, i: int, klein_cancels: bool) -> None:
        if not self.requests:
            return
        request, channel, d, _ = self.requests[i % len(self.requests)]
        if getattr(request, "_disconnected", False):
            return
        channel.connectionLost(Failure(ConnectionLost()))
        if klein_cancels:
            d.cancel()

    def _call(self, i: int) -> EngineCall | None:
        live = [c for c in self.calls if c.open]
        return live[i % len(live)] if live else None

    def headers(self, i: int, code: int) -> None:
        c = self._call(i)
        if c is not None and not c.d.called:
            c.response = FakeResponse(c, code)
            c.d.callback(c.response)

    def data(self, i: int) -> None:
        c = self._call(i)
        if c is None or c.response is None:
            return
        chunk = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
        if c.body is None:
            c.early.append(chunk)
        elif not c.lost:
            c.body.dataReceived(chunk)

    def end(self, i: int, clean: bool) -> None:
        c = self._call(i)
        if c is None:
            return
        if c.response is None:
            c.lost = True
            c.d.errback(ConnectionRefusedError() if clean else ConnectionLost())
            return
        c.lose(Failure(ResponseDone()) if clean else Failure(ConnectionLost()))

    def down(self, i: int) -> None:
        backend = list(self.state.backends.values())[i % len(self.state.backends)]
        self.state.down(backend, "test")

    def finish(self) -> None:
        """Let everything end: engines answer and end, time runs past every timeout."""
        for _ in range(10):
            for c in list(self.calls):
                if c.open and c.response is None and not c.d.called:
                    c.response = FakeResponse(c, 200)
                    c.d.callback(c.response)
                if c.open and c.response is not None:
                    c.lose(Failure(ResponseDone()))
            self.clock.advance(LIMITS.first_byte + 1)
            self.reactor_turn()


EVENTS = st.one_of(
    st.tuples(st.just("request")),
    st.tuples(st.just("leave"), st.integers(0, 7), st.booleans()),
    st.tuples(st.just("headers"), st.integers(0, 7), st.sampled_from([200, 200, 500, 503])),
    st.tuples(st.just("data"), st.integers(0, 7)),
    st.tuples(st.just("end"), st.integers(0, 7), st.booleans()),
    st.tuples(st.just("down"), st.integers(0, 1)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 10.0, 25.0, 31.0])),
)
