"""Layer 2: ``pharos.proxy.unload`` over loopback. A cold load's named victims are asked to
unload one after the other with Ollama's request (no prompt, ``keep_alive: 0``), except one
``/api/ps`` says is loaded for good; a host that refuses, errs or never answers costs at most
the timeout and never fails the load."""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.web.client import HTTPConnectionPool
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from pharos.engine.fetch import make_client
from pharos.proxy.unload import UNLOAD_TIMEOUT_SEC, unload
from tests.support.capture_server import close, serve
from tests.support.fleet import within

#: ``/api/ps`` of a host that loaded ``b`` for good (``keep_alive: -1``) and ``a`` for 5 min.
PS_PINNED = (b'{"models":[{"name":"b","model":"b","expires_at":"2318-03-18T02:43:13.88-07:00"},'
             b'{"name":"a","model":"a","expires_at":"2026-12-07T10:08:33.914260117-08:00"}]}')


class Host(Resource):
    """``/ok/api/generate`` answers Ollama's unload reply, ``/err/…`` a 500, ``/hang/…``
    nothing; ``/pin/api/ps`` lists ``b`` loaded for good, ``/ok/api/ps`` nothing pinned;
    every POST body is kept."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[tuple[str, Any]] = []
        self.hanging: list[Request] = []

    def _failing(self, request: Request, path: str) -> Any:
        """``/hang/``: no answer; ``/err/``: a 500; else None."""
        if path.startswith("/hang/"):
            self.hanging.append(request)
            return NOT_DONE_YET
        if path.startswith("/err/"):
            request.setResponseCode(500)
            return b'{"error":"boom"}'
        return None

    def render_GET(self, request: Request) -> Any:
        path = request.path.decode()
        failing = self._failing(request, path)
        if failing is not None:
            return failing
        return PS_PINNED if path.startswith("/pin/") else b'{"models":[]}'

    def render_POST(self, request: Request) -> Any:
        assert request.content is not None
        path = request.path.decode()
        self.bodies.append((path, json.loads(request.content.read())))
        failing = self._failing(request, path)
        if failing is not None:
            return failing
        return b'{"model":"m","created_at":"2026-12-07T00:00:00Z","response":"","done":true,' \
               b'"done_reason":"unload"}'


@pytest_twisted.ensureDeferred
async def test_each_victim_is_asked_to_unload_and_failures_only_cost_the_timeout() -> None:
    """Two victims on a host that answers: two requests to ``/api/generate``, each naming its
    model with ``keep_alive: 0`` and no prompt, both accepted. A host answering 500 accepts
    none, and one that never answers gives up after ``UNLOAD_TIMEOUT_SEC`` (its ``/api/ps``
    and its unloads together); neither raises, so the load is sent anyway. A closed port is
    the same. A victim the host lists as loaded for good (``expires_at`` in 2318) is skipped."""
    host = Host()
    port, url = serve(host)
    pool = HTTPConnectionPool(reactor, persistent=False)
    client = make_client(reactor, pool)
    try:
        assert await within(unload(client, reactor, url + "/ok", ["a", "b"])) == 2
        assert host.bodies == [("/ok/api/generate", {"model": "a", "keep_alive": 0}),
                               ("/ok/api/generate", {"model": "b", "keep_alive": 0})]
        assert await within(unload(client, reactor, url + "/err", ["a"])) == 0
        started = reactor.seconds()
        assert await within(unload(client, reactor, url + "/hang", ["a"])) == 0
        took = reactor.seconds() - started  # its /api/ps and its unload share one budget
        assert UNLOAD_TIMEOUT_SEC * 0.9 <= took < UNLOAD_TIMEOUT_SEC * 1.5 + 1
        assert [p for p, _ in host.bodies][-2:] == ["/err/api/generate", "/hang/api/generate"]
        # A model loaded for good is never unloaded by Pharos; the others are.
        assert await within(unload(client, reactor, url + "/pin", ["b", "a"])) == 1
        assert host.bodies[-1] == ("/pin/api/generate", {"model": "a", "keep_alive": 0})
        assert [p for p, _ in host.bodies].count("/pin/api/generate") == 1
    finally:
        for r in host.hanging:
            if not r.finished and r.channel is not None:
                r.channel.transport.loseConnection()  # type: ignore[union-attr]
        await pool.closeCachedConnections()
        await close(port)
    assert await within(unload(client, reactor, url + "/ok", ["a"])) == 0  # nobody listens
