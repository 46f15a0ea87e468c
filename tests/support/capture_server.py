"""A loopback HTTP server that answers like a recorded capture (tests only)."""

from __future__ import annotations

from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IListeningPort, IReactorTCP, IReactorTime
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from pharos.config import LISTEN_BACKLOG
from pharos.engine.capture import Capture


class CaptureResource(Resource):
    """Serves each recorded path with its recorded status, content type and body.

    ``delays`` holds paths whose answer starts only after that many seconds; ``bodies``
    replaces a path's body (huge or malformed pages).
    """

    isLeaf = True

    def __init__(self, capture: Capture, clock: IReactorTime) -> None:
        super().__init__()
        self.capture = capture
        self.clock = clock
        self.delays: dict[str, float] = {}
        self.bodies: dict[str, bytes] = {}
        self.gets: list[str] = []

    def render_POST(self, request: Request) -> Any:
        """A route the capture recorded replies for answers 400 to a body naming no model."""
        path = request.path.decode()
        served = any(r.path == path for r in self.capture.replies)
        request.setResponseCode(400 if served else 404)
        return b'{"error":"model is required"}' if served else b"404 page not found"

    def render_GET(self, request: Request) -> Any:
        path = request.path.decode()
        self.gets.append(path)
        rec = self.capture.paths.get(path)
        if rec is None or rec.status == 0:
            request.setResponseCode(404)
            return b"not recorded"
        request.setResponseCode(rec.status)
        request.responseHeaders.removeHeader(b"content-type")
        if rec.content_type:
            request.setHeader(b"content-type", rec.content_type.encode())
        body = self.bodies.get(path, rec.body)
        delay = self.delays.get(path)
        if delay is None:
            return body

        def later() -> None:
            if not request.finished and not request._disconnected:
                request.write(body)
                request.finish()

        self.clock.callLater(delay, later)
        return NOT_DONE_YET


def serve(resource: Resource | Site) -> tuple[IListeningPort, str]:
    """Listen on a free loopback port; the port and its base URL."""
    from twisted.internet import reactor

    tcp: IReactorTCP = reactor
    site = resource if isinstance(resource, Site) else Site(resource)
    port = tcp.listenTCP(0, site, backlog=LISTEN_BACKLOG,  # type: ignore[arg-type]
                         interface="127.0.0.1")
    host = port.getHost()
    assert isinstance(host, IPv4Address)
    return port, f"http://127.0.0.1:{host.port}"


async def close(port: IListeningPort) -> None:
    """Stop listening, waiting until the port is closed."""
    stopped = port.stopListening()
    if stopped is not None:
        await stopped
