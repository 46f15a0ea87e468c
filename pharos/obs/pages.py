"""The operator's pages, ``/status``, ``/live``, ``/live/map.js`` and ``/live/events``, as their own
Klein app, mounted behind the public tree's admin check (open without keys)."""

from __future__ import annotations

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.web.server import Request

from pharos.obs.live import SCRIPT, SCRIPT_PATH, LiveMap
from pharos.obs.status import StatusPage
from pharos.proxy.site import add_error_handling

HTML = b"text/html; charset=utf-8"


class Pages:
    """The pages' routes."""

    app = Klein()
    add_error_handling(app)

    def __init__(self, status: StatusPage, live: LiveMap) -> None:
        self.status_page = status
        self.live = live

    @app.route("/status", methods=["GET"])
    def status(self, request: Request) -> Deferred[bytes]:
        """The status page."""
        request.setHeader(b"content-type", HTML)
        request.setHeader(b"cache-control", b"no-store")
        return self.status_page.render()

    @app.route("/live", methods=["GET"])
    def live_page(self, request: Request) -> Deferred[bytes]:
        """The live map's page."""
        request.setHeader(b"content-type", HTML)
        return self.live.page()

    @app.route(SCRIPT_PATH, methods=["GET"])
    def live_script(self, request: Request) -> bytes:
        """The live map's script (static; no prompt, no state)."""
        request.setHeader(b"content-type", b"text/javascript; charset=utf-8")
        return SCRIPT.encode()

    @app.route("/live/events", methods=["GET"])
    def live_events(self, request: Request) -> Deferred[None] | bytes:
        """The live map's event stream."""
        return self.live.add(request)
