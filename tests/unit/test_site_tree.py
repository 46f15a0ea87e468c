"""The public resource tree (``pharos.proxy.site``) over treq's ``StubTreq``: no socket, a real
Agent and Site in memory. Each first path segment reaches its child, an app below a child
still sees the whole path, the admin part answers only an admin key once keys are
configured, a leaf page answers its own path only, and a URL that is not UTF-8 is a JSON 400."""

from __future__ import annotations

import json
from typing import Any

from klein import Klein
from treq.testing import StubTreq
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource
from twisted.web.server import Request

from pharos.config import Key
from pharos.models import Fleet
from pharos.proxy.auth import Keyring, digest
from pharos.proxy.live import Live, LiveConfig
from pharos.proxy.site import Authorized, PublicRoot, add_error_handling

ADMIN, USER = "phk-admin", "phk-user"


class App:
    """A Klein app routing on whole paths, as the data plane and the admin app do."""

    app = Klein()
    add_error_handling(app)

    def __init__(self, name: str) -> None:
        self.name = name

    @app.route("/v1/models")
    @app.route("/admin/config")
    @app.route("/usage")
    def seen(self, request: Request) -> bytes:
        return f"{self.name} {request.path.decode()}".encode()


class Page(Resource):
    """A leaf page, as ``/metrics`` is."""

    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        return b"metrics"


def stub(keys: tuple[Key, ...] = ()) -> StubTreq:
    live = LiveConfig(Live(keyring=Keyring(keys), fleet=Fleet()))
    admin = App("admin").app.resource()
    gate = Authorized(live, admin, {})
    root = PublicRoot(App("data").app.resource(), {
        b"metrics": Page(), b"admin": gate, b"usage": gate})
    return StubTreq(root)


def get(stubbed: StubTreq, path: str, key: str | None = None) -> tuple[int, bytes]:
    client: Any = stubbed  # StubTreq's request methods are made at run time
    headers = Headers({b"authorization": [f"Bearer {key}".encode()]} if key else {})
    d = client.get("http://pharos" + path, headers=headers)
    client.flush()
    response: Any = d.result
    body = client.content(response)
    client.flush()
    return response.code, body.result


def test_each_segment_reaches_its_child_and_the_app_sees_the_whole_path() -> None:
    """``/admin/...`` and ``/usage`` go to the admin app, everything else to the data plane,
    each routing on the path as the client sent it."""
    client = stub()
    assert get(client, "/v1/models") == (200, b"data /v1/models")
    assert get(client, "/admin/config") == (200, b"admin /admin/config")
    assert get(client, "/usage") == (200, b"admin /usage")
    assert get(client, "/metrics") == (200, b"metrics")


def test_the_admin_part_needs_an_admin_key_once_keys_are_configured() -> None:
    """With keys: no key is 401, a user key 403, an admin key passes; the data plane is not
    behind the admin check."""
    client = stub((Key(name="ops", sha256=digest(ADMIN), admin=True),
                   Key(name="u", sha256=digest(USER))))
    code, body = get(client, "/admin/config")
    assert code == 401, body
    code, body = get(client, "/admin/config", USER)
    assert code == 403 and json.loads(body)["error"]["code"] == "admin_required"
    assert get(client, "/admin/config", ADMIN) == (200, b"admin /admin/config")
    assert get(client, "/v1/models", USER) == (200, b"data /v1/models")


def test_a_leaf_page_answers_its_own_path_only() -> None:
    """``/metrics/anything`` is the data plane's 404 in the client's shape, not the page."""
    code, body = get(stub(), "/metrics/anything")
    assert code == 404
    assert json.loads(body)["error"]["code"] == "not_found"


def test_a_url_that_is_not_utf8_is_a_json_400() -> None:
    """A percent-encoded byte that is not UTF-8 is refused at the root, as JSON."""
    code, body = get(stub(), "/v1/%ff")
    assert code == 400
    assert json.loads(body)["error"]["code"] == "bad_request"
