"""The public resource tree: each app routes on the whole path, and the tree in front of them
is plain ``putChild`` children found by a request's first path segment.

::

    /metrics            MetricsPage behind ``MetricsGate`` (open to loopback clients)
    /admin/* /usage     the admin app  } behind ``Authorized``: one admin check for them all
    /status /live/*     the pages      }
    anything else       the data plane (``PublicAPI``), ``/healthz`` included

Without keys nobody can prove who they are, so what changes the fleet or shows its usage
answers loopback clients only (``require_loopback``): the gates here, and the data plane's
model management. A request a reverse proxy passed on (``Forwarded``, ``X-Forwarded-For``,
``X-Real-IP``) is never loopback: the proxy may share the host while its client does not.

Every Klein app of the tree answers errors in the client's shape (``add_error_handling``).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from klein import Klein
from klein._resource import URLDecodeError, extractURLparts
from twisted.internet.address import UNIXAddress
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound

from pharos.proxy import errors
from pharos.proxy.auth import MAX_KEY_CHARS, presented_key, unauthorized
from pharos.proxy.errors import ApiError
from pharos.proxy.live import LiveConfig

log = Logger()

JSON = b"application/json"


def reply(request: Request, status: int, doc: object) -> bytes:
    """``doc`` as the JSON body of a ``status`` reply."""
    request.setResponseCode(status)
    request.setHeader(b"content-type", JSON)
    body = json.dumps(doc).encode()
    request.setHeader(b"content-length", b"%d" % len(body))
    return body


def render_error(request: IRequest, e: ApiError) -> bytes:
    """An error Pharos answers itself, in the shape of the API the path belongs to."""
    request.setResponseCode(e.status)
    for name, value in e.headers:
        request.setHeader(name, value)
    request.setHeader(b"content-type", JSON)
    body = e.body(ollama=errors.is_ollama_path(request.path),
                  anthropic=errors.is_anthropic_path(request.path))
    request.setHeader(b"content-length", b"%d" % len(body))
    return body


def add_error_handling(app: Klein) -> None:
    """Register on ``app`` the handlers every app of the tree shares: ``ApiError`` as is, an
    unknown path 404 and a wrong method 405 (with ``Allow``), a fault of Pharos's own a 500
    without traceback, each in the client's shape."""

    @app.handle_errors(ApiError)
    def api_error(self: Any, request: IRequest, failure: Failure) -> bytes:
        e = failure.value
        assert isinstance(e, ApiError)
        return render_error(request, e)

    @app.handle_errors(NotFound)
    def not_found(self: Any, request: IRequest, failure: Failure) -> bytes:
        path = request.path.decode("latin-1")
        return render_error(request, ApiError(404, f"no route {errors.echo(path)}",
                                              code="not_found"))

    @app.handle_errors(MethodNotAllowed)
    def bad_method(self: Any, request: IRequest, failure: Failure) -> bytes:
        e = failure.value
        assert isinstance(e, HTTPException)
        allowed = e.get_response({}).headers.get("Allow", "")
        request.setHeader(b"allow", allowed.encode())
        method = errors.echo(request.method.decode("latin-1"))
        return render_error(request, ApiError(405, f"method {method} not allowed here",
                                              code="method_not_allowed"))

    @app.handle_errors(Exception)
    def unexpected(self: Any, request: IRequest, failure: Failure) -> bytes:
        log.failure("request to {path} failed", failure, path=request.path[:200])
        return render_error(request, ApiError(500, "internal error in Pharos",
                                              type="server_error", code="pharos_error"))


class ErrorPage(Resource):
    """A refusal the tree answers before any app runs."""

    isLeaf = True

    def __init__(self, error: ApiError) -> None:
        super().__init__()
        self.error = error

    def render(self, request: Request) -> bytes:
        return render_error(request, self.error)


_BAD_URL = ErrorPage(ApiError(400, "the URL is not valid percent-encoded UTF-8",
                              code="bad_request"))


class Mount(Resource):
    """A node whose children are apps routing on the whole path: the segment that chose the
    child is given back to it (a Klein app mounted at ``/`` sees ``/admin/config``, not
    ``/config``); a segment without a child goes to ``default``."""

    def __init__(self, default: IResource, children: Mapping[bytes, IResource]) -> None:
        super().__init__()
        self.default = default
        for name, child in children.items():
            self.putChild(name, child)

    def getChildWithDefault(self, path: bytes, request: IRequest) -> IResource:
        before, after = request.prepath, request.postpath
        assert before is not None and after is not None
        after.insert(0, before.pop())
        return self.children.get(path, self.default)


class PublicRoot(Mount):
    """The top of the public tree: a URL that is not valid percent-encoded UTF-8 is a JSON 400
    here (Klein would answer text and log a traceback); a leaf page (``/metrics``,
    ``/healthz``) answers its own path only, anything below it is the data plane's 404."""

    def getChildWithDefault(self, path: bytes, request: IRequest) -> IResource:
        child = super().getChildWithDefault(path, request)
        if child.isLeaf and len(request.postpath or ()) > 1:
            child = self.default
        try:
            extractURLparts(request)
        except URLDecodeError:
            return _BAD_URL
        return child


class Authorized(Mount):
    """The admin part of the tree (``/admin/*``, ``/usage``, the pages): one check before any
    of its apps runs: an admin key once keys are configured, a loopback client without."""

    def __init__(self, live: LiveConfig, default: IResource,
                 children: Mapping[bytes, IResource]) -> None:
        super().__init__(default, children)
        self.live = live

    def getChildWithDefault(self, path: bytes, request: IRequest) -> IResource:
        try:
            keyring = self.live.now.keyring
            if keyring.open:
                require_loopback(request)
            elif not keyring.identify(request).admin:
                raise errors.admin_only()
        except ApiError as e:
            return ErrorPage(e)
        return super().getChildWithDefault(path, request)


#: Headers a reverse proxy adds: the request's peer is then the proxy, not the client.
FORWARDED = (b"forwarded", b"x-forwarded-for", b"x-real-ip")


def is_loopback(request: IRequest) -> bool:
    """Whether the client is this host: a loopback peer (``127.0.0.0/8``, ``::1``, IPv4-mapped
    loopback) or a UNIX socket's, and no header saying a proxy passed the request on."""
    headers = request.requestHeaders
    if any(headers.hasHeader(name) for name in FORWARDED):
        return False
    peer = request.getClientAddress()
    if isinstance(peer, UNIXAddress):
        return True
    host = getattr(peer, "host", None)
    if not isinstance(host, str):
        return False
    try:
        ip = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


class Refusals:
    """The log of loopback-only refusals: a line per client address per ``every`` seconds
    (a scanner must not flood the log), with the method and path, never a body."""

    #: Addresses remembered at most; past it the memory starts over.
    MAX_CLIENTS = 4096

    def __init__(self, every: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self.last: dict[str, float] = {}

    def note(self, request: IRequest, why: str) -> None:
        peer = request.getClientAddress()
        client = str(getattr(peer, "host", None) or peer)
        now = self.clock()
        seen = self.last.get(client)
        if seen is not None and now - seen < self.every:
            return
        if len(self.last) >= self.MAX_CLIENTS:
            self.last.clear()
        self.last[client] = now
        log.warn("refused {method} {path} from {client} (403): {why}; configure keys to "
                 "open it to other hosts (docs: Security)",
                 method=request.method.decode("latin-1")[:16],
                 path=request.path.decode("latin-1")[:200], client=client, why=why)


REFUSALS = Refusals()


def require_loopback(request: IRequest) -> None:
    """Raise the 403 ``loopback_only`` (logged) unless the client is this host: a route
    that changes the fleet, without keys."""
    if not is_loopback(request):
        forwarded = any(request.requestHeaders.hasHeader(name) for name in FORWARDED)
        REFUSALS.note(request, "no keys are configured and the client is not loopback" +
                      (" (the request was forwarded by a proxy)" if forwarded else ""))
        raise errors.loopback_only()


class MetricsGate(Resource):
    """``/metrics`` for loopback clients as is; from other hosts it needs the token of
    ``observability.metrics_key`` or an admin key (its labels carry key names). Without
    either configured it answers loopback clients only."""

    isLeaf = True

    def __init__(self, live: LiveConfig, page: IResource) -> None:
        super().__init__()
        self.live = live
        self.page = page

    def render(self, request: Request) -> Any:
        if not is_loopback(request):
            try:
                self.check(request)
            except ApiError as e:
                return render_error(request, e)
        return self.page.render(request)

    def check(self, request: IRequest) -> None:
        """Raise the refusal of a client from another host, if it is refused."""
        now = self.live.now
        wanted = now.config.observability.metrics_key
        if wanted is not None:
            presented = presented_key(request)
            if presented is not None and len(presented) <= MAX_KEY_CHARS and (
                    hmac.compare_digest(hashlib.sha256(presented).hexdigest().encode(),
                                        wanted.encode())):
                return
        if now.keyring.open:
            if wanted is None:
                require_loopback(request)
            raise unauthorized("/metrics needs the token of observability.metrics_key: send "
                               "Authorization: Bearer TOKEN")
        if not now.keyring.identify(request).admin:
            raise errors.admin_only()
