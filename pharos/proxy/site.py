"""The public resource tree: each app routes on the whole path, and the tree in front of them
is plain ``putChild`` children found by a request's first path segment.

::

    /metrics            MetricsPage (no key)
    /admin/* /usage     the admin app  } behind ``Authorized``: one admin check for them all
    /status /live/*     the pages      }
    anything else       the data plane (``PublicAPI``), ``/healthz`` included

Every Klein app of the tree answers errors in the client's shape (``add_error_handling``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from klein import Klein
from klein._resource import URLDecodeError, extractURLparts
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound

from pharos.proxy import errors
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
    """The admin part of the tree (``/admin/*``, ``/usage``, the pages): one check, an admin
    key once keys are configured (open without keys), before any of its apps runs."""

    def __init__(self, live: LiveConfig, default: IResource,
                 children: Mapping[bytes, IResource]) -> None:
        super().__init__(default, children)
        self.live = live

    def getChildWithDefault(self, path: bytes, request: IRequest) -> IResource:
        try:
            if not self.live.now.keyring.identify(request).admin:
                raise errors.admin_only()
        except ApiError as e:
            return ErrorPage(e)
        return super().getChildWithDefault(path, request)
