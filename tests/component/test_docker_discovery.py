"""Layer 3: Docker label discovery against a fake Engine API on a real UNIX socket (issue 14
items 3, 4 and its bad input): containers started, restarted, dying, relabelled; a removed
container drains and one that comes back gets its state back; container log feeds in both
framings; a socket that is absent, answers garbage, closes mid-stream, or lists 1,000
containers; labels that make no backend are logged once and the rest keeps working.

The fake (tests/support/fake_docker.py) serves bodies cloned from fixtures/docker/1.50.
Discovery's backoff runs on a ``Clock`` the test advances; the I/O runs on the reactor.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock, LoopingCall
from twisted.logger import ILogObserver, LogEvent, LogLevel, formatEvent, globalLogPublisher
from twisted.web.client import HTTPConnectionPool
from zope.interface import implementer

from pharos.config import Backend, Config, Listen, LogFeed
from pharos.discovery.docker import DockerAPI, DockerDiscovery, DockerLogFeed
from pharos.discovery.logfile import feed_for
from pharos.discovery.service import Discovery
from pharos.engine.fetch import Fetcher
from pharos.service import PharosService
from pharos.sim.double import start_double
from pharos.state.state import State
from tests.support.capture_server import serve
from tests.support.fake_docker import FakeDocker
from tests.support.fleet import FAST, Fleet, eventually, sleep, within

ENABLED = {"pharos.enable": "true"}


class Rig:
    """The fake daemon on a socket, Pharos's client for it, and a Clock for backoff."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pd", dir="/tmp"))  # a socket path is short
        self.path = str(self.dir / "docker.sock")
        self.fake = FakeDocker()
        self.fake.listen(self.path)
        self.api = DockerAPI(reactor, self.path)
        self.clock = Clock()
        self.services: list[Any] = []

    def discovery(self, **kw: Any) -> DockerDiscovery:
        d = DockerDiscovery(self.api, self.clock, **kw)
        d.startService()
        self.services.append(d)
        return d

    async def close(self) -> None:
        for s in reversed(self.services):
            s.stopService()
        await self.fake.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest_twisted.async_yield_fixture()
async def rig() -> AsyncIterator[Rig]:
    r = Rig()
    yield r
    await r.close()


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    """Warnings logged during the test, as text."""
    seen: list[str] = []

    @implementer(ILogObserver)
    def observe(event: LogEvent) -> None:
        if event.get("log_level") == LogLevel.warn:
            seen.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    yield seen
    globalLogPublisher.removeObserver(observe)


class NoFetch:
    """Scrapes never answer: these tests watch the backend set."""

    def get(self, path: str, **kw: Any) -> Deferred[Any]:
        return Deferred()


def urls(d: DockerDiscovery) -> list[str]:
    return [b.url for b in d.backends]


async def backing_off(clock: Clock) -> None:
    """Wait until discovery is waiting out its backoff (its retry is a call on ``clock``)."""
    await eventually(lambda: bool(clock.getDelayedCalls()), 10)


async def retries(clock: Clock, n: int) -> None:
    """Let ``n`` retries happen, then wait until the next backoff has begun."""
    for _ in range(n):
        await backing_off(clock)
        clock.advance(60)
    await backing_off(clock)


@pytest_twisted.ensureDeferred
async def test_start_restart_die_and_label_changes(rig: Rig) -> None:
    """Through State: labelled running containers are backends (an unlabelled one is not); a
    container that dies drains (removed, state kept aside) and after its start gets the same
    BackendState back; a restart keeps it; new labels (a recreated container) move it."""
    fake = rig.fake
    ollama = fake.run("ollama-1", {**ENABLED, "pharos.kind": "ollama", "pharos.memory_gb": "24"},
                      ports=(11434,), networks={"bridge": "172.17.0.5"})
    fake.run("postgres", {}, ports=(5432,), networks={"bridge": "172.17.0.9"})

    def no_fetch(spec: Backend) -> Fetcher:
        return NoFetch()  # type: ignore[return-value]

    state = State(rig.clock, None, fetcher_for=no_fetch)
    discovery = Discovery(state.set_backends, rig.clock, [Backend(url="http://gpu-box:8000")],
                          docker=rig.api)
    discovery.startService()
    rig.services.append(discovery)
    assert list(state.backends) == ["http://gpu-box:8000"]  # static at once
    await eventually(lambda: "http://172.17.0.5:11434" in state.backends, 10)
    b = state.backends["http://172.17.0.5:11434"]
    assert b.spec == Backend(url="http://172.17.0.5:11434", kind="ollama", memory_gb=24.0,
                             logs=LogFeed("docker", ollama.id))
    assert len(state.backends) == 2

    vllm = fake.run("vllm-1", {**ENABLED, "pharos.port": "8000", "pharos.kind": "vllm"},
                    ports=(8000, 9090), networks={"bridge": "172.17.0.6"})
    await eventually(lambda: "http://172.17.0.6:8000" in state.backends, 10)

    fake.die(ollama)
    await eventually(lambda: "http://172.17.0.5:11434" not in state.backends, 10)
    assert b.removed
    fake.start(ollama)
    await eventually(lambda: "http://172.17.0.5:11434" in state.backends, 10)
    assert state.backends["http://172.17.0.5:11434"] is b and not b.removed

    lists = discovery.docker.lists if discovery.docker else 0
    fake.restart(ollama)  # kill, die, stop, start, restart: a burst, lists coalesced
    await eventually(lambda: discovery.docker is not None and discovery.docker.lists > lists
                     and fake.containers[ollama.id].running, 10)
    await eventually(lambda: "http://172.17.0.5:11434" in state.backends, 10)
    assert state.backends["http://172.17.0.5:11434"] is b

    old = state.backends["http://172.17.0.6:8000"]
    fake.recreate(vllm, {**ENABLED, "pharos.port": "9090", "pharos.kind": "vllm"})
    await eventually(lambda: "http://172.17.0.6:9090" in state.backends, 10)
    assert "http://172.17.0.6:8000" not in state.backends and old.removed

    fake.recreate(fake.containers[next(c.id for c in fake.containers.values()
                                       if c.name == "vllm-1")], {"pharos.enable": "false"})
    await eventually(lambda: "http://172.17.0.6:9090" not in state.backends, 10)
    assert sorted(state.backends) == ["http://172.17.0.5:11434", "http://gpu-box:8000"]
    assert any(r.startswith("GET /v1.50/events") for r in fake.requests)
    assert all("/v1.50/" in r or "/_ping" in r for r in fake.requests)


@pytest_twisted.ensureDeferred
async def test_container_log_feed_multiplexed_and_tty(rig: Rig) -> None:
    """A container's log feed: stdout and stderr lines with frames stripped, a TTY
    container's raw stream split the same way; only lines since its latest start; lines
    printed later arrive while following; the feed ends when the container stops; a
    cancelled feed closes its stream."""
    fake = rig.fake
    plain = fake.run("ollama-1", ENABLED, ports=(11434,))
    fake.write_log(plain, "before the restart")
    fake.restart(plain)
    await sleep(0.01)  # StartedAt is in ns: the next lines are after it
    fake.write_log(plain, "time=... msg=\"server config\" env=\"map[OLLAMA_NUM_PARALLEL:4]\"")
    fake.write_log(plain, "on stderr", stream=2)
    tty = fake.run("tty-1", ENABLED, tty=True)
    fake.write_log(tty, "a tty line")

    got: list[bytes] = []
    feed = feed_for(f"docker://{plain.id}", rig.clock, rig.api.log_feed)
    assert isinstance(feed, DockerLogFeed) and "docker://" in feed.describe()
    ended = feed.connect(got.append)
    await eventually(lambda: len(got) == 2, 10)
    assert got == [b"time=... msg=\"server config\" env=\"map[OLLAMA_NUM_PARALLEL:4]\"",
                   b"on stderr"]
    fake.write_log(plain, "printed later")
    await eventually(lambda: len(got) == 3, 10)
    fake.stop(plain)
    assert await within(ended, 10) is None
    assert any("since=" in r or "/logs" in r for r in fake.requests)

    tty_lines: list[bytes] = []
    tty_feed = rig.api.log_feed("tty-1")
    tty_ended = tty_feed.connect(tty_lines.append)
    await eventually(lambda: tty_lines == [b"a tty line"], 10)
    fake.write_log(tty, "another")
    await eventually(lambda: tty_lines == [b"a tty line", b"another"], 10)
    assert fake.following == 1
    tty_ended.cancel()
    await eventually(lambda: fake.following == 0, 10)

    gone = rig.api.log_feed("no-such-container").connect(lambda line: None)
    with pytest.raises(Exception, match="No such container"):
        await within(gone, 10)


@pytest_twisted.ensureDeferred
async def test_no_socket_means_discovery_off_logged_once(warnings: list[str]) -> None:
    """Nothing listens on the socket: discovery is off (one warning however many retries),
    only the static backends are used, and it comes on when the daemon appears."""
    base = Path(tempfile.mkdtemp(prefix="pd", dir="/tmp"))
    path = str(base / "docker.sock")
    clock, pushed = Clock(), []
    api = DockerAPI(reactor, path)
    d = Discovery(lambda specs: pushed.append([b.url for b in specs]), clock,
                  [Backend(url="http://gpu-box:8000")], docker=api)
    d.startService()
    fake = FakeDocker()
    try:
        assert d.docker is not None
        await retries(clock, 4)
        assert len([w for w in warnings if "Docker discovery off" in w]) == 1, warnings
        assert pushed[-1] == ["http://gpu-box:8000"] and d.docker.connected is None
        fake.run("ollama-1", ENABLED, ports=(11434,))
        fake.listen(path)
        clock.advance(60)
        await eventually(lambda: pushed[-1] == ["http://gpu-box:8000",
                                                "http://172.17.0.4:11434"], 10)
    finally:
        d.stopService()
        await fake.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest_twisted.ensureDeferred
async def test_garbage_socket_then_recovery(rig: Rig, warnings: list[str]) -> None:
    """A socket that answers bytes that are not HTTP: off, logged once, no traceback; when it
    speaks the API again, discovery comes on."""
    rig.fake.garbage = True
    rig.fake.run("ollama-1", ENABLED, ports=(11434,))
    d = rig.discovery()
    await retries(rig.clock, 3)
    off = [w for w in warnings if "Docker discovery off" in w]
    assert len(off) == 1 and d.backends == ()
    rig.fake.garbage = False
    rig.clock.advance(60)
    await eventually(lambda: urls(d) == ["http://172.17.0.4:11434"], 10)


@pytest_twisted.ensureDeferred
async def test_stream_closed_mid_line_keeps_the_set_and_reconnects(
        rig: Rig, warnings: list[str]) -> None:
    """The events stream closes in the middle of a line: the last set stays, one warning,
    reconnect after the backoff, and the list after it sees what changed meanwhile."""
    a = rig.fake.run("a", ENABLED, ports=(1000,), networks={"n": "10.0.0.1"})
    d = rig.discovery()
    await eventually(lambda: urls(d) == ["http://10.0.0.1:1000"] and rig.fake.watching == 1, 10)
    rig.fake.cut_events()
    await eventually(lambda: d.connected is False, 10)
    assert urls(d) == ["http://10.0.0.1:1000"]
    rig.fake.die(a)  # unseen: no stream
    rig.fake.run("b", ENABLED, ports=(1000,), networks={"n": "10.0.0.2"}, emit=False)
    rig.fake.cut_events()
    await backing_off(rig.clock)
    rig.clock.advance(1)
    await eventually(lambda: urls(d) == ["http://10.0.0.2:1000"] and d.connected is True, 10)
    assert len([w for w in warnings if "lost" in w]) == 1, warnings


@pytest_twisted.ensureDeferred
async def test_list_answering_garbage_keeps_the_last_set(rig: Rig, warnings: list[str]) -> None:
    """/containers/json answers 200 with HTML: the last set stays, the stream is dropped and
    reconnected with backoff, logged once; a good answer later applies."""
    rig.fake.run("a", ENABLED, ports=(1000,), networks={"n": "10.0.0.1"})
    d = rig.discovery()
    await eventually(lambda: urls(d) == ["http://10.0.0.1:1000"], 10)
    rig.fake.list_garbage = True
    rig.fake.run("b", ENABLED, ports=(1000,), networks={"n": "10.0.0.2"})
    await eventually(lambda: d.connected is False, 10)
    assert urls(d) == ["http://10.0.0.1:1000"]
    await retries(rig.clock, 3)
    assert len([w for w in warnings if "lost" in w]) == 1
    assert any("not JSON" in w for w in warnings)
    rig.fake.list_garbage = False
    rig.clock.advance(60)
    await eventually(lambda: urls(d) == ["http://10.0.0.1:1000", "http://10.0.0.2:1000"], 10)


@pytest_twisted.ensureDeferred
async def test_a_thousand_containers_bad_labels_logged_once(
        rig: Rig, warnings: list[str]) -> None:
    """1,000 labelled containers, one in four with a bad port and one in four with an unknown
    kind: 500 backends, each refusal logged once (not again on the next list), and the
    reactor keeps turning (its longest pause is reported)."""
    for i in range(1000):
        labels = dict(ENABLED)
        if i % 4 == 1:
            labels["pharos.port"] = "80800"
        elif i % 4 == 2:
            labels["pharos.kind"] = "tensorrt"
        rig.fake.run(f"engine-{i:04d}", labels, ports=(8000,),
                     networks={"n": f"10.{i // 250}.{i % 250}.1"}, emit=False)
    gaps: list[float] = []
    last = [time.monotonic()]

    def beat() -> None:
        now = time.monotonic()
        gaps.append(now - last[0])
        last[0] = now

    heartbeat = LoopingCall(beat)
    heartbeat.start(0.01)
    try:
        d = rig.discovery()
        await eventually(lambda: len(d.backends) == 500, 30)
        lists = d.lists
        rig.fake.run("one-more", ENABLED, ports=(8000,), networks={"n": "10.9.9.9"})
        await eventually(lambda: d.lists > lists and len(d.backends) == 501, 30)
    finally:
        heartbeat.stop()
    left_out = [w for w in warnings if "left out" in w]
    assert len(left_out) == 500, len(left_out)
    assert sum("80800" in w for w in left_out) == 250
    assert sum("tensorrt" in w for w in left_out) == 250
    print(f"\nlongest reactor pause during 1,000-container lists: {max(gaps) * 1000:.0f} ms")
    assert max(gaps) < 2.0  # generous: a stall would be seconds


@pytest_twisted.ensureDeferred
async def test_pharos_routes_to_a_labelled_container_and_reads_its_log(rig: Rig) -> None:
    """End to end through PharosService: with an empty static list and the fake's socket, an
    Ollama double labelled pharos.enable (pharos.url pointing at it on loopback) is
    discovered, answers a chat through Pharos, and gets capacity 4 from its container log
    (OLLAMA_NUM_PARALLEL:4); a reload adds a static backend and keeps the Docker one."""
    double, port = start_double("ollama", reactor, **dict[str, Any]({**FAST, "slots": 4}))
    lines = double.log_lines()
    assert lines is not None
    c = rig.fake.run("ollama-1", {**ENABLED, "pharos.url": double.url, "pharos.kind": "ollama"},
                     ports=(11434,))
    for line in lines:
        rig.fake.write_log(c, line, stream=2)  # Ollama logs on stderr
    cfg = Config(listen=Listen("127.0.0.1:0"))
    top = PharosService.from_config(reactor, cfg, load_interval=0.1, docker_socket=rig.path)
    top.startService()
    listening, url = serve(top.site)
    fleet = Fleet([double], top, url, HTTPConnectionPool(reactor, persistent=False),
                  [port, listening])
    try:
        await eventually(lambda: double.url in top.state.backends, 30)
        b = top.state.backends[double.url]
        assert b.spec.logs == LogFeed("docker", c.id)
        await eventually(lambda: any(t.backend is b for t in top.state.targets), 30)
        target = next(t for t in top.state.targets if t.backend is b)
        await eventually(lambda: top.state.view(target).capacity == 4, 30)
        r = await fleet.chat(target.model)
        assert r.code == 200, await r.content()
        other, other_port = start_double("ollama", reactor, **dict[str, Any]({**FAST, "slots": 1}))
        fleet.doubles.append(other)
        fleet.ports.append(other_port)
        top.reconfigure(dataclasses.replace(cfg, backends=(Backend(url=other.url),)))
        assert sorted(top.state.backends) == sorted([double.url, other.url])
        assert top.state.backends[double.url] is b
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_list_that_stalls_halfway_times_out(warnings: list[str]) -> None:
    """/containers/json sends the start of a list and nothing more: the read times out (the
    request deadline covers the body, not just the head), the last set stays, logged once."""
    rig = Rig()
    rig.api = DockerAPI(reactor, rig.path, timeout=0.5)
    try:
        rig.fake.run("a", ENABLED, ports=(1000,), networks={"n": "10.0.0.1"})
        d = rig.discovery()
        await eventually(lambda: urls(d) == ["http://10.0.0.1:1000"], 10)
        rig.fake.list_stalls = True
        rig.fake.run("b", ENABLED, ports=(1000,), networks={"n": "10.0.0.2"})
        await eventually(lambda: d.connected is False, 10)
        await retries(rig.clock, 2)
        assert urls(d) == ["http://10.0.0.1:1000"]
        assert len([w for w in warnings if "lost" in w]) == 1, warnings
        rig.fake.list_stalls = False
        rig.clock.advance(60)
        await eventually(lambda: len(d.backends) == 2, 10)
    finally:
        await rig.close()


@pytest_twisted.ensureDeferred
async def test_doctor_reads_a_containers_log(rig: Rig, tmp_path: Path) -> None:
    """``pharos doctor -c`` with ``logs: docker://NAME`` reads the container's log through the
    Engine API on ``DOCKER_HOST`` (the log as it is, not followed, so doctor ends): the Ollama
    double's OLLAMA_NUM_PARALLEL:4 line gives capacity 4 from the log probe; with the socket
    gone doctor names why and examines the backend without its log."""
    import os
    import sys

    from twisted.internet.utils import getProcessOutputAndValue

    pharos = str(Path(sys.executable).parent / "pharos")
    double, port = start_double("ollama", reactor, **dict[str, Any]({**FAST, "slots": 4}))
    lines = double.log_lines()
    assert lines is not None
    c = rig.fake.run("ollama-doc", ENABLED, ports=(11434,))
    for line in lines:
        rig.fake.write_log(c, line, stream=2)
    cfg = tmp_path / "pharos.yaml"
    cfg.write_text(f"backends:\n  - url: {double.url}\n    kind: ollama\n"
                   f"    logs: docker://{c.id}\n")
    env = {**os.environ, "DOCKER_HOST": f"unix://{rig.path}"}
    try:
        out, err, code = await getProcessOutputAndValue(
            pharos, ["doctor", "-c", str(cfg), "--json"], env=env, reactor=reactor)
        assert code == 0, err
        (doc,) = json.loads(out)["backends"]
        active = {a["probe"]: a for a in doc["active"]}
        assert active["ollama-log-num-parallel"]["source"] == "log"
        assert doc["signals"]["backend"]["capacity"] == 4
        env["DOCKER_HOST"] = f"unix://{rig.dir}/absent.sock"
        out, err, code = await getProcessOutputAndValue(
            pharos, ["doctor", "-c", str(cfg)], env=env, reactor=reactor)
        assert code == 0, err
        assert f"docker://{c.id}" in err.decode()
        assert "no log feed" in out.decode()
    finally:
        stopped = port.stopListening()
        if stopped is not None:
            await stopped
