"""The engine leg's HTTP client pieces: what treq's ``HTTPClient`` sits on.

``EngineAgent`` is Twisted's ``Agent`` with each URL's parse, endpoint and ``Host`` value made
once (``Agent`` redoes them, IDNA included, on every request; engine URLs are few and fixed).
Pooling, backpressure and cancellation are ``Agent``'s own; a kept ``HostnameEndpoint``
still resolves its name at each new connection, so it follows DNS.

``NoCookies`` keeps and adds nothing: nothing an engine sets reaches another request, without
the standard library's per-request cookie matching and ``Set-Cookie`` parsing.
"""

from __future__ import annotations

from collections.abc import Iterator
from http.cookiejar import Cookie
from typing import Any

from treq.cookies import IndexableCookieJar
from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IReactorTime, IStreamClientEndpoint
from twisted.web.client import URI, Agent, HTTPConnectionPool, _ensureValidURI
from twisted.web.error import SchemeNotSupported
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer, IResponse

#: Parsed URLs kept (engine URLs are a handful per backend; a flood of others only refills).
MAX_URLS = 4096

_Parsed = tuple[URI, IStreamClientEndpoint, tuple[bytes, bytes, int], bytes]


class EngineAgent(Agent):
    """``Agent`` with each URL parsed, its endpoint built and its ``Host`` value formatted
    once (see the module docstring)."""

    def __init__(self, reactor: IReactorTime, pool: HTTPConnectionPool | None = None) -> None:
        super().__init__(reactor, pool=pool)
        self._urls: dict[bytes, _Parsed] = {}
        self._endpoints: dict[tuple[bytes, bytes, int], IStreamClientEndpoint] = {}

    def _parsed(self, uri: bytes) -> _Parsed:
        hit = self._urls.get(uri)
        if hit is None:
            parsed = URI.fromBytes(_ensureValidURI(uri.strip()))
            key = (parsed.scheme, parsed.host, parsed.port)
            endpoint = self._endpoints.get(key)
            if endpoint is None:
                endpoint = self._getEndpoint(parsed)  # SchemeNotSupported: not kept
                if len(self._endpoints) >= MAX_URLS:
                    self._endpoints.clear()
                self._endpoints[key] = endpoint
            host = self._computeHostValue(parsed.scheme, parsed.host, parsed.port)
            hit = (parsed, endpoint, key, host)
            if len(self._urls) >= MAX_URLS:
                self._urls.clear()
            self._urls[uri] = hit
        return hit

    def request(self, method: bytes, uri: bytes, headers: Headers | None = None,
                bodyProducer: IBodyProducer | None = None  # noqa: N803 (IAgent's name)
                ) -> Deferred[IResponse]:
        try:
            parsed, endpoint, key, host = self._parsed(uri)
        except SchemeNotSupported:
            return fail()
        if headers is None:
            headers = Headers()
        if not headers.hasHeader(b"host"):
            headers = headers.copy()
            headers.addRawHeader(b"host", host)
        return self._requestWithEndpoint(key, endpoint, method, parsed, headers, bodyProducer,
                                         parsed.originForm)


class NoCookies(IndexableCookieJar):
    """A cookie jar that never holds a cookie (see the module docstring)."""

    def set_cookie(self, cookie: Cookie) -> None:
        """Dropped."""

    def add_cookie_header(self, request: Any) -> None:
        """Nothing to add."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        """Nothing kept."""

    def __iter__(self) -> Iterator[Cookie]:
        return iter(())

    def __len__(self) -> int:
        return 0


#: Passed as each engine request's ``cookies`` so treq builds no jar per request.
NO_COOKIES = NoCookies()
