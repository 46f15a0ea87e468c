"""The bench as a load balancer in front of several instances, over real loopback sockets: the
health watch marks an instance down on a 503 or a refused connection, and a request whose
instance is down, or refuses it, goes to the next one up."""

from __future__ import annotations

from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.web.resource import Resource
from twisted.web.server import Request

from pharos.bench.openloop import OpenLoop, new_pool
from pharos.bench.records import REFUSED
from pharos.bench.restarts import HealthWatch
from pharos.sim.double import start_double
from tests.support.bench import _until, scheduled
from tests.support.capture_server import close, serve


class Health(Resource):
    isLeaf = True

    def __init__(self, code: int) -> None:
        super().__init__()
        self.code = code

    def render_GET(self, request: Request) -> Any:
        request.setResponseCode(self.code)
        return b"{}"


@pytest_twisted.ensureDeferred
async def test_health_watch_marks_503_and_refused_down() -> None:
    """An instance answering /healthz 200 is up; one answering 503 (draining, starting) and
    one refusing connections are down once polled."""
    ok_port, ok_url = serve(Health(200))
    busy_port, busy_url = serve(Health(503))
    gone_port, gone_url = serve(Resource())
    await close(gone_port)
    pool = new_pool(reactor)
    watch = HealthWatch(reactor, [ok_url, busy_url, gone_url], pool, interval=0.05)
    watch.start()
    try:
        await _until(lambda: not watch.up(busy_url) and not watch.up(gone_url))
        assert watch.up(ok_url)
    finally:
        watch.stop()
        await pool.closeCachedConnections()
        await close(ok_port)
        await close(busy_port)


@pytest_twisted.ensureDeferred
async def test_requests_skip_a_down_instance_and_retry_a_refusing_one() -> None:
    """Round robin over a refusing URL and a serving one: with ``available``, the request
    whose turn falls on the refusing URL is sent to the next one (the harness saw it up, the
    connection was refused, nothing was sent); one whose URL is known down goes elsewhere at
    once; without ``available`` the refusal is a record, as before."""
    double, port = start_double("vllm", reactor, models={"tiny": 0})
    gone_port, gone_url = serve(Resource())
    await close(gone_port)
    try:
        urls = [gone_url, double.url]
        reqs = [scheduled(0.0), scheduled(0.01), scheduled(0.02), scheduled(0.03)]
        records = await OpenLoop(reactor, reqs, urls, timeout=30.0,
                                 available=lambda u: True).run()
        assert [r.error for r in records] == [None] * 4
        assert [r.url for r in records] == [double.url] * 4
        records = await OpenLoop(reactor, reqs[:2], urls, timeout=30.0,
                                 available=lambda u: u != gone_url).run()
        assert [(r.error, r.url) for r in records] == [(None, double.url)] * 2
        records = await OpenLoop(reactor, reqs[:2], urls, timeout=30.0).run()
        assert [r.error for r in records] == [REFUSED, None]
    finally:
        double.stop()
        await close(port)
