"""A rig of engine doubles with a client, for the sim tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import HTTPConnectionPool, ResponseDone
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from pharos.engine.fetch import HTTPFetcher, make_client
from pharos.engine.plan import Plan
from pharos.sim.double import EngineDouble, start_double


class Body(Protocol):
    """Collects a response body as it arrives and how its connection ended."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.reason: Failure | None = None
        self._ended: Deferred[None] = Deferred()
        self._waiters: list[tuple[Callable[[bytes], bool], Deferred[None]]] = []

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks)

    def dataReceived(self, data: bytes) -> None:
        self.chunks.append(data)
        for waiter in list(self._waiters):
            if waiter[0](self.data):
                self._waiters.remove(waiter)
                waiter[1].callback(None)

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
        self.reason = reason
        self._ended.callback(None)

    async def ended(self) -> Failure:
        """How the body ended (``ResponseDone`` when whole)."""
        await self._ended
        assert self.reason is not None
        return self.reason

    def until(self, predicate: Callable[[bytes], bool]) -> Deferred[None]:
        """Fires once the body so far satisfies ``predicate``."""
        d: Deferred[None] = Deferred()
        if predicate(self.data):
            d.callback(None)
        else:
            self._waiters.append((predicate, d))
        return d


class Rig:
    """One double on a loopback port, and a client for it."""

    def __init__(self, kind: str, clock: Any = None, **model_args: Any) -> None:
        self.clock = clock if clock is not None else reactor
        double, port = start_double(kind, reactor, clock=self.clock, **model_args)
        self.double: EngineDouble = double
        self.port: IListeningPort = port
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.client: HTTPClient = make_client(reactor, self.pool)
        self.fetcher = HTTPFetcher(double.url, self.client, reactor, timeout=5.0)
        self._pending: list[Deferred[Any]] = []

    def post(self, path: str, body: bytes | dict[str, Any]) -> Deferred[Any]:
        """POST a body; the Deferred fires with the response (at its headers)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        d: Deferred[Any] = self.client.request(
            "POST", self.double.url + path, data=data, unbuffered=True,
            headers=Headers({b"content-type": [b"application/json"]}), allow_redirects=False)
        self._pending.append(d)
        return d

    async def read(self, response: IResponse) -> Body:
        """Deliver the body to a collector."""
        body = Body()
        response.deliverBody(body)
        return body

    async def whole(self, path: str, body: bytes | dict[str, Any]) -> tuple[IResponse, bytes]:
        """POST and read the whole reply."""
        response = await self.post(path, body)
        got = await self.read(response)
        reason = await got.ended()
        assert reason.check(ResponseDone), reason
        return response, got.data

    async def close(self) -> None:
        for d in self._pending:
            if not d.called:
                d.cancel()
            d.addErrback(lambda _: None)
        self.double.kill()
        self.double.stop()
        await self.pool.closeCachedConnections()
        stopped = self.port.stopListening()
        if stopped is not None:
            await stopped


def started(double: EngineDouble, n: int) -> Callable[[], bool]:
    """A predicate: ``n`` requests have reached the double's model."""
    return lambda: double.stats.started >= n


def plan_outline(plan: Plan) -> tuple[str, str | None, list[str], list[tuple[str, str]]]:
    return (plan.kind, plan.version, [p.name for p in plan.active],
            [(d.probe.name, d.reason) for d in plan.dropped])


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], **extra}
