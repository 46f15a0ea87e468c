"""The peer site: a separate Klein site on ``peers.listen``, for a private network.

``POST /peer/delta`` merges a peer's delta; ``GET /peer/snapshot`` serves this instance's
snapshot as ``application/gzip``, so no client decodes it on the way. Both need the shared
secret as a bearer token, compared in constant time. Every reply, errors and 404s included,
carries ``Pharos-Origin``, so a member that is this instance is recognised and skipped.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any, Final

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request, Site

from pharos.peer.node import ORIGIN_HEADER, PeerNode
from pharos.proxy.body import bounded_request_factory

log = Logger()

#: The largest delta body accepted (a full pending list of long chains fits well within).
MAX_DELTA_BYTES: Final = 64 * 1024 * 1024


def authorized(header: bytes | None, secret: bytes) -> bool:
    """``Authorization: Bearer <secret>``, compared in constant time."""
    return header is not None and hmac.compare_digest(header, b"Bearer " + secret)


class PeerAPI:
    """The peer routes over one ``PeerNode``; ``snapshot`` builds this instance's snapshot
    bytes (``pharos.peer.snapshot.build``)."""

    app = Klein()

    def __init__(self, node: PeerNode, secret: bytes,
                 snapshot: Callable[[], Deferred[bytes]] | None) -> None:
        self.node = node
        self.secret = secret
        self.snapshot = snapshot

    def _refuse(self, request: Request) -> bytes | None:
        if authorized(request.getHeader(b"authorization"), self.secret):
            return None
        request.setResponseCode(401)
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        request.setHeader(b"www-authenticate", b'Bearer realm="pharos-peers"')
        return b"peer secret required\n"

    @app.route("/peer/delta", methods=["POST"])
    def delta(self, request: Request) -> bytes:
        refused = self._refuse(request)
        if refused is not None:
            return refused
        assert request.content is not None
        code, body = self.node.receive_bytes(request.content.read())
        request.setResponseCode(code)
        request.setHeader(b"content-type", b"application/json" if code == 200
                          else b"text/plain; charset=utf-8")
        return body

    @app.route("/peer/snapshot", methods=["GET"])
    async def get_snapshot(self, request: Request) -> bytes:
        refused = self._refuse(request)
        if refused is not None:
            return refused
        if self.snapshot is None:
            request.setResponseCode(503)
            return b"snapshots are not available\n"
        data = await self.snapshot()
        request.setHeader(b"content-type", b"application/gzip")
        return data


class WithOrigin(Resource):
    """Puts ``Pharos-Origin`` on every reply of the wrapped resource."""

    isLeaf = True

    def __init__(self, inner: IResource, origin: str) -> None:
        super().__init__()
        self.inner = inner
        self.origin = origin.encode()

    def render(self, request: Request) -> Any:
        request.setHeader(ORIGIN_HEADER.encode(), self.origin)
        return self.inner.render(request)


def peer_site(node: PeerNode, secret: bytes,
              snapshot: Callable[[], Deferred[bytes]] | None,
              wrap: Callable[[IResource], IResource] | None = None) -> Site:
    """The peer site: bounded bodies, the origin header on every reply; ``wrap`` adds to the
    peer API (a worker's own metrics)."""
    api: IResource = PeerAPI(node, secret, snapshot).app.resource()
    site = Site(WithOrigin(wrap(api) if wrap is not None else api, node.origin),
                requestFactory=bounded_request_factory(MAX_DELTA_BYTES))
    site.noisy = False
    return site
