"""Layer 3: hot reload over loopback (spec §10, issue 13 item 2): a reload by
``POST /admin/reload``, by SIGHUP and by twistd's own process drops no request; new keys work
at once and removed ones get 401; a backend is added and another's own probes change (it is
resolved again) while a stream runs on it; a file that does not parse changes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.interfaces import IListeningPort
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from twisted.web.client import HTTPConnectionPool
from twisted.web.http_headers import Headers
from zope.interface import implementer

from pharos.config import load_config
from pharos.proxy.auth import digest
from pharos.service import PharosService
from pharos.sim.double import EngineDouble, start_double
from tests.support.capture_server import close, serve
from tests.support.fleet import FAST, eventually, within
from tests.support.twistd import TWISTD, free_port, wait_healthy

ADMIN, ALICE, DAVE = "phk-admin", "phk-alice", "phk-dave"
LLAMA = "llama3.2:3b"
#: An own probe for the vLLM double: its running count, under our own name.
OWN_PROBE = ("    probes:\n"
             "      - name: my-running\n"
             "        signal: running\n"
             "        prom: {path: /metrics, metric: 'vllm:num_requests_running',"
             " per_model: model_name}\n")


def key(name: str, secret: str, admin: bool = False) -> str:
    return (f"  - name: {name}\n    sha256: {digest(secret)}\n"
            + ("    admin: true\n" if admin else ""))


@dataclass
class Reloading:
    """Pharos started from a config file (so it watches it), in front of engine doubles."""

    path: Path
    pharos: PharosService
    url: str
    doubles: dict[str, EngineDouble]
    ports: list[IListeningPort]
    pool: HTTPConnectionPool = field(
        default_factory=lambda: HTTPConnectionPool(reactor, persistent=False))

    def write(self, backends: list[str], keys: list[str], extra: str = "",
              probed: tuple[str, ...] = ()) -> None:
        """The config file: these doubles (``probed`` ones with ``OWN_PROBE``), these keys."""
        text = ("listen: 127.0.0.1:0\nbackends:\n"
                + "".join(f"  - url: {self.doubles[b].url}\n    kind: {self.doubles[b].kind}\n"
                          + (OWN_PROBE if b in probed else "") for b in backends)
                + "keys:\n" + "".join(keys) + extra)
        self.path.write_text(text)

    async def call(self, method: str, path: str, secret: str | None,
                   body: dict[str, Any] | None = None) -> tuple[int, Any]:
        headers = Headers({b"content-type": [b"application/json"]})
        if secret is not None:
            headers.setRawHeaders(b"authorization", [f"Bearer {secret}".encode()])
        data = json.dumps(body).encode() if body is not None else None
        r = await treq.request(method, self.url + path, data=data, headers=headers,
                               pool=self.pool)
        raw = await r.content()
        try:
            return r.code, json.loads(raw)
        except ValueError:
            return r.code, raw.decode()

    async def stop(self) -> None:
        await self.pool.closeCachedConnections()
        await self.pharos.stopService()
        for d in self.doubles.values():
            d.stop()
        for p in self.ports:
            await close(p)


async def start(tmp_path: Path) -> Reloading:
    """A vLLM double (``tiny``) and an Ollama double (``LLAMA``) listed in the file, keys ops
    (admin) and alice; a llama.cpp double running but not listed yet."""
    doubles: dict[str, EngineDouble] = {}
    ports: list[IListeningPort] = []
    engines: list[tuple[str, str, dict[str, Any]]] = [
        ("vllm", "vllm", {}), ("ollama", "ollama", {"loaded": [LLAMA]}),
        ("llamacpp", "llamacpp", {})]
    for name, kind, opts in engines:
        d, port = start_double(kind, reactor, **{**FAST, **opts})
        doubles[name] = d
        ports.append(port)
    r = Reloading(tmp_path / "pharos.yaml", None, "", doubles, ports)  # type: ignore[arg-type]
    r.write(["vllm", "ollama"], [key("ops", ADMIN, admin=True), key("alice", ALICE)])
    top = PharosService.from_config(reactor, load_config(r.path), load_interval=0.1,
                                    config_path=str(r.path))
    top.startService()
    listening, r.url = serve(top.site)
    r.pharos = top
    ports.append(listening)
    await top.state.when_ready()
    return r


def chat(model: str, max_tokens: int = 4, stream: bool = False) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": "hello there"}]}


class Stream:
    """A streamed reply read as it arrives: ``first`` fires on its first bytes."""

    def __init__(self) -> None:
        self.first: Deferred[None] = Deferred()
        self.chunks: list[bytes] = []

    def __call__(self, data: bytes) -> None:
        self.chunks.append(data)
        if not self.first.called:
            self.first.callback(None)

    def text(self) -> str:
        return b"".join(self.chunks).decode()


@implementer(ILogObserver)
class Captured:
    """Log lines emitted while it is attached (the reload's own log)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, event: LogEvent) -> None:
        self.lines.append(formatEvent(event))

    def __enter__(self) -> Captured:
        globalLogPublisher.addObserver(self)
        return self

    def __exit__(self, *exc: object) -> None:
        globalLogPublisher.removeObserver(self)


@pytest_twisted.ensureDeferred
async def test_admin_reload_mid_stream_drops_nothing(tmp_path: Path) -> None:
    """A stream on the vLLM engine is in flight (held by the engine) while /admin/reload
    applies a file that drops alice, adds dave, adds the llama.cpp engine and gives the vLLM
    engine an own probe: dave is served at once, alice gets 401, a request for the stream's
    model sent right after the reload is served (the re-resolved engine kept serving), the
    vLLM engine is resolved again with its new probe, the added engine serves, and the stream
    ends intact with [DONE]. Read again unchanged, the file changes nothing."""
    r = await start(tmp_path)
    vllm = r.doubles["vllm"]
    try:
        backend = r.pharos.state.backends[vllm.url]
        stream = Stream()
        response = await treq.post(
            r.url + "/v1/chat/completions", json.dumps(chat("tiny", 40, True)).encode(),
            headers=Headers({b"authorization": [f"Bearer {ALICE}".encode()],
                             b"content-type": [b"application/json"]}),
            pool=r.pool, unbuffered=True)
        assert response.code == 200
        body = ensureDeferred(treq.collect(response, stream))
        await within(stream.first, 30)
        vllm.hold()

        r.write(["vllm", "ollama", "llamacpp"],
                [key("ops", ADMIN, admin=True), key("dave", DAVE)], probed=("vllm",))
        code, doc = await r.call("POST", "/admin/reload", ADMIN)
        assert code == 200, doc
        assert doc == {"changed": True, "applied": ["backends", "keys"], "needs_restart": []}
        during = ensureDeferred(r.call("POST", "/v1/chat/completions", DAVE, chat("tiny")))
        assert (await r.call("POST", "/v1/chat/completions", DAVE, chat(LLAMA)))[0] == 200
        code, doc = await r.call("POST", "/v1/chat/completions", ALICE, chat(LLAMA))
        assert code == 401 and doc["error"]["code"] == "invalid_api_key"
        assert r.pharos.state.backends[vllm.url] is backend
        await eventually(lambda: backend.plan is not None and "my-running" in [
            p.name for p in backend.plan.active], timeout=15)

        vllm.release()
        await within(body, 30)
        text = stream.text()
        assert text.rstrip().endswith("data: [DONE]"), text[-300:]
        assert text.count('"content"') >= 40 // 2  # the whole reply, not a cut one
        assert (await within(during, 30))[0] == 200

        llamacpp = r.doubles["llamacpp"].url
        await eventually(lambda: any(t.backend.url == llamacpp
                                     for t in r.pharos.state.targets_for("tiny")), timeout=15)
        code, doc = await r.call("POST", "/admin/reload", ADMIN)
        assert (code, doc) == (200, {"changed": False, "applied": [], "needs_restart": []})
    finally:
        vllm.release()
        await r.stop()


@pytest_twisted.ensureDeferred
async def test_a_bad_file_keeps_the_running_config(tmp_path: Path) -> None:
    """A file that does not parse: /admin/reload answers 422 with every error and SIGHUP logs
    them; alice keeps working and nothing else changes. A non-admin key may not reload; a
    field needing a restart is named as such."""
    r = await start(tmp_path)
    try:
        before = r.pharos.config
        r.path.write_text(r.path.read_text() + "policy: fastest\ndrian: {}\n")
        with Captured() as log:
            code, doc = await r.call("POST", "/admin/reload", ADMIN)
            assert code == 422, doc
            assert doc["error"]["code"] == "invalid_config" and len(doc["errors"]) == 2
            assert any("drian" in e for e in doc["errors"])
            assert callable(signal.getsignal(signal.SIGHUP))  # never the default: exit
            os.kill(os.getpid(), signal.SIGHUP)
            await eventually(lambda: sum("not reloaded" in line for line in log.lines) == 2)
        assert any("drian" in line for line in log.lines)
        assert r.pharos.config is before
        assert (await r.call("POST", "/v1/chat/completions", ALICE, chat(LLAMA)))[0] == 200
        code, doc = await r.call("POST", "/admin/reload", ALICE)
        assert code == 403 and doc["error"]["code"] == "admin_required"

        r.write(["vllm", "ollama"], [key("ops", ADMIN, admin=True), key("alice", ALICE)],
                "policy: least-load\nrouting: {session_affinity: false}\n")
        code, doc = await r.call("POST", "/admin/reload", ADMIN)
        assert (code, doc) == (200, {"changed": True,
                                     "applied": ["policy", "routing.session_affinity"],
                                     "needs_restart": []})
        assert r.pharos.sched.policy.name == "least-load"  # live since issue 17
        assert r.pharos.sched.policy.session_affinity is False
    finally:
        await r.stop()


@pytest_twisted.ensureDeferred
async def test_sighup_in_process_applies_a_new_key(tmp_path: Path) -> None:
    """SIGHUP reads the file at once (its mtime kept, so only the signal can have done it):
    dave works, alice is a 401."""
    r = await start(tmp_path)
    try:
        stamp = r.path.stat()
        r.write(["vllm", "ollama"], [key("ops", ADMIN, admin=True), key("dave", DAVE)])
        os.utime(r.path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        assert callable(signal.getsignal(signal.SIGHUP))  # never the default: exit
        os.kill(os.getpid(), signal.SIGHUP)
        await eventually(lambda: [k.name for k in r.pharos.config.keys] == ["ops", "dave"])
        assert (await r.call("POST", "/v1/chat/completions", DAVE, chat(LLAMA)))[0] == 200
        assert (await r.call("POST", "/v1/chat/completions", ALICE, chat(LLAMA)))[0] == 401
    finally:
        await r.stop()


@pytest.fixture
def twistd_config(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    port = free_port()
    path = tmp_path / "pharos.yaml"
    path.write_text(f"listen: 127.0.0.1:{port}\nkeys:\n{key('ops', ADMIN, admin=True)}")
    yield path, port


def models(port: int, secret: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models",
                                     headers={"authorization": f"Bearer {secret}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_sighup_under_twistd_reloads_and_sigterm_still_stops(
    twistd_config: tuple[Path, int], tmp_path: Path
) -> None:
    """Under twistd (which handles INT, TERM and USR1 itself), SIGHUP reloads the file instead
    of ending the process: a key added to it works; SIGTERM still stops cleanly."""
    path, port = twistd_config
    proc = subprocess.Popen([TWISTD, "-n", "--pidfile", str(tmp_path / "p.pid"), "pharos",
                             "-c", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=tmp_path)
    try:
        assert wait_healthy(port) == 200
        assert models(port, DAVE) == 401
        path.write_text(path.read_text() + key("dave", DAVE))
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 15
        while models(port, DAVE) != 200:
            assert proc.poll() is None, "SIGHUP ended the process"
            assert time.monotonic() < deadline, "the key never applied"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.decode()
    assert proc.returncode in (0, -signal.SIGTERM), text
    assert "reloaded: keys" in text and "Traceback" not in text
