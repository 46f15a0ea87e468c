"""Ollama's model management through Pharos: ``/api/pull``, ``/api/push``, ``/api/create``,
``/api/copy``, ``/api/delete`` and ``/api/blobs/:digest`` (HEAD, POST).

An admin's request goes to one Ollama backend, past the scheduler (no slot, no routing by
model): the one the ``x-pharos-backend`` header names (its URL as config or discovery gives
it, or its ``host:port``), else the only Ollama backend up. Several up and none named: 409
naming them; none up: 409; no such backend, or not Ollama: 400 naming the choices; the named
backend down: 503.

Both bodies are streamed end to end: the request's through ``stream_body.BodyPipe`` (the route
runs once the head is in), the reply's through ``relay.Relay`` with a pass-through tap
(progress is a JSON line at a time; a slow reader pauses the engine read). An engine reply
that breaks off cuts the client's connection, never a clean end; a client leaving mid-upload
makes the engine's request fail mid-body.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from typing import Any

from treq.client import HTTPClient
from twisted.internet.error import ConnectError, DNSLookupError
from twisted.internet.interfaces import IReactorTime, ITCPTransport
from twisted.web.client import (
    RequestGenerationFailed,
    RequestTransmissionFailed,
    ResponseFailed,
    ResponseNeverReceived,
)
from twisted.web.http_headers import Headers
from twisted.web.server import Request

from pharos.engine.agent import NO_COOKIES
from pharos.engine.library import OLLAMA
from pharos.proxy import errors
from pharos.proxy.admin import redact_url
from pharos.proxy.errors import ApiError
from pharos.proxy.relay import EngineDied, Relay, response_headers
from pharos.state.registry import BackendState
from pharos.state.state import State

#: The header naming the backend a management request goes to.
BACKEND_HEADER = b"x-pharos-backend"
#: Management routes under ``/api/`` and their methods (``blobs/:digest`` apart).
MANAGE_METHODS: dict[str, tuple[str, ...]] = {
    "pull": ("POST",), "push": ("POST",), "create": ("POST",), "copy": ("POST",),
    "delete": ("DELETE",),
}
BLOB_METHODS = ("HEAD", "POST")
#: Request headers passed to the engine (the rest, the client's key included, stay here).
_PASSED = (b"content-type", b"accept", b"user-agent")


class _PassThrough:
    """The relay's tap for management replies: every byte as it comes."""

    def feed(self, chunk: bytes) -> bytes:
        return chunk

    def finish(self) -> bytes:
        return b""


def _netloc(url: str) -> str:
    try:
        return urllib.parse.urlsplit(url).netloc.rpartition("@")[2]
    except ValueError:
        return url


class ModelManager:
    """Forwards management requests to one Ollama backend. ``idle_timeout``: the reply's
    stall limit (``timeouts.stream_idle``, read per request so a reload applies)."""

    def __init__(self, state: State, client: HTTPClient, clock: IReactorTime,
                 idle_timeout: Callable[[], float]) -> None:
        self.state = state
        self.client = client
        self.clock = clock
        self.idle_timeout = idle_timeout

    def backend_for(self, request: Request) -> BackendState:
        """The backend named by ``x-pharos-backend``, else the only Ollama backend up."""
        backends = list(self.state.backends.values())
        ollama = [b for b in backends if b.kind == OLLAMA]
        choices = ", ".join(redact_url(b.url) for b in ollama) or "none configured"
        raw = request.getHeader(BACKEND_HEADER)
        if raw:
            name = raw.decode("latin-1").strip().rstrip("/")
            for b in backends:
                if name in (b.url, _netloc(b.url)):
                    if b.kind != OLLAMA:
                        raise ApiError(400, f"backend {redact_url(b.url)} is "
                                            f"{b.kind or 'not resolved yet'}, not Ollama: "
                                            f"models are managed on Ollama backends "
                                            f"({choices})", code="not_ollama")
                    if not self.state.is_up(b):
                        raise ApiError(503, f"backend {redact_url(b.url)} is down",
                                       type="server_error", code="backend_down")
                    return b
            raise ApiError(400, f"no backend {errors.echo(name)!r}: x-pharos-backend names an "
                                f"Ollama backend by URL or host:port ({choices})",
                           code="unknown_backend")
        up = [b for b in ollama if self.state.is_up(b)]
        if len(up) == 1:
            return up[0]
        if not up:
            raise ApiError(409, f"no Ollama backend is up to manage models on (Ollama "
                                f"backends: {choices})", code="no_ollama_backend")
        raise ApiError(409, f"{len(up)} Ollama backends are up: name one with the "
                            f"x-pharos-backend header ({', '.join(b.url for b in up)})",
                       code="backend_required")

    async def forward(self, request: Request) -> None:
        """Send the request to its backend and relay the reply, both bodies streamed."""
        backend = self.backend_for(request)
        method = request.method.decode("ascii")
        pipe = getattr(request, "pipe", None)
        body: Any
        if pipe is not None:
            body = pipe
        elif method in ("HEAD", "GET"):
            body = None
        else:
            assert request.content is not None
            body = request.content.read()
        headers = Headers()
        for name in _PASSED:
            values = request.requestHeaders.getRawHeaders(name)
            if values:
                headers.setRawHeaders(name, values)
        url = backend.url + request.uri.decode("latin-1")
        try:
            response = await self.client.request(
                method, url, data=body, headers=headers, unbuffered=True,
                allow_redirects=False, cookies=NO_COOKIES)
        except (ConnectError, DNSLookupError, ResponseNeverReceived, ResponseFailed,
                RequestGenerationFailed, RequestTransmissionFailed) as e:
            # (a client that left mid-body gets nothing: its connection is gone)
            raise errors.upstream(f"backend {redact_url(backend.url)} did not answer: "
                                  f"{e.__class__.__name__}") from None
        request.setResponseCode(response.code)
        for name, values in response_headers(response):
            request.responseHeaders.setRawHeaders(name, values)
        request.setHeader(b"x-pharos-backend", backend.url.encode())
        relay = Relay(request, _PassThrough(), self.clock, on_first_byte=lambda: None,
                      idle_timeout=self.idle_timeout())
        response.deliverBody(relay)
        try:
            await relay.done
        except EngineDied:
            # Never a clean end on a broken reply: the client sees the cut.
            channel = request.channel
            transport = channel.transport if channel is not None else None
            if ITCPTransport.providedBy(transport):
                transport.abortConnection()
