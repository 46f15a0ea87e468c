"""Safe defaults of the public tree (``pharos.proxy.site``), over treq's ``StubTreq`` and
``DummyRequest``: no socket, no traffic; a client on another host is only the peer address the
request object carries (``10.0.0.7``). Without keys the admin part answers loopback clients
only, a forwarded request is never loopback, ``/metrics`` follows ``metrics_key``, refusals
are logged once per client and minute, and the default ``listen`` is loopback."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from klein import Klein
from treq.testing import StubTreq
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.logger import capturedLogs
from twisted.web.http_headers import Headers
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request
from twisted.web.test.requesthelper import DummyRequest

from pharos.config import (
    Config,
    ConfigError,
    Key,
    Listen,
    Observability,
    exposure_warning,
    parse_config,
)
from pharos.models import Fleet
from pharos.proxy import site
from pharos.proxy.auth import Keyring, digest
from pharos.proxy.live import Live, LiveConfig
from pharos.proxy.site import (
    Authorized,
    MetricsGate,
    PublicRoot,
    Refusals,
    add_error_handling,
    is_loopback,
)

ADMIN, USER, TOKEN = "phk-admin", "phk-user", "phk-prometheus"
KEYS = (Key(name="ops", sha256=digest(ADMIN), admin=True), Key(name="u", sha256=digest(USER)))
REMOTE = IPv4Address("TCP", "10.0.0.7", 5555)
LOOPBACK = IPv4Address("TCP", "127.0.0.1", 5555)


class App:
    """A Klein app routing on whole paths; ``patched`` records a PATCH that got through."""

    app = Klein()
    add_error_handling(app)

    def __init__(self, name: str) -> None:
        self.name = name
        self.patched: list[bytes] = []

    @app.route("/v1/models")
    @app.route("/admin/config", methods=["GET"])
    @app.route("/usage")
    @app.route("/status")
    def seen(self, request: Request) -> bytes:
        return f"{self.name} {request.path.decode()}".encode()

    @app.route("/admin/config", methods=["PATCH"])
    def patch(self, request: Request) -> bytes:
        assert request.content is not None
        self.patched.append(request.content.read())
        return b"patched"


class Page(Resource):
    """A leaf page, as ``/metrics`` is."""

    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        return b"metrics"


class FromPeer(Resource):
    """The root as a client at ``peer`` reaches it: the request's peer address replaced."""

    def __init__(self, inner: IResource, peer: Any) -> None:
        super().__init__()
        self.inner = inner
        self.peer = peer

    def getChildWithDefault(self, path: bytes, request: IRequest) -> IResource:
        request.client = self.peer  # type: ignore[attr-defined]
        return self.inner.getChildWithDefault(path, request)


def tree(keys: tuple[Key, ...] = (), metrics_key: str | None = None,
         peer: Any = REMOTE) -> tuple[StubTreq, App]:
    """The tree of ``public_site`` with stand-in apps, reached from ``peer``."""
    config = Config(keys=keys, observability=Observability(metrics_key=metrics_key))
    live = LiveConfig(Live(config=config, keyring=Keyring(keys), fleet=Fleet()))
    admin = App("admin")
    gate = Authorized(live, admin.app.resource(), {})
    root = PublicRoot(App("data").app.resource(), {
        b"metrics": MetricsGate(live, Page()), b"admin": gate, b"usage": gate,
        b"status": gate})
    return StubTreq(FromPeer(root, peer)), admin


def call(stubbed: StubTreq, method: str, path: str, key: str | None = None,
         headers: dict[bytes, bytes] | None = None, body: bytes = b"") -> tuple[int, bytes]:
    client: Any = stubbed  # StubTreq's request methods are made at run time
    h = Headers({name: [value] for name, value in (headers or {}).items()})
    if key:
        h.setRawHeaders(b"authorization", [f"Bearer {key}".encode()])
    d = client.request(method, "http://pharos" + path, headers=h, data=body or None)
    client.flush()
    response: Any = d.result
    content = client.content(response)
    client.flush()
    return response.code, content.result


def refused(code: int, body: bytes) -> bool:
    """A 403 ``loopback_only`` in OpenAI's shape, its message saying what to do."""
    doc = json.loads(body)["error"]
    return code == 403 and doc["code"] == "loopback_only" and (
        "configure keys" in doc["message"] and doc["type"] == "permission_error")


@pytest.mark.parametrize("path", ["/admin/config", "/usage", "/status"])
def test_without_keys_the_admin_part_refuses_another_host(path: str) -> None:
    """From 10.0.0.7 without keys: 403 ``loopback_only`` on the admin routes, ``/usage`` and
    the pages; the data plane stays open."""
    client, _ = tree()
    assert refused(*call(client, "GET", path))
    assert call(client, "GET", "/v1/models") == (200, b"data /v1/models")


def test_a_refused_patch_changes_nothing() -> None:
    """``PATCH /admin/config`` from another host without keys is refused before the admin
    app runs: the patch never reaches it."""
    client, admin = tree()
    assert refused(*call(client, "PATCH", "/admin/config", body=b'{"policy": "p2c"}'))
    assert admin.patched == []


@pytest.mark.parametrize("peer", [LOOPBACK, IPv4Address("TCP", "127.3.2.1", 1),
                                  IPv6Address("TCP", "::1", 1),
                                  IPv6Address("TCP", "::ffff:127.0.0.1", 1),
                                  UNIXAddress(b"/run/pharos.sock")])
def test_without_keys_loopback_clients_pass(peer: Any) -> None:
    """127.0.0.0/8, ::1, IPv4-mapped loopback and a UNIX socket's peer reach the admin app
    without a key, and a patch gets through."""
    client, admin = tree(peer=peer)
    assert call(client, "GET", "/admin/config") == (200, b"admin /admin/config")
    assert call(client, "PATCH", "/admin/config", body=b"{}") == (200, b"patched")
    assert admin.patched == [b"{}"]


@pytest.mark.parametrize("header", [b"forwarded", b"x-forwarded-for", b"x-real-ip"])
def test_a_forwarded_request_is_not_loopback(header: bytes) -> None:
    """A request from 127.0.0.1 that a proxy passed on (its client anywhere) is refused."""
    client, admin = tree(peer=LOOPBACK)
    code, body = call(client, "PATCH", "/admin/config", headers={header: b"203.0.113.9"},
                      body=b"{}")
    assert refused(code, body)
    assert admin.patched == []


@pytest.mark.parametrize("host", ["10.0.0.7", "192.168.1.2", "::ffff:10.0.0.7", "fe80::1",
                                  "0.0.0.0", "not-an-address"])
def test_other_addresses_are_not_loopback(host: str) -> None:
    """Private, link-local, mapped non-loopback, unspecified and unparsable peers are not."""
    request: Any = DummyRequest([b""])
    request.client = (IPv6Address if ":" in host else IPv4Address)("TCP", host, 1)
    assert not is_loopback(request)


def test_with_keys_the_admin_part_is_as_before_from_any_host() -> None:
    """With keys the loopback rule plays no part: from another host an admin key passes, a
    user key is 403 ``admin_required``, no key 401; from loopback too a key is needed."""
    client, _ = tree(KEYS)
    assert call(client, "GET", "/admin/config", ADMIN) == (200, b"admin /admin/config")
    code, body = call(client, "GET", "/admin/config", USER)
    assert code == 403 and json.loads(body)["error"]["code"] == "admin_required"
    assert call(client, "GET", "/admin/config")[0] == 401
    local, _ = tree(KEYS, peer=LOOPBACK)
    assert call(local, "GET", "/admin/config")[0] == 401


def test_metrics_is_open_to_loopback_clients() -> None:
    """Prometheus on the same host needs no key, with or without keys and ``metrics_key``."""
    for keys in ((), KEYS):
        for metrics_key in (None, digest(TOKEN)):
            client, _ = tree(keys, metrics_key, peer=LOOPBACK)
            assert call(client, "GET", "/metrics") == (200, b"metrics")


def test_metrics_from_another_host_without_keys() -> None:
    """Without keys and without ``metrics_key``: 403 ``loopback_only``; with ``metrics_key``:
    its token passes, none or another is 401."""
    client, _ = tree()
    assert refused(*call(client, "GET", "/metrics", TOKEN))
    client, _ = tree(metrics_key=digest(TOKEN))
    assert call(client, "GET", "/metrics", TOKEN) == (200, b"metrics")
    assert call(client, "GET", "/metrics")[0] == 401
    assert call(client, "GET", "/metrics", "phk-guess")[0] == 401


def test_metrics_from_another_host_with_keys() -> None:
    """With keys: an admin key passes, a user key is 403 ``admin_required``, no key 401; the
    ``metrics_key`` token passes when it is set, and is an unknown key when it is not."""
    client, _ = tree(KEYS)
    assert call(client, "GET", "/metrics", ADMIN) == (200, b"metrics")
    code, body = call(client, "GET", "/metrics", USER)
    assert code == 403 and json.loads(body)["error"]["code"] == "admin_required"
    assert call(client, "GET", "/metrics")[0] == 401
    assert call(client, "GET", "/metrics", TOKEN)[0] == 401
    client, _ = tree(KEYS, digest(TOKEN))
    assert call(client, "GET", "/metrics", TOKEN) == (200, b"metrics")
    assert call(client, "GET", "/metrics", ADMIN) == (200, b"metrics")


def test_refusals_are_logged_once_per_client_and_minute(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The log says who was refused, where and why: one line per client address a minute,
    with the path and never the body."""
    now = [1000.0]
    monkeypatch.setattr(site, "REFUSALS", Refusals(clock=lambda: now[0]))
    with capturedLogs() as events:
        client, _ = tree()
        for _ in range(3):
            call(client, "PATCH", "/admin/config", body=b'{"secret prompt": 1}')
        now[0] += 61
        call(client, "GET", "/usage")
    lines = [e for e in events if e.get("log_namespace") == "pharos.proxy.site"]
    assert [(e["path"], e["client"]) for e in lines] == [("/admin/config", "10.0.0.7"),
                                                         ("/usage", "10.0.0.7")]
    assert "no keys are configured" in lines[0]["why"]
    assert "secret prompt" not in repr(lines)


def test_the_default_listen_is_loopback() -> None:
    """An empty config listens on 127.0.0.1:8090; every interface must be asked for."""
    assert Config().listen == Listen("127.0.0.1:8090")
    assert Config().listen.strports() == "tcp:8090:interface=127.0.0.1:backlog=1024"
    assert parse_config("{}").listen.loopback()


@pytest.mark.parametrize(("address", "loopback"), [
    ("127.0.0.1:8090", True), ("127.0.0.2:8090", True), ("[::1]:8090", True),
    ("localhost:8090", True), ("tcp:8090:interface=127.0.0.1", True),
    ("tcp6:8090:interface=\\:\\:1", True), ("unix:/run/pharos.sock", True),
    (":8090", False), ("0.0.0.0:8090", False), ("[::]:8090", False), ("10.0.0.5:8090", False),
    ("pharos.example.internal:8090", False), ("tcp:8090", False),
    ("systemd:domain=INET:index=0", False)])
def test_which_listen_addresses_are_loopback(address: str, loopback: bool) -> None:
    """Only loopback interfaces and UNIX sockets are; every interface, another address, a
    host name other than localhost, and an endpoint of unknown reach are not."""
    assert Listen(address).loopback() is loopback


def test_the_exposure_warning() -> None:
    """A non-loopback listen without keys has a warning naming the risk; keys or a loopback
    listen have none."""
    risk = exposure_warning(parse_config("listen: 0.0.0.0:8090\n"))
    assert risk is not None and "'0.0.0.0:8090'" in risk and "no keys" in risk
    assert "loopback" in risk and "without a key" in risk
    assert exposure_warning(Config()) is None
    assert exposure_warning(Config(listen=Listen(":8090"), keys=KEYS)) is None


def test_metrics_key_is_a_sha256_and_refuses_a_placeholder() -> None:
    """``observability.metrics_key`` takes a digest as ``keys[].sha256`` does; a placeholder
    is refused naming the field and ``pharos keys new``."""
    good = hashlib.sha256(TOKEN.encode()).hexdigest()
    assert parse_config(f"observability:\n  metrics_key: {good}\n"
                        ).observability.metrics_key == good
    with pytest.raises(ConfigError) as e:
        parse_config('observability:\n  metrics_key: "<sha256 from pharos keys new>"\n')
    assert "observability.metrics_key" in str(e.value) and "pharos keys new" in str(e.value)
