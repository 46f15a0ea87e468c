"""twistd's entry: ``Options`` and ``makeService``, the one composition root (DESIGN §1)."""

from __future__ import annotations

import gc
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

from twisted.application import strports
from twisted.application.service import IService, MultiService
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.error import CannotListenError
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python import usage
from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request, Site

from pharos.config import Config, ConfigError, Responses, load_config, read_peer_secret
from pharos.discovery.docker import DockerAPI, socket_from_env
from pharos.discovery.service import Discovery
from pharos.engine.fetch import make_client
from pharos.journal import Journal
from pharos.models import Fleet
from pharos.obs.decisions import DecisionLog
from pharos.obs.metrics import Metrics, MetricsPage
from pharos.obs.pages import Pages, mount, with_pages
from pharos.obs.reqlog import RequestLog
from pharos.peer.membership import Membership
from pharos.peer.node import PeerNode, TreqTransport
from pharos.peer.site import peer_site
from pharos.peer.snapshot import Replicas, restore_bytes
from pharos.peer.snapshot import build as build_snapshot
from pharos.peer.statefile import StateFile
from pharos.peer.wire import fingerprint
from pharos.placement import ReplicaRule
from pharos.policy import PolicyConfig
from pharos.prefix import PrefixIndex
from pharos.proxy.admin import ConfigAdmin
from pharos.proxy.auth import Keyring
from pharos.proxy.body import MAX_BODY_BYTES, bounded_request_factory
from pharos.proxy.channel import PathGuard, PublicSite
from pharos.proxy.conversation import ConversationState
from pharos.proxy.drain import Drain, Health, second_signal_ends
from pharos.proxy.public import PublicAPI
from pharos.proxy.stream_body import streaming_request_factory
from pharos.reload import ConfigWatcher, Sighup
from pharos.responses import ConversationStore, StoreCollector, read_key
from pharos.sched import Guards, Routing, Scheduler
from pharos.shadow import Shadow
from pharos.state.logs import default_feeds
from pharos.state.registry import BackendState
from pharos.state.state import LOAD_INTERVAL, State
from pharos.usage import Ledger
from pharos.watchdog import Watchdog

log = Logger()

# A factory per engine connection would log its start and stop at info, twice a request.
_HTTP11ClientFactory.noisy = False

#: Idle engine connections kept per backend: about the streams one engine serves at once
#: (vLLM's default ``max_num_seqs``, 256). A connection is idle only after it was in use, so
#: this bounds what a burst leaves open, not what is opened; a cap below the streams in flight
#: closed the surplus after each burst of replies and opened new ones (name resolution in a
#: thread, a TCP handshake) for the next: with 32, one new engine connection every two
#: requests at 64 clients on one engine (contrib/bench/workers-2026-12-02c).
POOL_PER_HOST = 256
#: Below the engines' keep-alive (uvicorn: 5 s): a POST on a connection the engine already
#: closed fails, and Twisted retries only idempotent requests (twisted#7843).
POOL_IDLE_SEC = 4


#: ``--log-level`` values; ``debug`` adds the request line.
LOG_LEVELS = ("info", "debug")


class Options(usage.Options):
    """``twistd pharos -c FILE`` (or ``--demo``): a config that does not parse never starts
    the service."""

    optParameters = [["config", "c", None, "the Pharos config file (YAML)"],
                     ["log-level", None, "info",
                      "info, or debug: also one line per request (spec section 13)"],
                     ["worker", None, None,
                      "internal: set by the supervisor of workers: N (pharos.workers)"]]
    optFlags = [["demo", None, "serve in front of three simulated engines on loopback"]]

    def postOptions(self) -> None:
        """Load and validate the config now, so twistd refuses to start on a bad file."""
        if self["log-level"] not in LOG_LEVELS:
            raise usage.UsageError(f"--log-level is one of {', '.join(LOG_LEVELS)}, not "
                                   f"{self['log-level']!r}")
        path = self["config"]
        if self["demo"]:
            try:
                self["parsed"] = load_config(path) if path else None
            except ConfigError as e:
                raise usage.UsageError(f"{path}: invalid config\n{e}") from None
            return
        if not path:
            raise usage.UsageError("-c/--config FILE is required (or --demo)")
        try:
            self["parsed"] = load_config(path)
        except ConfigError as e:
            raise usage.UsageError(f"{path}: invalid config\n{e}") from None
        except OSError as e:
            raise usage.UsageError(f"{path}: {e.strerror}") from None


class ListenError(Exception):
    """The public port cannot be bound; twistd prints this (cut to 100 bytes) and exits 1."""


class PharosService(MultiService):
    """The top of the service tree; children start in order and stop in reverse."""

    def __init__(self, config: Config, reactor: Any, load_interval: float = LOAD_INTERVAL,
                 config_path: str | None = None, request_log: bool = False,
                 docker_socket: str | None = None, resolver: Any = None) -> None:
        super().__init__()
        self.config = config
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.pool.maxPersistentPerHost = POOL_PER_HOST
        self.pool.cachedConnectionTimeout = POOL_IDLE_SEC
        self.client = make_client(reactor, self.pool)
        #: The Docker daemon (label discovery, ``docker://`` log feeds); None without one
        #: (``makeService`` finds it from the environment, tests pass a fake's socket).
        self.docker = DockerAPI(reactor, docker_socket) if docker_socket else None
        self.state = State(reactor, self.client, load_interval=load_interval,
                           log_feed_for=default_feeds(
                               reactor, self.docker.log_feed if self.docker else None))
        policy, guards = _routing(config)
        self.generation = 0
        fleet = _fleet(config, policy, self.generation)
        log_path = config.observability.shadow_log
        self.shadow_log = Journal(log_path, reactor) if log_path else None
        self.shadow = Shadow(reactor, fleet, lambda: self.sched.policy, self.shadow_log)
        self.peer_node: PeerNode | None = None
        self.sched = Scheduler(
            self.state, Routing(policy, guards, fleet.cost_models()),
            index=PrefixIndex(config.routing.prefix_entries), on_route=self.shadow.offer,
            on_prefix=None if config.peers is None else (
                lambda op: self.peer_node.push(op) if self.peer_node is not None else None))
        self.state.on_round = self._round
        u = config.usage
        #: Usage cells and quotas; the origin is this process until the state file keeps one.
        self.ledger = Ledger(reactor, origin=uuid.uuid4().hex, timezone=u.timezone,
                             retention_days=u.retention_days)
        self.public = PublicAPI(self.state, self.sched, self.client, reactor,
                                timeouts=config.timeouts,
                                keyring=Keyring(config.keys, config.tenants), ledger=self.ledger)
        #: The fleet's models (aliases, per-model policy, split, shadow; ``pharos.models``),
        #: one per config generation; shadow policies run off the request path.
        self.fleet = self.public.fleet = fleet
        self.public.shadow = self.shadow
        self._specs: list[Any] = []  # the backend specs discovery last handed over
        # on_done subscribers, each a surface of its own (DESIGN §4): the proxy imports none.
        self.metrics = Metrics(self.state, self.sched)
        self.metrics.shadow = self.shadow
        self.public.on_done.append(self.metrics.done)
        self.state.on_decision = self.metrics.decision
        self.journal = Journal(u.journal, reactor) if u.journal else None
        if self.journal is not None:
            journal = self.journal
            self.public.on_done.append(lambda done: journal.write(done.journal()))
            self.metrics.journals["usage"] = journal
        dl = config.observability.decision_log
        self.decision_log = (DecisionLog(dl.path, dl.sample_rate, reactor, self.state,
                                         config.policy) if dl is not None else None)
        if self.decision_log is not None:
            self.public.decision_log = self.decision_log
            self.public.on_done.append(self.decision_log.done)
            self.metrics.journals["decision_log"] = self.decision_log.journal
        self.request_log = RequestLog() if request_log else None
        if self.request_log is not None:
            self.public.on_done.append(self.request_log)
        self.pages: Pages = mount(self.public, self)
        self.state.on_down = self.public.backend_down
        #: Run in order after the first scrape round, before the public listener opens
        #: (state file, then peers' snapshots); and during drain after the streams ended.
        self.restore_sources: list[Callable[[], Deferred[None]]] = []
        self.on_leaving: list[Callable[[], Deferred[None]]] = []
        #: The replicated modules snapshots are taken from and merged into (spec §12).
        self.replicas = Replicas(self.state, self.sched.index, self.ledger, self.sched.roots)
        # Readiness and drain (§9): /healthz is 503 until the restore sources ran and from
        # the first moment of a drain; the public requests are tracked for the drain.
        self._reactor = reactor
        self.health = Health(restored=False)
        self.public.health = self.health
        self.drain = Drain(reactor, self.health, config.drain.grace, config.drain.timeout)
        #: The public listener (``build``): opened once restored, closed by the drain. None
        #: when the caller serves ``public_site`` itself (tests).
        self.public_listener: IService | None = None
        #: SIGTERM/SIGINT while stopping end the process at once (``makeService`` sets it).
        self.handle_signals = False
        #: The process is this service's own (``makeService``): once restored, what start-up
        #: built is moved out of the collector's reach (``gc.freeze``). Without it a full
        #: collection walked ~300k import-time objects, pausing the reactor up to 90 ms.
        self.freeze_gc = False
        self.stopping = False
        self.starting: Deferred[None] | None = None
        #: The state file (§12): the first restore source; started once restored, so a start
        #: that never finished restoring never overwrites it.
        self.state_file: StateFile | None = None
        if config.state_file is not None:
            self.state_file = StateFile(config.state_file, self.replicas, reactor,
                                        in_thread=_in_thread(reactor))
            self.restore_sources.append(self.state_file.restore)
        self.peer_secret: bytes | None = None
        if config.peers is not None:
            # Checked by load_config too; read again here, so a secret that went away since
            # refuses the start rather than running peers unauthenticated.
            self.peer_secret = read_peer_secret(config.peers.secret_file)
            node = self.peer_node = PeerNode(
                self.ledger.origin, lambda: fingerprint(self.config), self.sched, self.ledger,
                TreqTransport(self.client, self.peer_secret), Membership(config.peers),
                reactor, restore=lambda data: restore_bytes(self.replicas, data, reactor))
            self.ledger.on_reserve = node.kick
            self.metrics.peers = node
            self.pages.status_page.peers = node
            self.restore_sources.append(node.pull_all)
            self.on_leaving.append(node.leave)
        if config.responses.store:
            # Checked by load_config too; read again here, so a key that went away since
            # refuses the start rather than running without one.
            self.public.conversations = conversation_state(config.responses, reactor)
            assert self.public.conversations.store is not None
            self.metrics.registry.register(StoreCollector(self.public.conversations.store))
        #: The backend set: static ∪ Docker ∪ DNS (spec §10), before the scrapers it feeds.
        self.discovery = Discovery(self._set_backends, reactor, config.backends,
                                   config.dns_backends, docker=self.docker, resolver=resolver)
        self.discovery.setServiceParent(self)
        self.state.service.setServiceParent(self)
        Watchdog(self.sched, reactor, older_than=config.drain.timeout).setServiceParent(self)
        #: Hot reload (§10): the file watched, SIGHUP and ``POST /admin/reload``; None
        #: without a config file (the demo, tests).
        self.watcher: ConfigWatcher | None = None
        if config_path is not None:
            self.watcher = ConfigWatcher(config_path, config, self.reconfigure)
            self.watcher.clock = reactor
            self.watcher.setServiceParent(self)
            Sighup(reactor, self.watcher.reload).setServiceParent(self)
            self.public.reload_config = self.watcher.reload
        #: ``GET``/``PATCH /admin/config``: the config in effect, patched as a reload applies.
        self.public.config_admin = ConfigAdmin(lambda: self.config, self._apply_patch,
                                               lambda: self.generation, config_path)

    def _apply_patch(self, config: Config) -> None:
        """A merge patch (``PATCH /admin/config``) put in force as a reload is; the file
        watcher compares the file's next change with it, so that change replaces it."""
        self.reconfigure(config)
        if self.watcher is not None:
            self.watcher.current = config

    def reconfigure(self, config: Config) -> None:
        """Apply a reloaded config's live fields (``config.LIVE_FIELDS``). Each is swapped
        whole, so a request sees the old value or the new one, never a mix: the key set (with
        its quotas and tenants), the policy's config and the scheduler's guards (read afresh
        by every pick), the timeouts (read by every new request); backends are added, removed
        and re-resolved (a changed spec), and requests in flight keep their engine."""
        self.config = config
        self.public.keyring = Keyring(config.keys, config.tenants)
        policy, guards = _routing(config)
        self.public.timeouts = config.timeouts
        # The fleet's models (issue 17): a new generation, its aliases composed into the
        # backends' (a changed rename re-resolves those backends), its routing and shadows.
        self.generation += 1
        old, fleet = self.fleet, _fleet(config, policy, self.generation)
        self.fleet = self.public.fleet = fleet
        self.sched.reconfigure(Routing(policy, guards, fleet.cost_models()))
        self.shadow.set_fleet(fleet)
        self.discovery.set_static(config.backends, config.dns_backends)
        if old.names != fleet.names:
            self._set_backends(self._specs)

    def _set_backends(self, specs: Any) -> None:
        """Discovery's backend set, with the fleet's aliases composed into each backend's."""
        self._specs = list(specs)
        self.state.set_backends(self.fleet.with_aliases(self._specs))

    def _round(self, backend: BackendState) -> None:
        """A scrape round ended: learn capacities from it, then re-run the waiters."""
        self.sched.learn_capacity(backend)
        self.sched.kick()

    def startService(self) -> None:
        """Start the children (Discovery hands the static backends to State first); once the
        first scrape round ended, run the restore sources, then open the public listener."""
        super().startService()
        if self.handle_signals:
            self._reactor.callWhenRunning(second_signal_ends, lambda: self.stopping)
        self.starting = Deferred.fromCoroutine(self._start())

    async def _start(self) -> None:
        """Spec §12 start-up: after the first scrape round (so prefix entries find their
        targets), the restore sources in order; then ``/healthz`` turns 200 and the public
        listener opens."""
        await self.state.when_ready()
        for source in self.restore_sources:
            if self.stopping:
                return
            try:
                await source()
            except Exception:
                log.failure("a restore source failed; starting without it")
        if self.stopping:
            return
        self.health.restored = True
        if self.freeze_gc:
            gc.collect()
            gc.freeze()
            log.info("{n} start-up objects frozen out of the collector's reach",
                     n=gc.get_freeze_count())
        if self.state_file is not None:
            self.state_file.setServiceParent(self)
        if self.public_listener is not None:
            try:
                self.public_listener.setServiceParent(self)
            except CannotListenError as e:
                log.critical("{why}; stopping", why=_listen_error(e))
                self._reactor.stop()
                return
            log.info("restored; public listener open on {listen}",
                     listen=self.config.listen.address)

    def privilegedStartService(self) -> None:
        """Bind the listeners; a busy port fails start-up with a message naming it."""
        try:
            super().privilegedStartService()
            if self.public_listener is not None:
                # It opens only after the restore (spec §12), but a busy port must fail the
                # start now, while twistd can still report it.
                _probe_listen(self.config.listen.strports())
        except CannotListenError as e:
            raise ListenError(_listen_error(e)) from None

    def stopService(self) -> Deferred[None]:
        """Stop the children, then close the engine connections."""
        d: Deferred[Any] = Deferred.fromCoroutine(self._stop())
        return d

    async def _stop(self) -> None:
        """Spec §9 drain when serving (``/healthz`` 503, grace, listener closed, streams
        finished or cut at the timeout), then ``on_leaving`` (the Leaving delta), the last
        state-file write, and the children in reverse order."""
        self.stopping = True
        listener = self.public_listener
        if listener is not None and listener.running:
            await self.drain.run(lambda: maybeDeferred(listener.disownServiceParent))
        for hook in self.on_leaving:
            try:
                await hook()
            except Exception:
                log.failure("an on_leaving hook failed")
        if self.state_file is not None and self.health.restored:
            await self.state_file.write()
        await super().stopService()
        await self.pool.closeCachedConnections()
        if self.journal is not None:
            await self.journal.close()
        if self.decision_log is not None:
            await self.decision_log.close()
        if self.shadow_log is not None:
            await self.shadow_log.close()


def _in_thread(reactor: Any) -> Callable[[Callable[[], Any]], Deferred[Any]]:
    """Blocking work (the state file's read and write) in the reactor's thread pool."""
    def run(f: Callable[[], Any]) -> Deferred[Any]:
        return deferToThreadPool(reactor, reactor.getThreadPool(), f)
    return run


def _listen_error(e: CannotListenError) -> str:
    why = e.socketError.strerror if isinstance(e.socketError, OSError) else e.socketError
    return f"cannot listen on {e.interface or '*'}:{e.port}: {why}"


def _probe_listen(description: str) -> None:
    """Raise ``CannotListenError`` if a ``tcp:`` strports address cannot be bound now (bound
    with SO_REUSEADDR as Twisted binds, then closed); other endpoint kinds are not probed."""
    parts = description.split(":")
    if parts[0] != "tcp" or len(parts) < 2 or not parts[1].isdigit():
        return
    port = int(parts[1])
    opts = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
    host = opts.get("interface", "")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)
        except OSError as e:
            raise CannotListenError(host, port, e) from None


def conversation_state(config: Responses, reactor: Any) -> ConversationState:
    """The ``/v1/responses`` conversation store of ``responses:`` (``pharos.responses``);
    ``ValueError`` naming the field when its key cannot be used."""
    assert config.key_file is not None
    try:
        key = read_key(config.key_file)
    except ValueError as e:
        raise ValueError(f"responses.key_file: {e}") from None
    return ConversationState(ConversationStore(
        key, reactor.seconds, max_responses=config.max_responses, max_age=config.max_age,
        max_bytes=config.max_bytes_per_conversation))


def _fleet(config: Config, policy: PolicyConfig, generation: int) -> Fleet:
    """The models in force for ``config`` (``models:``, ``routing.split``/``shadow``)."""
    r = config.routing
    return Fleet(config.models, policy, r.split, r.shadow, generation)


def _routing(config: Config) -> tuple[PolicyConfig, Guards]:
    """The policy's config and the scheduler's guards from ``policy:`` and ``routing:``."""
    r = config.routing
    policy = PolicyConfig(name=config.policy, kv_pressure_threshold=r.kv_pressure_threshold,
                          bounded_load_epsilon=r.bounded_load_epsilon,
                          session_affinity=r.session_affinity)
    guards = Guards(hot_prefix_utilization=r.hot_prefix_utilization,
                    eviction_pricing=r.eviction_pricing,
                    placement=ReplicaRule(utilization=r.replica_utilization,
                                          wait_bound_sec=r.load_wait_bound,
                                          swap_grouping=r.swap_grouping))
    return policy, guards


class WithMetrics(Resource):
    """``/metrics`` (no key, spec §13) in front of the rest of the public site."""

    isLeaf = True

    def __init__(self, inner: IResource, metrics: IResource) -> None:
        super().__init__()
        self.inner = inner
        self.metrics = metrics

    def render(self, request: Request) -> Any:
        inner = self.metrics if request.path == b"/metrics" else self.inner
        return inner.render(request)


def public_site(top: PharosService, max_body: int = MAX_BODY_BYTES) -> Site:
    """The public site: the Klein app behind the path guard, bodies bounded while they
    arrive, request heads bounded in time, requests tracked for the drain."""
    root = with_pages(PathGuard(top.public.app.resource()), top.pages)
    root = top.drain.wrap(WithMetrics(root, MetricsPage(top.metrics)))
    site = PublicSite(root, requestFactory=streaming_request_factory(bounded_request_factory(
        max_body, on_too_large=top.public.too_large)))
    site.head_deadline = top.config.timeouts.request_headers
    site.body_deadline = top.config.timeouts.request_body
    site.timeOut = top.config.timeouts.idle
    return site


def build(config: Config, reactor: Any, config_path: str | None = None,
          request_log: bool = False, docker_socket: str | None = None,
          listen: Callable[[str, Site], IService] = strports.service) -> PharosService:
    """The service tree for ``config`` on ``reactor``; ``config_path`` is watched for
    changes (hot reload); ``request_log``: one debug line per request; ``docker_socket``:
    the Docker daemon to discover labelled containers from; ``listen``: the listener
    service of a strports description and site (a worker adopts inherited sockets)."""
    top = PharosService(config, reactor, config_path=config_path, request_log=request_log,
                        docker_socket=docker_socket)
    if top.peer_node is not None and top.peer_secret is not None and config.peers is not None:
        # The peer listener first (spec §12), so instances starting together can pull
        # from each other before their public listeners open.
        listen(config.peers.listen.strports(),
               peer_site(top.peer_node, top.peer_secret,
                         lambda: build_snapshot(top.replicas, reactor)),
               ).setServiceParent(top)
        top.peer_node.setServiceParent(top)
    site = public_site(top)
    # Opened by PharosService once restored (a busy port still fails the start, probed).
    top.public_listener = listen(config.listen.strports(), site)
    return top


def makeService(options: Any) -> IService:
    """Wire the service tree from the parsed config (or the demo fleet)."""
    from twisted.internet import reactor

    if options["demo"]:
        from pharos.sim.demo import demo_service

        demo = demo_service(reactor, options["parsed"])
        for child in demo:  # type: ignore[attr-defined]
            if isinstance(child, PharosService):
                child.handle_signals = child.freeze_gc = True
        return demo
    config: Config = options["parsed"]
    if options["worker"] is None and config.workers > 1:
        from pharos.workers import Supervisor

        return Supervisor(config, options["config"], reactor, log_level=options["log-level"])
    docker_socket, why = socket_from_env(os.environ)
    if docker_socket is None:
        log.info("Docker discovery off: {why}", why=why)
    if options["worker"] is not None:
        from pharos.workers import worker_service

        return worker_service(config, options["config"], options["worker"], reactor,
                              request_log=options["log-level"] == "debug",
                              docker_socket=docker_socket)
    top = build(config, reactor, config_path=options["config"],
                request_log=options["log-level"] == "debug", docker_socket=docker_socket)
    top.handle_signals = top.freeze_gc = True
    return top
