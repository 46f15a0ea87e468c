"""The engine leg's client (``make_client``: treq over ``EngineAgent`` with ``NoCookies``) over
real loopback sockets: cookies an engine sets never come back, one kept-alive connection per
engine is reused (a burst of concurrent requests keeps its connections too), the Host header
is the URL's, and an unsupported scheme fails cleanly."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import gatherResults
from twisted.internet.task import deferLater
from twisted.web.client import HTTPConnectionPool
from twisted.web.error import SchemeNotSupported
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from pharos.proxy.relay import collect, send
from tests.support.capture_server import close, serve


class Engine(Resource):
    """Sets a cookie on every reply; remembers each request's Cookie and Host headers and the
    client port it came from."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[bytes | None, bytes | None, int]] = []

    def render(self, request: Request) -> bytes:
        peer = request.getClientAddress()
        self.seen.append((request.getHeader(b"cookie"), request.getHeader(b"host"),
                          getattr(peer, "port", 0)))
        request.addCookie(b"session", b"engine-secret", path=b"/")
        request.setHeader(b"content-type", b"application/json")
        return b'{"ok":true}'


@pytest_twisted.ensureDeferred
async def test_engine_client_keeps_no_cookies_and_reuses_one_connection() -> None:
    """Three requests to one engine: none carries the cookie the engine set, all name the
    URL's host and port, and all ride one pooled connection (pooling kept under the agent)."""
    from pharos.engine.fetch import make_client

    engine = Engine()
    port, base = serve(engine)
    pool = HTTPConnectionPool(reactor, persistent=True)
    try:
        client = make_client(reactor, pool)
        for _ in range(3):
            response = await send(client, base + "/v1/chat/completions", b'{"model":"m"}')
            assert response.code == 200
            assert await collect(response) == b'{"ok":true}'
        host = base.removeprefix("http://").encode()
        assert [(c, h) for c, h, _ in engine.seen] == [(None, host)] * 3
        assert len({p for _, _, p in engine.seen}) == 1, "one kept-alive connection"
    finally:
        await pool.closeCachedConnections()
        await close(port)


@pytest_twisted.ensureDeferred
async def test_engine_client_refuses_an_unsupported_scheme() -> None:
    """A URL whose scheme no endpoint serves fails the request's Deferred (no exception
    escapes the call), every time it is asked (a failed parse is not kept)."""
    from pharos.engine.fetch import make_client

    pool = HTTPConnectionPool(reactor, persistent=True)
    client = make_client(reactor, pool)
    for _ in range(2):
        with pytest.raises(SchemeNotSupported):
            await send(client, "ftp://127.0.0.1:1/x", b"{}")


class HeldEngine(Resource):
    """Holds every request until ``release``; remembers the client port each came from."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Request] = []
        self.ports: list[int] = []

    def render(self, request: Request) -> object:
        self.ports.append(getattr(request.getClientAddress(), "port", 0))
        self.held.append(request)
        return NOT_DONE_YET

    def release(self) -> None:
        held, self.held = self.held, []
        for request in held:
            request.setHeader(b"content-type", b"application/json")
            request.write(b'{"ok":true}')
            request.finish()


@pytest_twisted.ensureDeferred
async def test_a_burst_of_concurrent_requests_keeps_its_engine_connections() -> None:
    """Pharos's own engine pool (``PharosService``), two bursts of 64 requests in flight at
    once to one engine: the second burst rides the 64 connections the first opened (a pool
    that kept only 32 idle closed the rest after each burst and opened new ones for the
    next: 96 connections here, one new connection every two requests under a steady load of
    64 clients)."""
    from pharos.config import Config
    from pharos.service import PharosService

    top = PharosService.from_config(reactor, Config())
    engine = HeldEngine()
    port, base = serve(engine)
    try:
        for _ in range(2):
            sent = [send(top.client, base + "/v1/chat/completions", b'{"model":"m"}')
                    for _ in range(64)]
            for _ in range(500):  # until all 64 are held at the engine (5 s at most)
                if len(engine.held) == 64:
                    break
                await deferLater(reactor, 0.01, lambda: None)
            assert len(engine.held) == 64
            engine.release()
            responses = await gatherResults(sent)
            assert [await collect(r) for r in responses] == [b'{"ok":true}'] * 64
            await deferLater(reactor, 0, lambda: None)  # the connections back in the pool
        assert len(engine.ports) == 128
        assert len(set(engine.ports)) == 64, "the second burst opened no connection"
    finally:
        await top.pool.closeCachedConnections()
        await close(port)
