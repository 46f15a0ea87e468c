"""The public listener's HTTP/1.1 channel, hardened at the protocol level.

twisted.web answers what it cannot parse (bad Content-Length or Transfer-Encoding, NUL in a
header, too many or too large headers) with a bare ``400``; never splits a head whose lines end
in a bare LF, so it waits for the idle timeout; and restarts the idle timer on every byte, so a
client sending one header byte every 20 s is never cut off. This channel answers every protocol
error in JSON (in the route's error shape when the request line got that far), refuses bare-LF
heads at once, gives a head ``timeouts.request_headers`` to arrive whole and its body
``timeouts.request_body`` after it, and tells HTTP/1.0 clients the connection closes after the
reply. An idle keep-alive connection is closed after ``timeouts.idle`` (the site's ``timeOut``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from twisted.web.http import HTTPChannel, _GenericHTTPChannelProtocol
from twisted.web.resource import IResource
from twisted.web.server import Request, Site

from pharos.config import DEFAULT_REQUEST_BODY, DEFAULT_REQUEST_HEADERS
from pharos.proxy.errors import ApiError, is_ollama_path

_REASONS = {400: b"Bad Request", 408: b"Request Timeout",
            431: b"Request Header Fields Too Large"}


class PharosChannel(HTTPChannel):
    """An ``HTTPChannel`` whose protocol errors are JSON and whose request heads are bounded
    in time and must end their lines in CRLF."""

    head_deadline = DEFAULT_REQUEST_HEADERS
    body_deadline = DEFAULT_REQUEST_BODY

    def __init__(self) -> None:
        super().__init__()
        self._head_timer: IDelayedCall | None = None

    def dataReceived(self, data: bytes) -> None:
        if self.line_mode and not self._handlingRequest:
            if self._head_timer is None and self.transport is not None:
                self._head_timer = self.callLater(self.head_deadline, self._head_too_slow)
            head = self._buffer + data
            end = head.find(b"\r\n\r\n")
            if end >= 0:
                head = head[:end]
            if b"\n" in head.replace(b"\r\n", b""):
                self._refuse(400, "request lines must end in CRLF")
                return
        super().dataReceived(data)

    def allHeadersReceived(self) -> None:
        self._stop_head_timer()
        super().allHeadersReceived()
        req = self.requests[-1]
        if self._version != b"HTTP/1.1":
            req.responseHeaders.setRawHeaders(b"connection", [b"close"])
        if getattr(req, "pipe", None) is not None and not getattr(self, "_refused", False):
            # A model-management body (pharos.proxy.stream_body): the route runs now and
            # the body is piped to the engine as it arrives, paced by its idle timeout.
            req.dispatch_early(self._command, self._path, self._version)
            return
        if self.length != 0 and self.transport is not None:  # a body to come: bounded in time
            self._head_timer = self.callLater(self.body_deadline, self._body_too_slow)

    def allContentReceived(self) -> None:
        self._stop_head_timer()
        super().allContentReceived()

    def _body_too_slow(self) -> None:
        self._head_timer = None
        self._refuse(408, f"the request body did not arrive within {self.body_deadline:g} s")

    def _head_too_slow(self) -> None:
        self._head_timer = None
        self._refuse(408, f"request headers did not arrive within {self.head_deadline:g} s")

    def _stop_head_timer(self) -> None:
        timer, self._head_timer = self._head_timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def lineLengthExceeded(self, line: bytes) -> None:
        """A request or header line past ``MAX_LENGTH`` (16 KiB; an enormous Authorization or
        cookie): 431, where LineReceiver would close without a word."""
        self._refuse(431, f"a request header line is longer than {self.MAX_LENGTH} bytes")

    def _respondToBadRequestAndDisconnect(self) -> None:
        self._refuse(400, "malformed HTTP request (request line, headers or body framing)")

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` with a JSON body and close the connection."""
        self._stop_head_timer()
        transport = self.transport
        if transport is None or getattr(self, "_refused", False):
            return
        self._refused = True
        path = getattr(self, "_path", b"") or b""
        body = ApiError(status, message, code="bad_request").body(ollama=is_ollama_path(path))
        transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                        % (status, _REASONS[status], len(body), body))
        self.dataReceived = self.lineReceived = lambda *a: None  # type: ignore[method-assign]
        self.loseConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._stop_head_timer()
        super().connectionLost(reason)


class PublicSite(Site):
    """The public site: ``PharosChannel``s, every request handed to the drain's ``track``
    before its resource is found, and no access log (obs writes one debug line per request,
    without prompt text). ``idle``: seconds an idle keep-alive connection stays open."""

    def __init__(self, resource: IResource, *, track: Callable[[Request], None] | None = None,
                 head_deadline: float = DEFAULT_REQUEST_HEADERS,
                 body_deadline: float = DEFAULT_REQUEST_BODY, idle: float | None = None,
                 requestFactory: Any = None) -> None:  # noqa: N803
        kw = {} if idle is None else {"timeout": idle}
        super().__init__(resource, requestFactory=requestFactory, **kw)
        self.track = track
        self.head_deadline = head_deadline
        self.body_deadline = body_deadline

    def getResourceFor(self, request: Request) -> IResource:
        if self.track is not None:
            self.track(request)
        return super().getResourceFor(request)

    def protocol(self) -> _GenericHTTPChannelProtocol:
        channel = PharosChannel()
        channel.head_deadline = self.head_deadline
        channel.body_deadline = self.body_deadline
        return _GenericHTTPChannelProtocol(channel)

    def log(self, request: Any) -> None:
        """Nothing: twisted.web's access line is not Pharos's request log."""
