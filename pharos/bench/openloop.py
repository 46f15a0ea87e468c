"""Sending a workload open loop: every request at its scheduled time whatever the earlier ones
are doing, so a server that falls behind cannot slow the offered load, and timed from its
*scheduled* time, so neither a queue at the server nor a late send can hide (no coordinated
omission).

Each request goes to ``/v1/chat/completions`` of one base URL: Pharos's, or for the cache-blind
baselines one of several engines picked here (seeded, before the run, so a seed sends the same
requests to the same engines). ``timeout`` seconds after its scheduled time a request is
cancelled and recorded as a timeout, so a run ends by itself. Failures become records, never
exceptions.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectionRefusedError, DNSLookupError
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure
from twisted.web.client import HTTPConnectionPool, ResponseFailed
from twisted.web.http_headers import Headers

from pharos.bench.clients import Sender
from pharos.bench.records import (
    DISCONNECTED,
    NO_TOKEN,
    REFUSED,
    STREAM_ERROR,
    TIMEOUT,
    TRUNCATED,
    RequestRecord,
)
from pharos.bench.stream import StreamReader
from pharos.bench.workloads import Request
from pharos.engine.fetch import make_client

#: Where every request goes.
CHAT_PATH = "/v1/chat/completions"
#: Ways the harness itself spreads requests over several base URLs: the cache-blind baselines,
#: and ``prefix-aware``, production-stack's prefixaware router as a peer baseline.
DISPATCH = ("round-robin", "random", "prefix-aware")
#: production-stack's HashTrie chunk: 128 characters of the prompt text.
PREFIX_CHUNK_CHARS = 128
#: Default bound on one request, from its scheduled time.
DEFAULT_TIMEOUT = 60.0
#: Idle pooled connections are closed after this long: below the 5 s keep-alive of
#: uvicorn-based engines, since Twisted does not retry a POST on a stale connection.
POOL_IDLE_SEC = 2


def assign(urls: Sequence[str], requests: Sequence[Request], dispatch: str, seed: int
           ) -> list[str]:
    """The base URL of each request: round robin by request index, drawn uniformly from a
    stream seeded by ``seed`` alone, or ``prefix_aware``'s choice."""
    if not urls:
        raise ValueError("need at least one URL")
    if dispatch not in DISPATCH:
        raise ValueError(f"unknown dispatch {dispatch!r}: one of {', '.join(DISPATCH)}")
    count = len(requests)
    if dispatch == "round-robin":
        return [urls[i % len(urls)] for i in range(count)]
    rng = random.Random(f"pharos.bench.dispatch:{seed}")
    if dispatch == "prefix-aware":
        return prefix_aware(urls, requests, rng)
    return [rng.choice(urls) for _ in range(count)]


def next_available(urls: Sequence[str], target: str, up: Callable[[str], bool]) -> str:
    """What a load balancer does with a request whose turn falls on ``target``: ``target`` if
    it is up, else the first URL after it (in ``urls``' order, wrapping) that is; ``target``
    when none is (the request then fails and is counted)."""
    if up(target) or target not in urls:
        return target
    k = urls.index(target)
    for step in range(1, len(urls)):
        url = urls[(k + step) % len(urls)]
        if up(url):
            return url
    return target


def prefix_aware(urls: Sequence[str], requests: Sequence[Request], rng: random.Random
                 ) -> list[str]:
    """production-stack's ``PrefixAwareRouter`` (vllm_router routing_logic.py and
    prefix/hashtrie.py): the contents joined by newlines in 128-character chunks; a random one
    of the engines recorded at the deepest chunk seen before (every engine when none), load
    ignored; the prompt recorded for it. Its trie never forgets and reads no engine state, so
    its choices depend on the requests alone and are made here, before the run."""
    seen: dict[int, set[str]] = {}
    out: list[str] = []
    for r in requests:
        prompt = "\n".join(str(m.get("content") or "") for m in r.messages)
        keys: list[int] = []
        h = 0
        for i in range(0, len(prompt), PREFIX_CHUNK_CHARS):
            h = hash((h, prompt[i:i + PREFIX_CHUNK_CHARS]))
            keys.append(h)
        holders: Sequence[str] = urls
        for k in keys:
            found = seen.get(k)
            if not found:
                break
            holders = sorted(found)
        url = rng.choice(list(holders))
        for k in keys:
            seen.setdefault(k, set()).add(url)
        out.append(url)
    return out


def classify(failure: Failure) -> str:
    """The error kind of a request that got no response."""
    if failure.check(ConnectionRefusedError):
        return REFUSED
    if failure.check(CancelledError):
        return TIMEOUT
    if failure.check(ResponseFailed):  # ResponseNeverReceived is one
        return DISCONNECTED
    if failure.check(DNSLookupError):
        return "dns"
    return type(failure.value).__name__


def new_pool(reactor: IReactorTime) -> HTTPConnectionPool:
    """A pool that never makes a request wait for another's connection."""
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = 256
    pool.cachedConnectionTimeout = POOL_IDLE_SEC
    return pool


class OpenLoop:
    """One run of ``requests`` against ``urls``.

    ``clock`` (default: ``reactor``) schedules sends and timeouts and reads the times, so a
    test can drive time by hand while bytes move on real sockets. Requests scheduled before
    ``warmup`` are marked ``warmup``. ``on_change`` runs after every send and end (a progress
    line). ``senders``, one per request, give its ``Authorization`` header and its record's
    ``client`` and ``key``. ``available`` says whether a base URL is up now: a request whose
    URL is down goes to the next one up (``next_available``), as a load balancer does, and a
    refused connection (nothing sent) is tried on the next URL up, each URL once.
    """

    def __init__(
        self,
        reactor: IReactorTime,
        requests: Sequence[Request],
        urls: Sequence[str],
        *,
        dispatch: str = "round-robin",
        seed: int = 0,
        timeout: float = DEFAULT_TIMEOUT,
        warmup: float = 0.0,
        clock: IReactorTime | None = None,
        pool: HTTPConnectionPool | None = None,
        on_change: Callable[[], None] | None = None,
        senders: Sequence[Sender] | None = None,
        available: Callable[[str], bool] | None = None,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, not {timeout}")
        if senders is not None and len(senders) != len(requests):
            raise ValueError(f"{len(senders)} senders for {len(requests)} requests")
        self.senders = list(senders) if senders is not None else None
        self.reactor = reactor
        self.clock: IReactorTime = clock if clock is not None else reactor
        self.requests = list(requests)
        self.urls = [u.rstrip("/") for u in urls]
        self.targets = assign(self.urls, self.requests, dispatch, seed)
        self.available = available
        self.timeout = timeout
        self.on_change = on_change
        self._own_pool = pool is None
        self.pool = pool if pool is not None else new_pool(reactor)
        self.client = make_client(reactor, self.pool)
        self.records = [
            RequestRecord(index=i, at=r.at, tag=r.tag, model=r.model, max_tokens=r.max_tokens,
                          session=r.session, warmup=r.at < warmup,
                          client=self.senders[i].client if self.senders else None,
                          key=self.senders[i].key if self.senders else None)
            for i, r in enumerate(self.requests)
        ]
        self.sent = 0
        self.finished = 0
        self.errors = 0
        self.start: float | None = None
        self._over = [False] * len(self.requests)
        self._calls: dict[int, IDelayedCall] = {}
        self._expiry: dict[int, IDelayedCall] = {}
        self._pending: dict[int, Deferred[Any]] = {}
        self._readers: dict[int, StreamReader] = {}
        self._refused: dict[int, set[str]] = {}  # URLs that refused a request (``available``)
        self._all: Deferred[None] = Deferred()

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> Deferred[list[RequestRecord]]:
        """Schedule every request from now; fires with the records once each has ended."""
        return Deferred.fromCoroutine(self._run())

    async def _run(self) -> list[RequestRecord]:
        self.start = self.clock.seconds()
        try:
            if self.requests:
                for i, r in enumerate(self.requests):
                    delay = max(0.0, self.start + r.at - self.clock.seconds())
                    self._calls[i] = self.clock.callLater(delay, self._send, i)
                await self._all
        finally:
            if self._own_pool:
                await self.pool.closeCachedConnections()
        return self.records

    def abort(self) -> None:
        """End the run now: unsent requests are recorded as never sent (``aborted``),
        outstanding ones as timeouts."""
        for i, call in list(self._calls.items()):
            if call.active():
                call.cancel()
                self.records[i].error = "aborted"
                self._finish(i)
        for i in list(self._pending) + list(self._readers):
            self._expire(i)

    # -- one request --------------------------------------------------------------------------

    def _scheduled(self, i: int) -> float:
        assert self.start is not None
        return self.start + self.requests[i].at

    def _send(self, i: int) -> None:
        self._calls.pop(i, None)
        rec = self.records[i]
        now = self.clock.seconds()
        assert self.start is not None
        rec.sent = now - self.start
        rec.lag = now - self._scheduled(i)
        rec.url = self.targets[i] if self.available is None \
            else next_available(self.urls, self.targets[i], self.available)
        self.sent += 1
        self._expiry[i] = self.clock.callLater(
            max(0.0, self._scheduled(i) + self.timeout - now), self._expire, i)
        self._post(i)

    def _post(self, i: int) -> None:
        rec, req = self.records[i], self.requests[i]
        assert rec.url is not None
        headers = Headers({b"content-type": [b"application/json"]})
        extra = req.headers()
        if self.senders is not None:
            extra.update(self.senders[i].headers())
        for name, value in extra.items():
            headers.addRawHeader(name.encode(), value.encode())
        d: Deferred[Any] = self.client.request(
            "POST", rec.url + CHAT_PATH, data=json.dumps(req.body()).encode(), headers=headers,
            unbuffered=True, allow_redirects=False)
        self._pending[i] = d
        d.addCallbacks(self._answered, self._failed, callbackArgs=(i,), errbackArgs=(i,))
        self._changed()

    def _answered(self, response: Any, i: int) -> None:
        self._pending.pop(i, None)
        if self._over[i]:  # answered just as it timed out: drop the connection
            late = StreamReader(self.clock)
            response.deliverBody(late)
            late.cancel()
            return
        rec = self.records[i]
        rec.status = response.code
        rec.engine = _header(response, b"x-pharos-backend") or rec.url
        rec.reason = _header(response, b"x-pharos-reason")
        reader = StreamReader(self.clock)
        self._readers[i] = reader
        response.deliverBody(reader)
        reader.done.addCallback(lambda _: self._ended(i, reader))

    def _failed(self, failure: Failure, i: int) -> None:
        self._pending.pop(i, None)
        if self._over[i]:
            return
        rec = self.records[i]
        if self.available is not None and failure.check(ConnectionRefusedError) \
                and rec.url is not None:
            refused = self._refused.setdefault(i, set())
            refused.add(rec.url)
            available = self.available

            def up(url: str) -> bool:
                return url not in refused and available(url)

            again = next_available(self.urls, rec.url, up)
            if again not in refused:
                rec.url = again
                self._post(i)
                return
        rec.error = classify(failure)
        self._finish(i)

    def _ended(self, i: int, reader: StreamReader) -> None:
        self._readers.pop(i, None)
        if self._over[i]:
            return
        self._measure(i, reader)
        rec = self.records[i]
        if rec.status != 200:
            rec.error = f"http_{rec.status}"
        elif reader.failure is not None:
            rec.error = DISCONNECTED if reader.failure.check(ResponseFailed) else TRUNCATED
        elif reader.stream_error:
            rec.error = STREAM_ERROR
        elif reader.first_token is None:
            rec.error = NO_TOKEN
        elif rec.completion_tokens is not None and rec.completion_tokens > 1 \
                and rec.ttft is not None and rec.e2e is not None:
            rec.tpot = (rec.e2e - rec.ttft) / (rec.completion_tokens - 1)
        self._finish(i)

    def _measure(self, i: int, reader: StreamReader) -> None:
        rec = self.records[i]
        if reader.first_token is not None:
            rec.ttft = reader.first_token - self._scheduled(i)
        if reader.ended is not None:
            rec.e2e = reader.ended - self._scheduled(i)
        if reader.usage is not None:
            rec.prompt_tokens = reader.usage.prompt_tokens
            rec.cached_tokens = reader.usage.cached_tokens
            rec.completion_tokens = reader.usage.completion_tokens

    def _expire(self, i: int) -> None:
        """The request's time is up: record a timeout (with what was measured so far), then
        drop the connection."""
        if self._over[i]:
            return
        reader = self._readers.pop(i, None)
        pending = self._pending.pop(i, None)
        rec = self.records[i]
        rec.error = TIMEOUT
        if reader is not None and reader.first_token is not None:
            rec.ttft = reader.first_token - self._scheduled(i)
        self._finish(i)
        if reader is not None:
            reader.cancel()
        if pending is not None:
            pending.cancel()

    def _finish(self, i: int) -> None:
        self._over[i] = True
        call = self._expiry.pop(i, None)
        if call is not None and call.active():
            call.cancel()
        self.finished += 1
        if self.records[i].error is not None:
            self.errors += 1
        self._changed()
        if self.finished == len(self.requests) and not self._all.called:
            self._all.callback(None)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


def _header(response: Any, name: bytes) -> str | None:
    values = response.headers.getRawHeaders(name)
    return values[0].decode("latin-1") if values else None

