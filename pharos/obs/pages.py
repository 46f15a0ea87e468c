"""The operator's pages, ``/status``, ``/live``, ``/live/map.js`` and ``/live/events``, as
their own Klein app behind the public API's admin check (open when no keys are configured),
and ``mount``, which builds them for a running ``PharosService`` (subscribing to its finished
requests) and ``with_pages``, which puts them in front of the public resource.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request

from pharos.obs.live import SCRIPT, SCRIPT_PATH, LiveMap, hook
from pharos.obs.status import RecentRequests, StatusPage
from pharos.proxy.errors import ApiError

if TYPE_CHECKING:
    from pharos.proxy.public import PublicAPI
    from pharos.tap import PharosService

#: The paths the pages answer; everything else goes to the public API.
PATHS = frozenset({b"/status", b"/live", SCRIPT_PATH.encode(), b"/live/events"})
HTML = b"text/html; charset=utf-8"


class Pages:
    """The pages' routes; ``admin(request)`` raises an ``ApiError`` for a caller who may not
    read them, ``error(request, e)`` renders one in the public API's shape."""

    app = Klein()

    def __init__(self, status: StatusPage, live: LiveMap, admin: Any, error: Any) -> None:
        self.status_page = status
        self.live = live
        self.admin = admin
        self.error = error

    @app.handle_errors(ApiError)
    def api_error(self, request: IRequest, failure: Failure) -> bytes:
        """401/403 from the admin check, in the public API's JSON shape."""
        e = failure.value
        assert isinstance(e, ApiError)
        body: bytes = self.error(request, e)
        return body

    @app.route("/status", methods=["GET"])
    def status(self, request: Request) -> Deferred[bytes]:
        """The status page."""
        self.admin(request)
        request.setHeader(b"content-type", HTML)
        request.setHeader(b"cache-control", b"no-store")
        return self.status_page.render()

    @app.route("/live", methods=["GET"])
    def live_page(self, request: Request) -> Deferred[bytes]:
        """The live map's page."""
        self.admin(request)
        request.setHeader(b"content-type", HTML)
        return self.live.page()

    @app.route(SCRIPT_PATH, methods=["GET"])
    def live_script(self, request: Request) -> bytes:
        """The live map's script (static; no prompt, no state)."""
        self.admin(request)
        request.setHeader(b"content-type", b"text/javascript; charset=utf-8")
        return SCRIPT.encode()

    @app.route("/live/events", methods=["GET"])
    def live_events(self, request: Request) -> Deferred[None] | bytes:
        """The live map's event stream."""
        self.admin(request)
        return self.live.add(request)


class WithPages(Resource):
    """A leaf resource: the pages' paths to ``pages``, every other path to ``public``."""

    isLeaf = True

    def __init__(self, public: IResource, pages: IResource) -> None:
        super().__init__()
        self.public = public
        self.pages = pages

    def render(self, request: Request) -> Any:
        inner = self.pages if request.path in PATHS else self.public
        return inner.render(request)


def mount(public: PublicAPI, service: PharosService) -> Pages:
    """Build the pages for ``service``: the recent-requests ring and the live map subscribe
    to ``public.on_done``, the live map's lifecycle hooks are attached, and the live map joins
    the service tree (stopping it closes the streams)."""
    recent = RecentRequests()
    live = LiveMap(service.state, service.state.clock)
    public.on_done.append(recent)
    public.on_done.append(live.on_done)
    hook(live, service.sched, public)
    live.setServiceParent(service)
    status = StatusPage(service.state, service.sched, public.ledger, recent)
    return Pages(status, live, public._admin, public._error)


def with_pages(public_resource: IResource, pages: Pages) -> Resource:
    """The public resource with the pages in front of it."""
    return WithPages(public_resource, pages.app.resource())
