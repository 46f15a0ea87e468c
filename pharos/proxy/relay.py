"""The engine leg: a treq request, its reply relayed through the tap, backpressure both ways."""

from __future__ import annotations

import typing
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from hyperlink import EncodedURL
from treq.client import HTTPClient
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from twisted.web.server import Request
from zope.interface import implementer

from pharos.engine.agent import NO_COOKIES

#: Headers that belong to one hop and are never relayed (RFC 9110 §7.6.1).
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"content-length",
    b"content-encoding",
})
#: Seconds a silent reply is cut after (Agent's timeouts end at the headers); ``stream_idle``.
IDLE_TIMEOUT = 120.0


class EngineDied(Exception):
    """The engine's reply ended before it was complete."""


class Stalled(EngineDied):
    """The engine sent nothing for longer than the stream idle time: cut as a death is."""


class Tap(typing.Protocol):
    """What the relay needs from the stream tap (pharos.proxy.streamtap.StreamTap)."""

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to pass on now."""

    def finish(self) -> bytes:
        """Bytes held back, at the end of the stream."""


class _ParsedURL(EncodedURL):
    """An engine URL parsed once: treq re-parses and IDNA-encodes every URL it is given (about
    0.1 ms a request here); engine URLs are few and fixed."""

    def __init__(self, text: str) -> None:
        u = EncodedURL.from_text(text).to_uri()
        super().__init__(scheme=u.scheme, host=u.host, path=u.path, query=u.query,
                         fragment=u.fragment, port=u.port, rooted=u.rooted,
                         userinfo=u.userinfo, uses_netloc=u.uses_netloc)
        self._text = u.to_text()

    def to_uri(self) -> _ParsedURL:
        return self

    def to_text(self, with_password: bool = False) -> str:
        return self._text


@lru_cache(maxsize=4096)
def engine_url(text: str) -> EncodedURL:
    """The parsed form of an engine URL (backend base + route)."""
    return _ParsedURL(text)


def send(client: HTTPClient, url: str, body: bytes, content_type: bytes = b"application/json",
         method: str = "POST") -> Deferred[Any]:
    """One request to an engine: unbuffered, no redirects, no client credentials, no cookies
    (``NO_COOKIES``: treq builds no cookie jar for the request)."""
    headers = Headers({b"content-type": [content_type]})
    return client.request(method, engine_url(url), data=body if method != "GET" else None,
                          headers=headers, unbuffered=True, allow_redirects=False,
                          cookies=NO_COOKIES)


def response_headers(response: IResponse) -> list[tuple[bytes, list[bytes]]]:
    """The engine's headers minus hop-by-hop ones and those its Connection header names."""
    headers = response.headers
    dropped: frozenset[bytes] = HOP_BY_HOP
    connection = headers.getRawHeaders(b"connection")
    if connection:
        dropped = HOP_BY_HOP.union(x.strip().lower() for v in connection for x in v.split(b","))
    return [(k, vs) for k, vs in headers.getAllRawHeaders() if k.lower() not in dropped]


@implementer(IPushProducer)
class Relay(Protocol):
    """Writes each upstream chunk (through the tap) to the client as it arrives.

    The upstream body's protocol and the client request's streaming producer: a client whose
    socket is full pauses the engine read, so a slow reader costs only socket buffers. ``done``
    fires when the reply ended cleanly, or errbacks: ``CancelledError`` when the client left
    (the engine connection is closed, so it stops generating), ``Stalled`` after
    ``idle_timeout`` seconds of silence, ``EngineDied`` when the reply broke off (or was
    ``abandon``-ed before its first byte).
    """

    def __init__(self, request: Request, tap: Tap, clock: IReactorTime,
                 on_first_byte: Callable[[], None], idle_timeout: float = IDLE_TIMEOUT,
                 touch: Callable[[], None] | None = None) -> None:
        self.request = request
        self.tap = tap
        self.clock = clock
        self.on_first_byte = on_first_byte
        self.idle_timeout = idle_timeout
        self.touch = touch
        self.done: Deferred[None] = Deferred(lambda _: self.stopProducing())
        self.bytes_in = 0
        self.abandoned = False
        self._gone = False
        self._stalled_after: float | None = None
        self._registered = False
        self._idle: IDelayedCall | None = None

    def connectionMade(self) -> None:
        if self._gone or self.abandoned or self.request.channel is None or getattr(
                self.request, "_disconnected", False):
            # The client left (or the attempt was given up) before the body started.
            self._gone = self._gone or not self.abandoned
            self.transport.stopProducing()  # type: ignore[union-attr]
            return
        self.request.registerProducer(self, True)
        self._registered = True
        self._arm()

    def _arm(self) -> None:
        if self._idle is not None and self._idle.active():
            self._idle.reset(self.idle_timeout)
        else:
            self._idle = self.clock.callLater(self.idle_timeout, self._stalled)

    def _stalled(self) -> None:
        self._idle = None
        self._stalled_after = self.idle_timeout
        if self.transport is not None:
            self.transport.stopProducing()  # type: ignore[attr-defined]

    def dataReceived(self, data: bytes) -> None:
        if self._gone or self.abandoned:
            return
        if not self.bytes_in:
            self.on_first_byte()
        self.bytes_in += len(data)
        if self.touch is not None:
            self.touch()
        self._arm()
        out = self.tap.feed(data)
        if out:
            self.request.write(out)

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
        if self._idle is not None and self._idle.active():
            self._idle.cancel()
        self._idle = None
        clean = reason.check(ResponseDone, PotentialDataLoss) is not None and not (
            self._gone or self.abandoned or self._stalled_after is not None)
        if clean:
            rest = self.tap.finish()
            if rest:
                if not self.bytes_in:
                    self.on_first_byte()
                self.request.write(rest)
        if self._registered and self.request.channel is not None:
            self._registered = False
            self.request.unregisterProducer()
        if self.done.called:
            return
        if clean:
            self.done.callback(None)
        elif self._gone:
            self.done.errback(CancelledError())
        elif self._stalled_after is not None:
            self.done.errback(Stalled(f"nothing for {self._stalled_after:g} s"))
        else:
            self.done.errback(EngineDied(reason.getErrorMessage()))

    def pauseProducing(self) -> None:
        if self.transport is not None:
            self.transport.pauseProducing()  # type: ignore[attr-defined]

    def resumeProducing(self) -> None:
        if self.transport is not None and not (self._gone or self.abandoned):
            self.transport.resumeProducing()  # type: ignore[attr-defined]

    def stopProducing(self) -> None:
        """The client is gone (or the relay was cancelled): stop reading from the engine."""
        self._gone = True
        if self.transport is not None:
            self.transport.stopProducing()  # type: ignore[attr-defined]

    def abandon(self) -> None:
        """Give the reply up before its first byte (its backend went down, or it is late)."""
        self.abandoned = True
        if self.transport is not None:
            self.transport.stopProducing()  # type: ignore[attr-defined]


def collect(response: IResponse, limit: int = 65536) -> Deferred[bytes]:
    """The start of a (short) reply body, e.g. an engine's error, bounded."""
    parts: list[bytes] = []
    proto: list[Protocol] = []

    def stop(_: Deferred[bytes]) -> None:
        if proto and proto[0].transport is not None:
            proto[0].transport.stopProducing()  # type: ignore[attr-defined]

    done: Deferred[bytes] = Deferred(stop)

    class _Collect(Protocol):
        size = 0

        def dataReceived(self, data: bytes) -> None:
            if self.size < limit:
                parts.append(data[: limit - self.size])
            self.size += len(data)

        def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
            if not done.called:
                done.callback(b"".join(parts))

    p = _Collect()
    proto.append(p)
    response.deliverBody(p)
    return done
