"""``workers: N`` (issue 16 item 3): the config field, the worker's config and spec, the
merged /metrics page, and the supervisor's restart backoff (on a fake reactor)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.error import ProcessTerminated
from twisted.internet.interfaces import IReactorFromThreads, IReactorProcess
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from zope.interface import implementer

from pharos import config as cfg
from pharos.config import ConfigError, parse_config
from pharos.workers import (
    PEER_FD,
    PUBLIC_ADOPTED,
    PUBLIC_FD,
    RESTART_MAX,
    RESTART_MIN,
    STABLE_AFTER,
    Supervisor,
    WorkerError,
    WorkerSpec,
    label_and_merge,
    public_address,
    worker_config,
)


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse_config(text)
    return str(e.value).splitlines()


def test_workers_default_is_one() -> None:
    """No ``workers:`` (or null) is one process."""
    assert parse_config("").workers == 1
    assert parse_config("workers: null\n").workers == 1
    assert parse_config("workers: 3\n").workers == 3


def test_workers_auto_is_the_available_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` resolves to the cores this process may run on (taskset narrows them)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 5})
    assert parse_config("workers: auto\n").workers == 3


@pytest.mark.parametrize("value", ["0", "-2", "65", "many", "true", "2.5", "'2'", "[2]"])
def test_invalid_workers_are_refused_naming_the_field(value: str) -> None:
    """Anything but 1..64 or auto is refused with a message naming ``workers``."""
    msgs = errors(f"workers: {value}\n")
    assert any(m.startswith("workers: expected an integer from 1 to 64 or auto") for m in msgs)


def test_workers_with_peers_are_refused(tmp_path: Path) -> None:
    """Several workers inside a mesh of instances is refused (not built), with a message."""
    secret = tmp_path / "s"
    secret.write_text("x")
    msgs = errors(f"workers: 2\npeers: {{secret_file: {secret}, members: ['a:1']}}\n")
    assert any(m.startswith("workers: more than one worker with peers:") for m in msgs)
    assert parse_config(f"workers: 1\npeers: {{secret_file: {secret}, members: ['a:1']}}\n")


def test_workers_change_needs_a_restart() -> None:
    """A reload that changes ``workers`` applies nothing live and names it."""
    live, restart = cfg.reload_diff(parse_config("workers: 1\n"), parse_config("workers: 2\n"))
    assert (live, restart) == ([], ["workers"])


def test_spec_round_trips() -> None:
    """The ``--worker`` JSON decodes to the spec the supervisor encoded."""
    spec = WorkerSpec(1, 2, socket.AF_INET, ("127.0.0.1:1", "127.0.0.1:2"), "/s", 42,
                      "reuseport", "127.0.0.1", 8090)
    assert WorkerSpec.decode(spec.encode()) == spec


def test_reuseport_mode_holds_the_port_and_passes_no_socket(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In ``reuseport`` mode (the default) the supervisor holds the port bound (not
    listening) and each worker is told the address to bind beside it, with no fd 3; an
    unknown mode is refused, naming the variable."""
    path = tmp_path / "c.yaml"
    path.write_text("listen: 127.0.0.1:0\nworkers: 2\n")
    monkeypatch.delenv("PHAROS_WORKERS_LISTEN", raising=False)
    reactor = FakeReactor()
    sup = Supervisor(cfg.load_config(path), str(path), reactor, argv0=["twistd"])
    sup.startService()
    try:
        for _, args, fds in reactor.spawned:
            assert PUBLIC_FD not in fds
            spec = WorkerSpec.decode(args[args.index("--worker") + 1])
            assert (spec.mode, spec.host) == ("reuseport", "127.0.0.1")
            assert spec.port == sup.port != 0
    finally:
        sup.stopService()
    monkeypatch.setenv("PHAROS_WORKERS_LISTEN", "fastest")
    with pytest.raises(WorkerError, match="PHAROS_WORKERS_LISTEN"):
        Supervisor(cfg.load_config(path), str(path), FakeReactor(), argv0=["twistd"])


def test_worker_config_adopts_listeners_and_splits_paths() -> None:
    """A worker listens on the adopted sockets, has its siblings as peers, and worker 1
    writes its own state file and journals (worker 0 keeps the configured ones)."""
    c = parse_config("listen: 127.0.0.1:8090\nworkers: 2\nstate_file: /d/state\n"
                     "usage: {journal: /d/usage.jsonl}\n"
                     "observability: {decision_log: {path: /d/dl.jsonl}}\n")
    members = ("127.0.0.1:1", "127.0.0.1:2")
    w0 = worker_config(c, WorkerSpec(0, 2, socket.AF_INET, members, "/s", 1))
    w1 = worker_config(c, WorkerSpec(1, 2, socket.AF_INET, members, "/s", 1))
    assert w0.listen.strports() == PUBLIC_ADOPTED
    assert w0.peers is not None and w0.peers.members == members
    assert w0.peers.secret_file == "/s"
    assert (w0.state_file, w0.usage.journal) == ("/d/state", "/d/usage.jsonl")
    assert w1.state_file == "/d/state.worker1"
    assert w1.usage.journal == "/d/usage.jsonl.worker1"
    assert w1.observability.decision_log is not None
    assert w1.observability.decision_log.path == "/d/dl.jsonl.worker1"
    assert (w1.keys, w1.backends, w1.routing) == (c.keys, c.backends, c.routing)


def test_public_address_needs_tcp() -> None:
    """The shared socket is bound from a TCP listen address; a UNIX one is refused, named."""
    assert public_address(parse_config("listen: 127.0.0.1:8090\n")) == (
        socket.AF_INET, "127.0.0.1", 8090)
    assert public_address(parse_config("listen: ':8090'\n")) == (socket.AF_INET, "", 8090)
    assert public_address(parse_config("listen: '[::1]:8090'\n")) == (
        socket.AF_INET6, "::1", 8090)
    with pytest.raises(WorkerError, match="TCP listen address"):
        public_address(parse_config("listen: unix:/tmp/p.sock\n"))
    msgs = errors("listen: unix:/tmp/p.sock\nworkers: 2\n")
    assert any(m.startswith("workers: more than one worker needs a TCP listen address")
               for m in msgs)


PAGE0 = b"""# HELP pharos_requests_total Finished requests
# TYPE pharos_requests_total counter
pharos_requests_total{key="a",status="200"} 3.0
# HELP pharos_inflight In flight
# TYPE pharos_inflight gauge
pharos_inflight 1.0
"""
PAGE1 = b"""# HELP pharos_requests_total Finished requests
# TYPE pharos_requests_total counter
pharos_requests_total{key="a",status="200"} 5.0
"""


def test_merged_metrics_label_each_worker_and_say_who_answered() -> None:
    """The merged page has each worker's samples with a ``worker`` label, one family per
    name (a valid exposition), and ``pharos_worker_up`` 0 for a worker that did not answer."""
    text = label_and_merge({0: PAGE0, 1: PAGE1, 2: None}).decode()
    assert text.count("# TYPE pharos_requests_total counter") == 1
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    reqs = {s.labels["worker"]: s.value for s in fams["pharos_requests"].samples}
    assert reqs == {"0": 3.0, "1": 5.0}
    up = {s.labels["worker"]: s.value for s in fams["pharos_worker_up"].samples}
    assert up == {"0": 1.0, "1": 1.0, "2": 0.0}
    assert [s.labels for s in fams["pharos_inflight"].samples] == [{"worker": "0"}]


class FakeTransport:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.signals: list[str] = []

    def closeStdin(self) -> None:
        pass

    def signalProcess(self, name: str) -> None:
        self.signals.append(name)


@implementer(IReactorProcess, IReactorFromThreads)
class FakeReactor(Clock):
    """A clock that records spawned processes."""

    def __init__(self) -> None:
        super().__init__()
        self.spawned: list[tuple[Any, list[str], dict[int, Any]]] = []

    def callFromThread(self, callable: Any, *args: Any, **kw: Any) -> None:
        callable(*args, **kw)

    def spawnProcess(self, proto: Any, exe: Any, args: Any, env: Any = None,
                     path: Any = None, uid: Any = None, gid: Any = None, usePTY: Any = False,  # noqa: N803
                     childFDs: Any = None) -> Any:  # noqa: N803
        proto.makeConnection(FakeTransport(1000 + len(self.spawned)))
        self.spawned.append((proto, args, childFDs))


def signals(proto: Any) -> list[str]:
    sent: list[str] = proto.transport.signals
    return sent


def crash(proto: Any) -> None:
    proto.processEnded(Failure(ProcessTerminated(exitCode=None, signal=9)))


def test_supervisor_passes_sockets_and_restarts_a_crashed_worker_with_backoff(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(``shared`` mode) Each worker gets the public socket as fd 3 and its peer socket as
    fd 4; a worker
    that ends is started again with the same index after ``RESTART_MIN``, doubling while it
    keeps crashing, capped at ``RESTART_MAX``, and back to the minimum after running
    ``STABLE_AFTER``; SIGHUP reaches every worker; stopping sends SIGTERM and restarts
    nothing."""
    path = tmp_path / "c.yaml"
    path.write_text("listen: 127.0.0.1:0\nworkers: 2\n")
    monkeypatch.setenv("PHAROS_WORKERS_LISTEN", "shared")
    reactor = FakeReactor()
    sup = Supervisor(cfg.load_config(path), str(path), reactor, argv0=["twistd"])
    sup.startService()
    try:
        assert len(reactor.spawned) == 2
        public = sup.public
        assert public is not None
        for i, (_, args, fds) in enumerate(reactor.spawned):
            assert fds[PUBLIC_FD] == public.fileno()
            assert fds[PEER_FD] == sup.peers[i].fileno()
            spec = WorkerSpec.decode(args[args.index("--worker") + 1])
            assert spec.index == i and len(spec.members) == 2
        delays = []
        for _ in range(7):
            proto = sup.workers[1]
            before = len(reactor.spawned)
            crash(proto)
            call = sup.restarts[1]
            delays.append(call.getTime() - reactor.seconds())
            reactor.advance(delays[-1])
            assert len(reactor.spawned) == before + 1
        assert delays == [RESTART_MIN * 2 ** i for i in range(5)] + [RESTART_MAX, RESTART_MAX]
        reactor.advance(STABLE_AFTER)
        crash(sup.workers[1])
        assert sup.restarts[1].getTime() - reactor.seconds() == RESTART_MIN
        reactor.advance(RESTART_MIN)
        sup.reload_all()
        assert all(signals(p) == ["HUP"] for p in sup.workers.values())
    finally:
        d = sup.stopService()
    assert all(signals(p)[-1] == "TERM" for p in sup.workers.values())
    before = len(reactor.spawned)
    for proto in list(sup.workers.values()):
        crash(proto)
    reactor.advance(RESTART_MAX * 2)
    assert len(reactor.spawned) == before
    assert d.called
