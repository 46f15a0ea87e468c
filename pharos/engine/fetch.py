"""Feeds for probes: one HTTP GET per path, from a live backend or from a recorded capture.

A fetch either yields the whole body (bounded) with its status, or fails with ``FetchError``
(refused, timed out, too large). Probes never see a partial body.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from treq.client import HTTPClient
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol as TxProtocol
from twisted.python.failure import Failure
from twisted.web.client import HTTPConnectionPool, ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from pharos.engine.agent import EngineAgent, NoCookies
from pharos.engine.capture import Capture

#: A metrics page or status body larger than this is an error for that probe and round.
MAX_BODY_BYTES = 4 * 1024 * 1024
#: Scrape rounds run every second; a fetch must give up before the next one.
DEFAULT_TIMEOUT = 0.8


@dataclass(frozen=True, slots=True)
class Fetched:
    """One answered GET."""

    status: int
    content_type: str
    body: bytes


class FetchError(Exception):
    """The backend gave no usable answer for a path (refused, timed out, body too large)."""


class Fetcher(Protocol):
    """Where probes read their HTTP feeds from."""

    def fetch(self, path: str) -> Deferred[Fetched]:
        """GET ``path``; errback with ``FetchError`` when there is no answer."""
        ...


class CaptureFetcher:
    """Serves a recorded capture directory as if it were the backend (layer 2, doctor demo)."""

    def __init__(self, capture: Capture) -> None:
        self.capture = capture

    @classmethod
    def from_dir(cls, directory: str | Path) -> CaptureFetcher:
        """Load a capture directory once; fetches then never touch the disk."""
        return cls(Capture.load(Path(directory)))

    def fetch(self, path: str) -> Deferred[Fetched]:
        """The recorded answer for ``path``; a path the capture never asked is a fetch error."""
        rec = self.capture.paths.get(path)
        if rec is None:
            return fail(FetchError(f"{path}: not in the capture"))
        if rec.status == 0:  # the recording got no answer: the body says why
            return fail(FetchError(rec.body.decode("utf-8", "replace")))
        return succeed(Fetched(rec.status, rec.content_type, rec.body))


_DONE = Failure(ResponseDone())


class _BoundedBody(TxProtocol):
    """Collects a response body, giving up once it passes the size limit."""

    def __init__(self, done: Deferred[bytes], limit: int) -> None:
        self._done = done
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0

    def dataReceived(self, data: bytes) -> None:
        if self._done.called:
            return
        self._size += len(data)
        if self._size > self._limit:
            self._done.errback(FetchError(f"body larger than {self._limit} bytes"))
            _stop(self.transport)
            return
        self._parts.append(data)

    def connectionLost(self, reason: Failure = _DONE) -> None:
        if self._done.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            self._done.callback(b"".join(self._parts))
        else:
            self._done.errback(FetchError(f"body cut: {reason.getErrorMessage()}"))


#: Seconds past its deadline a timeout must fire to count as late (the reactor was busy).
LATE_DEADLINE = 0.05


class HTTPFetcher:
    """GETs paths of one backend with treq, bounded in size and time; the client (one pool
    for the process) keeps no cookies and follows no redirects."""

    def __init__(
        self,
        base_url: str,
        client: HTTPClient,
        clock: IReactorTime,
        timeout: float = DEFAULT_TIMEOUT,
        limit: int = MAX_BODY_BYTES,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._client = client
        self._clock = clock
        self._timeout = timeout
        self._limit = limit

    def fetch(self, path: str) -> Deferred[Fetched]:
        """GET one path; every failure, including the timeout, becomes ``FetchError``."""
        return self._bounded(Deferred.fromCoroutine(self._get(path)), self._timeout)

    def post(self, path: str, body: bytes, timeout: float | None = None) -> Deferred[Fetched]:
        """POST a JSON body and collect the whole reply (doctor's route checks, recording)."""
        return self._bounded(Deferred.fromCoroutine(self._get(path, body)),
                             timeout or self._timeout)

    def _bounded(self, d: Deferred[Fetched], timeout: float) -> Deferred[Fetched]:
        """Cancel ``d`` after ``timeout`` (headers and body alike) and name every failure. A
        deadline that fires late (a burst of clients held the reactor) first gives the reply
        as long again as it was late, once: its bytes may be sitting unread, and the timeout
        measures the engine, not Pharos's own reactor."""
        timed_out: list[bool] = []
        deadline = self._clock.seconds() + timeout
        extended: list[bool] = []

        def expire() -> None:
            late = self._clock.seconds() - deadline
            if late > LATE_DEADLINE and not extended:
                extended.append(True)
                calls[0] = self._clock.callLater(min(late, timeout), expire)
                return
            timed_out.append(True)
            d.cancel()

        calls = [self._clock.callLater(timeout, expire)]

        def settle(result: object) -> object:
            call = calls[0]
            if call.active():
                call.cancel()
            if isinstance(result, Failure) and not result.check(FetchError):
                if timed_out:
                    return Failure(FetchError(f"no answer within {timeout:g} s"))
                e = result.value
                msg = str(e).strip()
                return Failure(FetchError(f"{type(e).__name__}: {msg}" if msg else
                                          type(e).__name__))
            return result

        d.addBoth(settle)
        return d

    async def _get(self, path: str, body: bytes | None = None) -> Fetched:
        url = (self._base + path).encode("ascii")
        if body is None:
            response: IResponse = await self._client.request(
                "GET", url, unbuffered=True, allow_redirects=False
            )
        else:
            response = await self._client.request(
                "POST",
                url,
                data=body,
                headers=Headers({b"content-type": [b"application/json"]}),
                unbuffered=True,
                allow_redirects=False,
            )
        protocol: _BoundedBody

        def stop(_: object) -> None:
            _stop(protocol.transport)

        body_done: Deferred[bytes] = Deferred(stop)
        protocol = _BoundedBody(body_done, self._limit)
        response.deliverBody(protocol)
        body = await body_done
        ctype = response.headers.getRawHeaders(b"content-type", [b""])[0]
        return Fetched(response.code, ctype.decode("latin-1"), body)


def _stop(transport: object) -> None:
    """Stop reading a response body (its transport has no abortConnection)."""
    stop = getattr(transport, "stopProducing", None)
    if stop is not None:
        stop()


def make_client(reactor: IReactorTime, pool: HTTPConnectionPool | None = None) -> HTTPClient:
    """A treq client that keeps no cookies: nothing an engine sets reaches another request.
    Beneath it ``EngineAgent`` (``Agent`` with each URL's parse and endpoint made once)."""
    if pool is None:
        pool = HTTPConnectionPool(reactor, persistent=True)
    return HTTPClient(EngineAgent(reactor, pool=pool), cookiejar=NoCookies())
