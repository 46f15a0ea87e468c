"""Layer 3: safe defaults of a whole Pharos. Without keys, a client on another host (the peer
address of an in-memory request, ``10.0.0.7``: no traffic leaves the machine) gets 403 in the
route's shape on the admin routes and model management and changes nothing, while loopback
clients over a real socket pass and a forwarded request does not; ``pharos check`` warns of
a config open to the network, and a start on such a config logs the warning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from treq.testing import StubTreq
from twisted.internet.address import IPv4Address
from twisted.logger import capturedLogs
from twisted.web.http_headers import Headers
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource

from pharos import tap
from pharos.config import Config, Listen
from tests.support.fleet import Fleet, start_fleet

ROOT = Path(__file__).resolve().parents[2]
PHAROS = str(Path(sys.executable).parent / "pharos")
REMOTE = IPv4Address("TCP", "10.0.0.7", 5555)
class FromPeer(Resource):
    """The site's root as a client at ``peer`` reaches it."""

    def __init__(self, inner: IResource, peer: Any) -> None:
        super().__init__()
        self.inner = inner
        self.peer = peer

    def getChildWithDefault(self, path: bytes, request: IRequest) -> IResource:
        request.client = self.peer  # type: ignore[attr-defined]
        return self.inner.getChildWithDefault(path, request)


def remote_call(f: Fleet, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """``method path`` from 10.0.0.7, in memory; the status and the JSON body."""
    client: Any = StubTreq(FromPeer(f.pharos.site.resource, REMOTE))
    data = json.dumps(body).encode() if body is not None else None
    d = client.request(method, "http://pharos" + path, data=data, headers=Headers(
        {b"content-type": [b"application/json"]}))
    client.flush()
    response: Any = d.result
    content = client.content(response)
    client.flush()
    return response.code, json.loads(content.result)


async def local_call(f: Fleet, method: str, path: str, body: Any = None,
                     headers: dict[bytes, bytes] | None = None) -> tuple[int, Any]:
    """``method path`` over loopback, for real."""
    h = Headers({b"content-type": [b"application/merge-patch+json"]})
    for name, value in (headers or {}).items():
        h.setRawHeaders(name, [value])
    data = json.dumps(body).encode() if body is not None else None
    r = await treq.request(method, f.url + path, data=data, headers=h, pool=f.pool)
    return r.code, json.loads(await r.content())


async def fleet() -> Fleet:
    return await start_fleet([("ollama", {}, {"kind": "ollama"})])


@pytest_twisted.ensureDeferred
async def test_another_host_without_keys_gets_403_in_the_routes_shape_and_changes_nothing(
        ) -> None:
    """From 10.0.0.7 without keys: ``PATCH /admin/config``, ``/usage``, ``/status`` and
    ``/metrics`` are 403 ``loopback_only`` in OpenAI's shape, model management (delete,
    pull, blobs) in Ollama's; the config and the engine's models stay as they were; the data
    plane still answers."""
    f = await fleet()
    try:
        models = set(f.doubles[0].flavor.catalogue())
        victim = sorted(models)[0]
        code, doc = remote_call(f, "PATCH", "/admin/config", {"policy": "p2c"})
        assert code == 403 and doc["error"]["code"] == "loopback_only", doc
        assert "configure keys" in doc["error"]["message"]
        assert f.pharos.config.policy == "cost" and f.pharos.generation == 0
        for method, path in (("GET", "/usage"), ("GET", "/status"), ("GET", "/metrics"),
                             ("GET", "/admin/config")):
            code, doc = remote_call(f, method, path)
            assert code == 403 and doc["error"]["code"] == "loopback_only", (path, doc)
        for method, path, body in (("DELETE", "/api/delete", {"model": victim}),
                                   ("POST", "/api/pull", {"model": "llama3.2"}),
                                   ("POST", "/api/copy", {"source": victim,
                                                          "destination": "copied"}),
                                   ("POST", "/api/blobs/sha256:" + "0" * 64, None)):
            code, doc = remote_call(f, method, path, body)
            assert code == 403 and isinstance(doc["error"], str), (path, doc)
            assert "loopback clients only" in doc["error"]
        assert set(f.doubles[0].flavor.catalogue()) == models
        code, doc = remote_call(f, "GET", "/v1/models")
        assert code == 200 and doc["object"] == "list"
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_loopback_passes_and_a_forwarded_request_does_not() -> None:
    """Over loopback without keys a patch applies; the same patch carrying
    ``X-Forwarded-For`` (a reverse proxy on this host) is 403 and changes nothing."""
    f = await fleet()
    try:
        code, doc = await local_call(f, "PATCH", "/admin/config", {"policy": "p2c"},
                                     {b"x-forwarded-for": b"203.0.113.9"})
        assert code == 403 and doc["error"]["code"] == "loopback_only", doc
        assert (f.pharos.config.policy, f.pharos.generation) == ("cost", 0)
        code, doc = await local_call(f, "PATCH", "/admin/config", {"policy": "p2c"})
        assert code == 200, doc
        assert (f.pharos.config.policy, f.pharos.generation) == ("p2c", 1)
    finally:
        await f.stop()


def test_check_warns_of_a_config_open_to_the_network(tmp_path: Path) -> None:
    """``pharos check`` on ``listen: 0.0.0.0:8090`` without keys passes (exit 0) and prints
    the warning naming the risk; on the default listen it prints none."""
    cfg = tmp_path / "pharos.yaml"
    cfg.write_text("listen: 0.0.0.0:8090\n")
    r = subprocess.run([PHAROS, "check", "-c", str(cfg)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "warning:" in r.stdout and "'0.0.0.0:8090' is not loopback" in r.stdout, r.stdout
    assert "no keys are configured" in r.stdout
    cfg.write_text("backends: []\n")
    r = subprocess.run([PHAROS, "check", "-c", str(cfg)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "warning" not in r.stdout, r.stdout


def test_a_start_open_to_the_network_logs_the_warning(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """``twistd pharos`` (``makeService``) on ``listen: :8090`` without keys logs the same
    warning before it builds the service; with the default listen it logs none."""
    built: list[Config] = []
    monkeypatch.setattr(tap.PharosService, "from_config",
                        lambda reactor, config, **kw: built.append(config))
    with capturedLogs() as events:
        for text in ("listen: ':8090'\n", "{}\n"):
            cfg = tmp_path / "pharos.yaml"
            cfg.write_text(text)
            options = tap.Options()
            options.parseOptions(["-c", str(cfg)])
            tap.makeService(options)
    warnings = [e["risk"] for e in events if "risk" in e]
    assert len(warnings) == 1 and "':8090' is not loopback" in warnings[0], warnings
    assert [c.listen for c in built] == [Listen(":8090"), Listen("127.0.0.1:8090")]
