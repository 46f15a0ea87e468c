"""Request bodies piped to an engine as they arrive, for model management.

twisted.web reads a request's whole body before it runs the route; a multi-GB blob upload
(``POST /api/blobs/sha256:...``) must instead reach the engine as it arrives, in bounded
memory. For the model-management routes only (``streams``), ``streaming_request_factory``
swaps the body buffer for a ``BodyPipe`` once the head is in, and
``PharosChannel.allHeadersReceived`` runs the route at once (``dispatch_early``); the route
hands the pipe to treq as the engine request's ``IBodyProducer``. Backpressure both ways: the
pipe stops reading the client while the engine's socket is full or not yet open, and reads
again when it drains; about two socket reads are held at most. Every other request keeps
twisted.web's path (a path-prefix test per head, an attribute test per body chunk).

A streamed body keeps the site's idle timeout between its bytes (not ``timeouts.request_body``
for the whole body, which a multi-GB upload would pass), stopped while Pharos holds the client
back. A reply that ends before the body was read whole closes the connection (its unread rest
cannot be parsed as the next request); a client that leaves mid-body fails the pipe, so the
engine's request is aborted mid-body.
"""

from __future__ import annotations

from io import BytesIO
from typing import Any

from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IConsumer, IDelayedCall, IPushProducer
from twisted.python.failure import Failure
from twisted.web.iweb import UNKNOWN_LENGTH, IBodyProducer
from twisted.web.server import Request
from zope.interface import implementer

#: Ollama's model-management routes whose request bodies are piped (``/api/blobs/...`` too).
STREAMED_PATHS = frozenset({b"/api/pull", b"/api/push", b"/api/create", b"/api/copy",
                            b"/api/delete"})
BLOBS_PREFIX = b"/api/blobs/"
_BODY_METHODS = frozenset({b"POST", b"PUT", b"DELETE", b"PATCH"})
#: Seconds without a body byte (while not held back) before a streamed upload is cut, when
#: the site has no idle timeout of its own.
DEFAULT_STALL = 60.0


#: What a piped path starts with: one C-level test turns every other request away.
_PREFIXES = (*STREAMED_PATHS, BLOBS_PREFIX)


def streams(command: bytes, path: bytes) -> bool:
    """Whether a request's body is piped: a body-carrying method on a management route."""
    if not path.startswith(_PREFIXES) or command not in _BODY_METHODS:
        return False
    bare = path.split(b"?", 1)[0]
    return bare in STREAMED_PATHS or bare.startswith(BLOBS_PREFIX)


class BodyCut(Exception):
    """The client's body ended before its end (the connection was lost or stalled)."""


@implementer(IBodyProducer, IPushProducer)
class BodyPipe:
    """A request body on its way to an engine: written by the client side as it arrives,
    produced to the engine request's consumer (treq's ``IBodyProducer``). ``client``: the
    client's transport, paused while the engine side cannot take more. ``length``: the
    client's Content-Length (None: chunked, and the engine request is chunked too)."""

    def __init__(self, client: IPushProducer, length: int | None, call_later: Any,
                 stall: float = DEFAULT_STALL) -> None:
        self.length = UNKNOWN_LENGTH if length is None else length
        self.received = 0
        self.sent = 0
        self.complete = False
        self.failed: Failure | None = None
        self._client = client
        self._call_later = call_later
        self._stall = stall
        self._consumer: IConsumer | None = None
        self._buffer: list[bytes] = []
        self._paused = False  # the engine side asked for a pause
        self._holding = False  # the client's socket is not being read
        self._stopped = False
        self._done: Deferred[None] | None = None
        self._timer: IDelayedCall | None = None
        self._arm()

    # --- the client side -------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """A chunk of the client's body (``Request.handleContentChunk``)."""
        self.received += len(data)
        if self._stopped or self.failed is not None:
            return
        if self._consumer is not None and not self._paused and not self._buffer:
            self.sent += len(data)
            self._consumer.write(data)
        else:
            self._buffer.append(data)
            self._hold()
        if not self._holding:
            self._arm()

    def finish(self) -> None:
        """The client's body arrived whole."""
        self.complete = True
        self._disarm()
        self._maybe_done()

    def cut(self, reason: Failure) -> None:
        """The client's connection went away: the engine's request fails mid-body."""
        self._disarm()
        if self.complete or self.failed is not None:
            return
        self.failed = reason
        self._buffer.clear()
        if self._done is not None and not self._done.called and not self._stopped:
            self._done.errback(BodyCut(f"the client's body was cut after {self.received} "
                                       f"bytes: {reason.getErrorMessage()}"))

    # --- the engine side (IBodyProducer) ---------------------------------------------------

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        """The engine request is being sent: pass what came, then the rest as it comes."""
        self._consumer = consumer
        if self.failed is not None:
            return fail(BodyCut("the client's body was cut before the engine connection "
                                "opened"))
        self._done = Deferred()
        self._flush()
        self._settle()
        return self._done

    def pauseProducing(self) -> None:
        """The engine's socket is full: stop reading the client's."""
        self._paused = True
        self._hold()

    def resumeProducing(self) -> None:
        """The engine's socket drained: pass what is held, read the client's socket again."""
        self._paused = False
        self._flush()
        self._settle()

    def stopProducing(self) -> None:
        """The engine request is gone: nothing more is passed (its Deferred never fires, as
        ``IBodyProducer`` asks); the client is held until the reply closes the connection."""
        self._stopped = True
        self._buffer.clear()
        self._hold()

    # --- inside ----------------------------------------------------------------------------

    def _flush(self) -> None:
        consumer = self._consumer
        while self._buffer and not self._paused and consumer is not None:
            chunk = self._buffer.pop(0)
            self.sent += len(chunk)
            consumer.write(chunk)  # may pause us at once

    def _settle(self) -> None:
        """After a flush: the client is read again if nothing is kept and the engine takes
        more; the body is done if it ended."""
        if not self._buffer and not self._paused:
            self._release()
        self._maybe_done()

    def _maybe_done(self) -> None:
        done = self._done
        if self.complete and not self._buffer and done is not None and not done.called \
                and not self._stopped:
            done.callback(None)

    def _hold(self) -> None:
        if not self._holding and not self.complete:
            self._holding = True
            self._disarm()
            self._client.pauseProducing()

    def _release(self) -> None:
        if self._holding:
            self._holding = False
            self._client.resumeProducing()
            self._arm()

    def _arm(self) -> None:
        if self.complete or self._stall <= 0:
            return
        if self._timer is not None and self._timer.active():
            self._timer.reset(self._stall)
        else:
            self._timer = self._call_later(self._stall, self._stalled)

    def _disarm(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def _stalled(self) -> None:
        self._timer = None
        abort = getattr(self._client, "abortConnection", None)
        if abort is not None:
            abort()  # connectionLost cuts the pipe
        else:
            self.cut(Failure(BodyCut(f"no body byte for {self._stall:g} s")))


class StreamingRequest(Request):
    """The request-class mixin (``streaming_request_factory``): a management route's body is
    piped instead of buffered."""

    pipe: BodyPipe | None = None
    _dispatched = False
    _saved_timeout: float | None = None

    def gotLength(self, length: int | None) -> None:
        channel = self.channel
        if length != 0 and streams(getattr(channel, "_command", b""),
                                   getattr(channel, "_path", b"")):
            self.content = BytesIO()
            stall = getattr(channel, "timeOut", None) or DEFAULT_STALL
            transport = channel.transport
            assert IPushProducer.providedBy(transport)
            self.pipe = BodyPipe(transport, length, channel.callLater, stall)
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        # (the channel's body decoder holds this bound method from the head's first length
        # header on, before gotLength: a per-instance swap would never be called)
        pipe = self.pipe
        if pipe is not None:
            pipe.write(data)
        else:
            super().handleContentChunk(data)

    def dispatch_early(self, command: bytes, path: bytes, version: bytes) -> None:
        """Run the route now, the head read and the body to come. The channel's idle timeout is
        off meanwhile (the pipe has its own between body bytes) until the request ends."""
        self._dispatched = True
        channel = self.channel
        self._saved_timeout = channel.setTimeout(None)
        super().requestReceived(command, path, version)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self._dispatched:  # the body's end: the route is already running
            channel = self.channel
            if channel is not None:
                channel._savedTimeOut = self._saved_timeout
            if self.pipe is not None:
                self.pipe.finish()
            return
        super().requestReceived(command, path, version)

    def finish(self) -> None:
        pipe = self.pipe
        if pipe is not None and not pipe.complete and self.channel is not None:
            # The rest of the body is never read: the connection closes after this reply.
            self.channel.persistent = False
            if not self.startedWriting:
                self.responseHeaders.setRawHeaders(b"connection", [b"close"])
        super().finish()

    def connectionLost(self, reason: Failure) -> None:
        if self.pipe is not None:
            self.pipe.cut(reason)
        super().connectionLost(reason)


def streaming_request_factory(base: type[Request]) -> type[Request]:
    """``base`` (the site's request class, e.g. ``body.bounded_request_factory``'s) with
    management routes' bodies piped (``StreamingRequest``)."""
    return type("StreamingRequest", (StreamingRequest, base), {})
