"""Every core: ``workers: N`` processes behind one public port.

With ``workers: 1`` (the default) nothing here runs: twistd's process is Pharos. With more,
twistd's process is a ``Supervisor`` that serves nothing itself:

- **One port.** The supervisor binds the public address once with SO_REUSEPORT and never
  listens on it: the port is held, and a busy port still fails the start with the same
  message. Each worker, once its restore is done (as a single process opens its listener),
  binds its own listening socket beside it with SO_REUSEPORT, and the kernel spreads new
  connections over the workers' sockets by address hash; a worker that ends takes its socket
  out of the spread. (``LISTEN_MODES``: the alternative is one listening socket passed to
  every worker as fd 3, which keeps a dead worker's queued connections for the others but
  spreads a burst of simultaneous connections less evenly.)
- **Shared state through the peer protocol.** Each worker is a peer of the others over
  loopback (``pharos.peer``: prefix ops, gauges, usage cells and reservations, snapshot pulls
  at start), with a private listener the supervisor binds on 127.0.0.1 and passes as fd 4, a
  secret it makes for this run (a 0600 file in a 0700 directory), and a shorter tick than a
  mesh across machines (``WORKER_TICK``), so routing and quotas behave as one instance.
  Only worker 0 keeps the configured paths; worker ``i`` writes its state file and journals
  to ``PATH.workerI`` (one writer per file), and restores its own.
- **Signals reach every worker.** SIGTERM (or SIGINT) drains: the supervisor closes its
  socket and sends SIGTERM to every worker, each of which drains as a single process
  does, and it ends when they all have. SIGHUP is passed on to every worker; a
  worker answering ``POST /admin/reload`` reloads and sends SIGHUP to the supervisor, so its
  siblings reload too. Workers leave the terminal's process group (a Ctrl-C reaches them
  once, through the supervisor) and stop by themselves if the supervisor disappears.
- **A crashed worker is restarted** with the same index, sockets and paths, after a backoff
  that doubles from ``RESTART_MIN`` to ``RESTART_MAX`` and resets once a worker has run for
  ``STABLE_AFTER`` seconds.
- **/metrics shows each worker**: whichever worker answers collects every worker's
  exposition (its siblings' over their private listeners, with the secret), adds a
  ``worker`` label to every sample and serves them merged, with ``pharos_worker_up`` per
  worker (0 for one that did not answer within ``METRICS_TIMEOUT``).

The supervisor starts workers as ``twistd -n pharos -c FILE --worker SPEC`` (the spec is the
JSON of ``WorkerSpec``), so each worker reads the same file and runs exactly what a single
process runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import treq
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from treq.client import HTTPClient
from twisted.application.service import IService, Service
from twisted.internet import tcp
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import (
    IDelayedCall,
    IListeningPort,
    IReactorCore,
    IReactorFromThreads,
    IReactorProcess,
    IReactorSocket,
    IReactorTime,
)
from twisted.internet.protocol import ProcessProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from pharos.config import LISTEN_BACKLOG, Config, Listen, PeersConfig, UsageConfig
from pharos.periodic import Periodic
from pharos.service import ListenError, PharosService, listen_error

log = Logger()

#: Seconds between deltas from one worker to another (a mesh across machines uses
#: ``pharos.peer.node.TICK``, 0.2 s). A reservation against a budget goes on the next reactor
#: turn (``PeerNode.kick``) and an idle tick sends only a keep-alive, so the tick bounds how
#: late prefix records and gauges reach the siblings; a shorter one costs CPU on both sides.
WORKER_TICK: Final = 0.05
#: Restart backoff: the first restart after this many seconds, doubling up to the maximum.
RESTART_MIN: Final = 1.0
RESTART_MAX: Final = 30.0
#: A worker that ran this long before ending is restarted after ``RESTART_MIN`` again.
STABLE_AFTER: Final = 60.0
#: Seconds a sibling's metrics may take before it counts as down on this scrape.
METRICS_TIMEOUT: Final = 2.0
#: Seconds between a worker's checks that its supervisor is still there.
ORPHAN_CHECK: Final = 1.0
#: Seconds past the drain's own timeout and grace before a worker that has not ended is killed.
STOP_MARGIN: Final = 30.0
#: How the workers share the public port (``PHAROS_WORKERS_LISTEN``, for benchmarks):
#: ``reuseport``, a socket per worker with SO_REUSEPORT,
#: the kernel spreading connections by address hash; ``shared``, one socket, each worker
#: accepting one connection per wake-up, so the worker that wakes first takes the next one;
#: ``shared-burst``, the same socket with Twisted's accept loop (up to 100 connections per
#: wake-up: a burst of keep-alive clients lands mostly on one worker).
LISTEN_MODES: Final = ("reuseport", "shared", "shared-burst")
DEFAULT_LISTEN_MODE: Final = "reuseport"
#: The descriptors a worker finds its public and peer listeners on.
PUBLIC_FD: Final = 3
PEER_FD: Final = 4
#: The private route a worker serves its own exposition on (peer listener, with the secret).
METRICS_PATH: Final = b"/worker/metrics"
#: Listen addresses the worker's config carries for the adopted sockets (not TCP, so the
#: start-up probe of a busy port leaves them alone: the supervisor holds them).
PUBLIC_ADOPTED: Final = "adopted:public"
PEER_ADOPTED: Final = "adopted:peer"


class WorkerError(Exception):
    """A worker set-up that cannot run (a listen address that cannot be shared)."""


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What the supervisor tells worker ``index`` (``--worker`` JSON)."""

    index: int
    count: int
    family: int  # the public socket's address family
    members: tuple[str, ...]  # every worker's peer address, by index
    secret_file: str
    supervisor: int  # its pid: a worker whose parent changes stops
    mode: str = DEFAULT_LISTEN_MODE  # one of LISTEN_MODES
    host: str = ""  # the public address (``reuseport``: each worker binds it)
    port: int = 0

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> WorkerSpec:
        raw = json.loads(text)
        return cls(index=int(raw["index"]), count=int(raw["count"]), family=int(raw["family"]),
                   members=tuple(str(m) for m in raw["members"]),
                   secret_file=str(raw["secret_file"]), supervisor=int(raw["supervisor"]),
                   mode=str(raw.get("mode", DEFAULT_LISTEN_MODE)), host=str(raw.get("host", "")),
                   port=int(raw.get("port", 0)))


def worker_path(path: str, index: int) -> str:
    """Worker 0 keeps the configured path; worker ``i`` appends ``.workerI``."""
    return path if index == 0 else f"{path}.worker{index}"


def worker_config(config: Config, spec: WorkerSpec) -> Config:
    """The config one worker runs: the adopted listeners, its siblings as peers, its own
    state file and journals."""
    obs = config.observability
    if obs.decision_log is not None:
        obs = dataclasses.replace(obs, decision_log=dataclasses.replace(
            obs.decision_log, path=worker_path(obs.decision_log.path, spec.index)))
    usage: UsageConfig = config.usage
    if usage.journal is not None:
        usage = dataclasses.replace(usage, journal=worker_path(usage.journal, spec.index))
    return dataclasses.replace(
        config, listen=Listen(PUBLIC_ADOPTED),
        peers=PeersConfig(secret_file=spec.secret_file, listen=Listen(PEER_ADOPTED),
                    members=spec.members),
        state_file=None if config.state_file is None
        else worker_path(config.state_file, spec.index),
        usage=usage, observability=obs)


def public_address(config: Config) -> tuple[int, str, int]:
    """(family, host, port) of a TCP ``listen``; ``WorkerError`` for any other endpoint."""
    desc = config.listen.strports()
    parts = desc.replace("\\:", "\0").split(":")
    if parts[0] not in ("tcp", "tcp6") or len(parts) < 2 or not parts[1].isdigit():
        raise WorkerError(f"workers: {config.workers} needs a TCP listen address, not "
                          f"{config.listen.address!r}")
    opts = dict(p.replace("\0", ":").split("=", 1) for p in parts[2:] if "=" in p)
    host = opts.get("interface", "::" if parts[0] == "tcp6" else "")
    family = socket.AF_INET6 if parts[0] == "tcp6" or ":" in host else socket.AF_INET
    return family, host, int(parts[1])


# --- the supervisor --------------------------------------------------------------------------


class _Worker(ProcessProtocol):
    """One running worker process: its output relayed line by line to the log."""

    def __init__(self, supervisor: Supervisor, index: int, started: float) -> None:
        self.supervisor = supervisor
        self.index = index
        self.started = started
        self.pid: int | None = None
        self.ended: Deferred[None] = Deferred()
        self._partial = {1: b"", 2: b""}

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.pid = self.transport.pid
        self.transport.closeStdin()

    def childDataReceived(self, childFD: int, data: bytes) -> None:  # noqa: N803
        lines = (self._partial.get(childFD, b"") + data).split(b"\n")
        self._partial[childFD] = lines.pop()
        for line in lines:
            self.supervisor.relay(self.index, line)

    def processEnded(self, reason: Failure) -> None:
        for rest in self._partial.values():
            if rest:
                self.supervisor.relay(self.index, rest)
        self.supervisor.ended(self, reason)
        self.ended.callback(None)

    def signal(self, name: str) -> None:
        try:
            if self.transport is not None:
                self.transport.signalProcess(name)
        except Exception:  # already gone: processEnded follows
            pass


class Supervisor(Service):
    """twistd's service with ``workers: N`` > 1 (see the module's docstring)."""

    def __init__(self, config: Config, config_path: str, reactor: IReactorTime,
                 log_level: str = "info", argv0: list[str] | None = None) -> None:
        self.config = config
        self.config_path = os.path.abspath(config_path)
        self.reactor = reactor
        self.log_level = log_level
        #: How a worker is started (before its arguments): twistd in this interpreter.
        self.argv0 = argv0 if argv0 is not None else [
            sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]
        self.count = config.workers
        self.public: socket.socket | None = None
        self.peers: list[socket.socket] = []
        self.workers: dict[int, _Worker] = {}
        self.failures: dict[int, int] = {}
        self.restarts: dict[int, IDelayedCall] = {}  # pending restart calls by index
        self.starts: dict[int, int] = {}
        self.stopping = False
        self.tmp: str | None = None
        self.secret_file = ""
        self.family: int = socket.AF_INET
        self.host = ""
        self.port = 0
        mode = os.environ.get("PHAROS_WORKERS_LISTEN", DEFAULT_LISTEN_MODE)
        if mode not in LISTEN_MODES:
            raise WorkerError(f"PHAROS_WORKERS_LISTEN is one of {', '.join(LISTEN_MODES)}, "
                              f"not {mode!r}")
        self.mode = mode

    # --- sockets -----------------------------------------------------------------------

    def privilegedStartService(self) -> None:
        """Bind the public socket (a busy port fails the start, naming it) and one loopback
        peer socket per worker."""
        super().privilegedStartService()
        family, host, port = public_address(self.config)
        self.family, self.host = family, host
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.mode == "reuseport":
                # Bound, never listening: the port is held (and a busy one fails the start)
                # while the workers' own sockets, bound beside it, take the connections.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                s.bind((host, port))
            else:
                s.bind((host, port))
                s.listen(LISTEN_BACKLOG)
            self.port = s.getsockname()[1]
        except OSError as e:
            s.close()
            raise ListenError(listen_error(CannotListenError(host, port, e))) from None
        s.setblocking(False)
        s.set_inheritable(True)
        self.public = s
        for _ in range(self.count):
            p = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            p.bind(("127.0.0.1", 0))
            p.listen(LISTEN_BACKLOG)
            p.setblocking(False)
            p.set_inheritable(True)
            self.peers.append(p)
        self.tmp = tempfile.mkdtemp(prefix="pharos-workers-")
        os.chmod(self.tmp, 0o700)
        self.secret_file = os.path.join(self.tmp, "peer-secret")
        fd = os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))

    def startService(self) -> None:
        super().startService()
        if self.public is None:
            self.privilegedStartService()
        from pharos.reload import Sighup

        self._sighup = Sighup(IReactorFromThreads(self.reactor), self.reload_all)
        self._sighup.startService()
        # The bound port, not the configured one: ``listen: HOST:0`` lets the kernel choose.
        host = f"[{self.host}]" if ":" in self.host else self.host or "0.0.0.0"
        log.info("{n} workers on {host}:{port}", n=self.count, host=host, port=self.port)
        for i in range(self.count):
            self.spawn(i)

    def members(self) -> tuple[str, ...]:
        return tuple(f"127.0.0.1:{p.getsockname()[1]}" for p in self.peers)

    def spawn(self, index: int) -> None:
        """Start worker ``index`` with the public socket as fd 3 and its peer socket as 4."""
        self.restarts.pop(index, None)
        if self.stopping or self.public is None:
            return
        spec = WorkerSpec(index, self.count, self.family, self.members(), self.secret_file,
                          os.getpid(), self.mode, self.host, self.port)
        args = [*self.argv0, "-n", "--pidfile=", "pharos", "-c", self.config_path,
                "--log-level", self.log_level, "--worker", spec.encode()]
        proto = _Worker(self, index, self.reactor.seconds())
        self.workers[index] = proto
        self.starts[index] = self.starts.get(index, 0) + 1
        fds: dict[int, Any] = {0: "w", 1: "r", 2: "r", PEER_FD: self.peers[index].fileno()}
        if self.mode != "reuseport":
            fds[PUBLIC_FD] = self.public.fileno()
        IReactorProcess(self.reactor).spawnProcess(proto, args[0], args, env=dict(os.environ),
                                                   childFDs=fds)
        log.info("worker {index} started (pid {pid}, start {n})", index=index, pid=proto.pid,
                 n=self.starts[index])

    def relay(self, index: int, line: bytes) -> None:
        """A worker's log line, in this log (less the worker's own timestamp)."""
        text = line.decode("utf-8", "replace").rstrip()
        stamp, sep, rest = text.partition(" ")
        if sep and stamp[:4].isdigit() and rest.startswith("["):
            text = rest
        log.info("worker {index}: {line}", index=index, line=text)

    def ended(self, proto: _Worker, reason: Failure) -> None:
        """A worker ended: expected while stopping; otherwise restarted after a backoff."""
        index = proto.index
        if self.workers.get(index) is proto:
            del self.workers[index]
        code = getattr(reason.value, "exitCode", None)
        sig = getattr(reason.value, "signal", None)
        how = f"signal {sig}" if sig else f"exit code {code}"
        if self.stopping:
            log.info("worker {index} (pid {pid}) stopped: {how}", index=index, pid=proto.pid,
                     how=how)
            return
        ran = self.reactor.seconds() - proto.started
        if ran >= STABLE_AFTER:
            self.failures[index] = 0
        fails = self.failures.get(index, 0)
        delay = min(RESTART_MAX, RESTART_MIN * 2 ** fails)
        self.failures[index] = fails + 1
        log.error("worker {index} (pid {pid}) ended after {ran:.1f} s ({how}); restarting "
                  "it in {delay:g} s", index=index, pid=proto.pid, ran=ran, how=how,
                  delay=delay)
        self.restarts[index] = self.reactor.callLater(delay, self.spawn, index)

    # --- signals -------------------------------------------------------------------------

    def reload_all(self) -> None:
        """SIGHUP: every worker reads the config file again."""
        for proto in list(self.workers.values()):
            proto.signal("HUP")

    def stopService(self) -> Deferred[None]:
        """Drain: close this copy of the public socket, SIGTERM every worker (each drains as
        a single process does) and wait for them all; one still there after the drain's own
        limits plus ``STOP_MARGIN`` is killed."""
        super().stopService()
        return Deferred.fromCoroutine(self._stop())

    async def _stop(self) -> None:
        self.stopping = True
        if getattr(self, "_sighup", None) is not None:
            self._sighup.stopService()
        for call in self.restarts.values():
            if call.active():
                call.cancel()
        self.restarts.clear()
        if self.public is not None:
            self.public.close()
        running = list(self.workers.values())
        log.info("stopping: draining {n} workers", n=len(running))
        for proto in running:
            proto.signal("TERM")
        limit = self.config.drain.grace + self.config.drain.timeout + STOP_MARGIN
        kill = self.reactor.callLater(limit, self._kill_all)
        await DeferredList([p.ended for p in running])
        if kill.active():
            kill.cancel()
        for p in self.peers:
            p.close()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _kill_all(self) -> None:
        for proto in list(self.workers.values()):
            log.error("worker {index} did not end in time: killed", index=proto.index)
            proto.signal("KILL")


# --- a worker --------------------------------------------------------------------------------


class _OneAcceptPort(tcp.Port):
    """A listening port that accepts one connection per wake-up (``shared`` mode): every
    worker is woken for a new connection on the shared socket and the first to get there
    takes it, so connections go to the worker with time to spare, not all of a burst to
    whichever woke first."""

    @property
    def numberAccepts(self) -> int:
        return 1

    @numberAccepts.setter
    def numberAccepts(self, value: int) -> None:
        pass


class AdoptedPort(Service):
    """A listener on an inherited listening socket (or, ``reuseport``, a socket of its own
    bound beside the supervisor's): opened when started, closed when stopped (the drain),
    the inherited descriptor closed once adopted."""

    def __init__(self, reactor: IReactorSocket, fd: int, family: int, factory: Site,
                 mode: str = "shared-burst", address: tuple[str, int] | None = None) -> None:
        self.reactor = reactor
        self.fd = fd
        self.family = family
        self.factory = factory
        self.mode = mode
        self.address = address
        self.port: IListeningPort | None = None

    def startService(self) -> None:
        super().startService()
        if self.port is not None:
            return
        if self.mode == "reuseport":
            assert self.address is not None
            s = socket.socket(self.family, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(self.address)
            s.listen(LISTEN_BACKLOG)
            s.setblocking(False)
            self.port = self.reactor.adoptStreamPort(
                s.fileno(), socket.AddressFamily(self.family), self.factory)  # type: ignore[arg-type]
            s.close()
            return
        if self.mode == "shared":
            self.port = _OneAcceptPort._fromListeningDescriptor(
                self.reactor, self.fd, self.family, self.factory)
            self.port.startListening()
        else:
            self.port = self.reactor.adoptStreamPort(
                self.fd, socket.AddressFamily(self.family), self.factory)  # type: ignore[arg-type]
        os.close(self.fd)

    def stopService(self) -> Deferred[None] | None:
        super().stopService()
        if self.port is None:
            return None
        d: Deferred[None] = Deferred.fromCoroutine(_stop_listening(self.port))
        return d


async def _stop_listening(port: IListeningPort) -> None:
    stopped = port.stopListening()
    if stopped is not None:
        await stopped


class OwnMetrics(Resource):
    """On a worker's peer listener: ``GET /worker/metrics`` (the secret as bearer) is this
    worker's own exposition; every other path goes to the peer site."""

    isLeaf = True

    def __init__(self, inner: IResource, exposition: Callable[[], bytes], secret: bytes) -> None:
        super().__init__()
        self.inner = inner
        self.exposition = exposition
        self.secret = secret

    def render(self, request: Request) -> Any:
        if request.path != METRICS_PATH:
            return self.inner.render(request)
        from pharos.peer.site import authorized

        if not authorized(request.getHeader(b"authorization"), self.secret):
            request.setResponseCode(401)
            return b"peer secret required\n"
        request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
        return self.exposition()


def label_and_merge(pages: dict[int, bytes | None]) -> bytes:
    """Worker expositions (None: it did not answer) as one: every sample gains a ``worker``
    label, families of the same name are merged, and ``pharos_worker_up`` says who
    answered."""
    families: dict[tuple[str, str], Metric] = {}
    up = Metric("pharos_worker_up", "Whether the worker answered this scrape (workers: N)",
                "gauge")
    for index in sorted(pages):
        page = pages[index]
        up.samples.append(Sample("pharos_worker_up", {"worker": str(index)},
                                 0.0 if page is None else 1.0))
        if page is None:
            continue
        for fam in text_string_to_metric_families(page.decode("utf-8")):
            merged = families.get((fam.name, fam.type))
            if merged is None:
                merged = families[(fam.name, fam.type)] = Metric(
                    fam.name, fam.documentation, fam.type, fam.unit)
            for s in fam.samples:
                merged.samples.append(s._replace(labels={**s.labels, "worker": str(index)}))

    class Collected:
        def collect(self) -> list[Metric]:
            return [up, *families.values()]

    out: bytes = generate_latest(Collected())
    return out


class WorkersMetrics(Resource):
    """``/metrics`` on a worker's public port: every worker's samples, labelled."""

    isLeaf = True

    def __init__(self, spec: WorkerSpec, exposition: Callable[[], bytes], client: HTTPClient,
                 secret: bytes, clock: IReactorTime) -> None:
        super().__init__()
        self.spec = spec
        self.exposition = exposition
        self.client = client
        self.auth = b"Bearer " + secret
        self.clock = clock

    async def _page(self, index: int) -> bytes | None:
        if index == self.spec.index:
            return self.exposition()
        try:
            d = self.client.get(f"http://{self.spec.members[index]}{METRICS_PATH.decode()}",
                                headers=Headers({b"Authorization": [self.auth]}),
                                timeout=METRICS_TIMEOUT)
            response = await d
            body: bytes = await treq.content(response)
        except Exception as e:
            log.warn("metrics: worker {index} did not answer: {why}", index=index,
                     why=str(e) or type(e).__name__)
            return None
        return body if response.code == 200 else None

    async def _all(self) -> bytes:
        pages = {}
        for i in range(self.spec.count):
            pages[i] = await self._page(i)
        return label_and_merge(pages)

    def render_GET(self, request: Request) -> Any:
        def done(body: bytes) -> None:
            request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
            request.setHeader(b"content-length", b"%d" % len(body))
            if request.method != b"HEAD":
                request.write(body)
            request.finish()

        def failed(f: Failure) -> None:
            log.failure("metrics: merging the workers' pages failed", f)
            request.setResponseCode(500)
            request.finish()

        d = Deferred.fromCoroutine(self._all())
        d.addCallbacks(done, failed)
        request.notifyFinish().addErrback(lambda _: d.cancel())
        return NOT_DONE_YET

    render_HEAD = render_GET


def orphaned(reactor: IReactorCore, supervisor: int) -> Periodic:
    """Stops the reactor (a drain) when the supervisor that started this worker is gone."""
    fired: list[bool] = []

    def check() -> None:
        if not fired and os.getppid() != supervisor:
            fired.append(True)
            log.error("the supervisor (pid {pid}) is gone: stopping", pid=supervisor)
            reactor.stop()

    return Periodic(IReactorTime(reactor), ORPHAN_CHECK, check, what="the supervisor check",
                    now=True)


def worker_service(config: Config, config_path: str, spec_text: str, reactor: IReactorTime,
                   request_log: bool = False, docker_socket: str | None = None) -> IService:
    """Worker ``spec.index``'s service tree: a whole Pharos (``PharosService.from_config``)
    on the adopted sockets, with its siblings as peers, every worker's series on its
    ``/metrics``, and a reload it answers passed on to its siblings."""
    spec = WorkerSpec.decode(spec_text)
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # out of the terminal's group: Ctrl-C reaches the supervisor only
    with open(spec.secret_file, "rb") as f:
        secret = f.read().strip()

    def listen(description: str, site: Site) -> IService:
        if description == PUBLIC_ADOPTED:
            return AdoptedPort(IReactorSocket(reactor), PUBLIC_FD, spec.family, site, spec.mode,
                               (spec.host, spec.port))
        if description == PEER_ADOPTED:
            site.log = lambda request: None  # type: ignore[method-assign]  # deltas: 50/s
            return AdoptedPort(IReactorSocket(reactor), PEER_FD, socket.AF_INET, site)
        raise WorkerError(f"a worker has no listener for {description!r}")

    def reload_siblings() -> None:
        with contextlib.suppress(OSError):
            os.kill(spec.supervisor, signal.SIGHUP)  # the siblings read the file too

    top = PharosService.from_config(
        reactor, worker_config(config, spec), config_path=config_path,
        request_log=request_log, docker_socket=docker_socket, listen=listen,
        own_process=True, peer_tick=WORKER_TICK,
        # Reloads compare the file with the file, not with this worker's listeners and paths.
        watched=config, after_reload=reload_siblings,
        metrics_page=lambda metrics, client: WorkersMetrics(
            spec, metrics.exposition, client, secret, reactor),
        peer_resource=lambda inner, metrics: OwnMetrics(inner, metrics.exposition, secret),
        extra=[orphaned(IReactorCore(reactor), spec.supervisor)])
    log.info("worker {index} of {count}", index=spec.index, count=spec.count)
    return top
