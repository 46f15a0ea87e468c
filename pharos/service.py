"""One Pharos process as a service tree. ``PharosService.from_config`` makes every
collaborator once, in dependency order, and hands each to the objects that use it; nothing is
wired afterwards. The live-reloadable part of the config is one immutable value
(``pharos.proxy.live``) that a reload swaps whole."""

from __future__ import annotations

import gc
import socket
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import attr
from treq.client import HTTPClient
from twisted.application.service import IService, MultiService
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import (
    IReactorCore,
    IReactorFromThreads,
    IReactorThreads,
    IReactorTime,
)
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory
from twisted.web.resource import IResource
from twisted.web.server import Site

from pharos.config import (
    Backend,
    Config,
    Reloaded,
    Responses,
    exposure_warning,
    read_peer_secret,
)
from pharos.discovery.docker import DockerAPI
from pharos.discovery.service import Discovery
from pharos.engine.fetch import make_client
from pharos.journal import Journal
from pharos.models import Fleet
from pharos.obs.decisions import DecisionLog
from pharos.obs.live import LiveMap
from pharos.obs.metrics import Metrics, MetricsPage
from pharos.obs.pages import Pages
from pharos.obs.reqlog import RequestLog
from pharos.obs.status import RecentRequests, StatusPage
from pharos.peer.membership import Membership
from pharos.peer.node import TICK, PeerNode, TreqTransport
from pharos.peer.site import peer_site
from pharos.peer.snapshot import Replicas, restore_bytes
from pharos.peer.snapshot import build as build_snapshot
from pharos.peer.statefile import StateFile
from pharos.peer.wire import fingerprint
from pharos.placement import ReplicaRule
from pharos.policy import PolicyConfig
from pharos.prefix import PrefixIndex, PrefixOp
from pharos.proxy.admin import ConfigAdmin
from pharos.proxy.admin_api import AdminAPI
from pharos.proxy.body import MAX_BODY_BYTES, bounded_request_factory
from pharos.proxy.channel import PublicSite
from pharos.proxy.conversation import ConversationState
from pharos.proxy.done import Done
from pharos.proxy.drain import Drain, Health, HealthPage, second_signal_ends
from pharos.proxy.exchange import EngineLeg, Inflight
from pharos.proxy.live import Live, LiveConfig
from pharos.proxy.manage import ModelManager
from pharos.proxy.public import PublicAPI
from pharos.proxy.site import Authorized, MetricsGate, PublicRoot
from pharos.proxy.stream_body import streaming_request_factory
from pharos.reload import ConfigWatcher, Sighup
from pharos.responses import ConversationStore, StoreCollector, read_key
from pharos.sched import Guards, RouteSettings, Scheduler
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
#: thread, a TCP handshake) for the next.
POOL_PER_HOST = 256
#: Below the engines' keep-alive (uvicorn: 5 s): a POST on a connection the engine already
#: closed fails, and Twisted retries only idempotent requests (twisted#7843).
POOL_IDLE_SEC = 4

#: A listener service for a strports description and a site (``strports.service``; a worker
#: adopts inherited sockets instead).
Listen = Callable[[str, Site], IService]


class ListenError(Exception):
    """The public port cannot be bound; twistd prints this (cut to 100 bytes) and exits 1."""


def listen_error(e: CannotListenError) -> str:
    """What a port that cannot be bound is reported as."""
    why = e.socketError.strerror if isinstance(e.socketError, OSError) else e.socketError
    return f"cannot listen on {e.interface or '*'}:{e.port}: {why}"


def routing(config: Config, fleet: Fleet) -> RouteSettings:
    """The scheduler's reloadable settings: the policy's config, the guards and the models'
    cost models."""
    return RouteSettings(policy_config(config), guards_of(config), fleet.cost_models())


def guards_of(config: Config) -> Guards:
    """The scheduler's guards from ``routing:``."""
    r = config.routing
    return Guards(hot_prefix_utilization=r.hot_prefix_utilization,
                  eviction_pricing=r.eviction_pricing,
                  placement=ReplicaRule(utilization=r.replica_utilization,
                                        wait_bound_sec=r.load_wait_bound,
                                        swap_grouping=r.swap_grouping))


def live_of(config: Config, generation: int) -> Live:
    """The live value of ``config``: its key ring and its fleet of models (``models:``,
    ``routing.split``/``shadow``) as generation ``generation``."""
    r = config.routing
    fleet = Fleet(config.models, policy_config(config), r.split, r.shadow, generation)
    return Live.of(config, fleet)


def policy_config(config: Config) -> PolicyConfig:
    """The policy's config from ``policy:`` and ``routing:``."""
    r = config.routing
    return PolicyConfig(name=config.policy, kv_pressure_threshold=r.kv_pressure_threshold,
                        bounded_load_epsilon=r.bounded_load_epsilon,
                        session_affinity=r.session_affinity)


# --- reloads ---------------------------------------------------------------------------------


@attr.s(auto_attribs=True, eq=False)
class BackendSet:
    """Discovery's backend set, handed to the state with the fleet's aliases composed into
    each backend's."""

    live: LiveConfig
    state: State
    specs: list[Backend] = attr.ib(factory=list, init=False)

    def set(self, specs: Sequence[Backend]) -> None:
        self.specs = list(specs)
        self.state.set_backends(self.live.now.fleet.with_aliases(self.specs))


@attr.s(auto_attribs=True, eq=False)
class Reconfigure:
    """Puts a reloaded config's live fields (``config.LIVE_FIELDS``) in force. The live
    value is swapped whole, so a request sees the old one or the new one, never a mix;
    backends are added, removed and re-resolved (a changed spec), and requests in flight keep
    their engine."""

    live: LiveConfig
    sched: Scheduler
    shadow: Shadow
    discovery: Discovery
    backends: BackendSet

    def __call__(self, config: Config) -> None:
        old = self.live.now
        new = self.live.now = live_of(config, old.fleet.generation + 1)
        self.sched.reconfigure(routing(config, new.fleet))
        self.shadow.set_fleet(new.fleet)
        self.discovery.set_static(config.backends, config.dns_backends)
        if old.fleet.names != new.fleet.names:  # a changed rename re-resolves those backends
            self.backends.set(self.backends.specs)
        if not old.keyring.open and (risk := exposure_warning(config)) is not None:
            log.warn("the reload removed every key: {risk}", risk=risk)


# --- the service -----------------------------------------------------------------------------


@attr.s(auto_attribs=True, kw_only=True, eq=False)
class PharosService(MultiService):
    """The top of the service tree; children start in order and stop in reverse."""

    reactor: IReactorTime
    live: LiveConfig
    pool: HTTPConnectionPool
    client: HTTPClient
    state: State
    sched: Scheduler
    ledger: Ledger
    public: PublicAPI
    admin: AdminAPI
    pages: Pages
    metrics: Metrics
    shadow: Shadow
    health: Health
    drain: Drain
    replicas: Replicas
    discovery: Discovery
    reconfigure: Callable[[Config], None]
    #: The public site (``pharos.proxy.site``); served by ``public_listener``, or by the
    #: caller when there is none (tests).
    site: Site
    #: Opened once restored, closed by the drain.
    public_listener: IService | None = None
    watcher: ConfigWatcher | None = None
    state_file: StateFile | None = None
    peer_node: PeerNode | None = None
    #: Run in order after the first scrape round, before the public listener opens (state
    #: file, then peers' snapshots); and during drain after the streams ended.
    restore_sources: list[Callable[[], Deferred[None]]] = attr.Factory(list)
    on_leaving: list[Callable[[], Deferred[None]]] = attr.Factory(list)
    #: The usage journal, the decision log and the shadow log, when configured: closed
    #: last, once the children stopped.
    journal: Journal | None = None
    decision_log: DecisionLog | None = None
    shadow_log: Journal | None = None
    #: Started in this order before the public listener (it opens once restored).
    children: Sequence[IService] = ()
    #: The process is this service's own (twistd): a signal while stopping ends it at once,
    #: and once restored what start-up built is moved out of the collector's reach
    #: (``gc.freeze``; a full collection walked ~300k import-time objects, pausing the
    #: reactor up to 90 ms).
    own_process: bool = False
    stopping: bool = attr.ib(default=False, init=False)
    starting: Deferred[None] | None = attr.ib(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        MultiService.__init__(self)
        for child in self.children:
            child.setServiceParent(self)

    @property
    def config(self) -> Config:
        """The config in effect."""
        return self.live.now.config

    @property
    def generation(self) -> int:
        """How many reloads (and patches) were applied."""
        return self.live.now.fleet.generation

    @classmethod
    def from_config(cls, reactor: IReactorTime, config: Config, *,
                    config_path: str | None = None, load_interval: float = LOAD_INTERVAL,
                    request_log: bool = False, docker_socket: str | None = None,
                    resolver: Any = None, listen: Listen | None = None,
                    own_process: bool = False, max_body: int = MAX_BODY_BYTES,
                    watched: Config | None = None,
                    after_reload: Callable[[], object] | None = None,
                    metrics_page: Callable[[Metrics, HTTPClient], IResource] | None = None,
                    peer_resource: Callable[[IResource, Metrics], IResource] | None = None,
                    peer_tick: float = TICK, extra: Sequence[IService] = ()) -> PharosService:
        """The service tree for ``config`` on ``reactor``. ``config_path``: watched for
        changes (hot reload; ``watched``: the config the file is compared with, if not
        ``config``; ``after_reload``: called after ``POST /admin/reload``); ``request_log``:
        one debug line per request; ``docker_socket``: the Docker daemon to discover
        labelled containers from; ``listen``: the listeners' service (None: the caller serves
        ``site`` itself, and no peer listener opens). A worker process replaces ``/metrics``
        (``metrics_page``), adds to the peer site (``peer_resource``) and ticks its peers
        faster (``peer_tick``); ``extra``: more children, started last."""
        pool = HTTPConnectionPool(reactor, persistent=True)
        pool.maxPersistentPerHost = POOL_PER_HOST
        pool.cachedConnectionTimeout = POOL_IDLE_SEC
        client = make_client(reactor, pool)
        docker = DockerAPI(reactor, docker_socket) if docker_socket else None
        inflight = Inflight()
        # The state reports to the scheduler and the metrics, made after it from it: its
        # callbacks find them when the first round ends (after start).
        def on_round(backend: BackendState) -> None:
            sched.learn_capacity(backend)
            sched.kick()

        state = State(reactor, client, load_interval=load_interval,
                      log_feed_for=default_feeds(reactor, docker.log_feed if docker else None),
                      on_round=on_round, on_down=inflight.backend_down,
                      on_decision=lambda b, stage, outcome: metrics.decision(b, stage, outcome))
        live = LiveConfig(live_of(config, 0))
        u = config.usage
        peer_node: PeerNode | None = None

        def reserved() -> None:  # peers learn of a reservation on the next reactor turn
            if peer_node is not None:
                peer_node.kick()

        def prefix_op(op: PrefixOp) -> None:  # the peer node is made from the scheduler
            if peer_node is not None:
                peer_node.push(op)

        # Shadow policies run off the request path.
        shadow_log = (Journal(config.observability.shadow_log, IReactorFromThreads(reactor))
                      if config.observability.shadow_log else None)
        shadow = Shadow(reactor, live.now.fleet, lambda: sched.policy, shadow_log)
        sched = Scheduler(state, routing(config, live.now.fleet),
                          index=PrefixIndex(config.routing.prefix_entries),
                          on_route=shadow.offer,
                          on_prefix=prefix_op if config.peers is not None else None)

        # Usage cells and quotas; the origin is this process until the state file keeps one.
        ledger = Ledger(reactor, origin=uuid.uuid4().hex, timezone=u.timezone,
                        retention_days=u.retention_days,
                        on_reserve=reserved if config.peers is not None else None)
        journal = Journal(u.journal, IReactorFromThreads(reactor)) if u.journal else None
        dl = config.observability.decision_log
        decision_log = (DecisionLog(dl.path, dl.sample_rate, IReactorFromThreads(reactor),
                                    state, config.policy) if dl is not None else None)
        replicas = Replicas(state, sched.index, ledger, sched.roots)
        restore_sources: list[Callable[[], Deferred[None]]] = []
        on_leaving: list[Callable[[], Deferred[None]]] = []
        state_file = None
        if config.state_file is not None:
            # The first restore source; started once restored, so a start that never
            # finished restoring never overwrites it.
            state_file = StateFile(config.state_file, replicas, reactor,
                                   in_thread=in_thread(reactor))
            restore_sources.append(state_file.restore)
        peer_secret = None
        if config.peers is not None:
            # Checked by load_config too; read again here, so a secret that went away since
            # refuses the start rather than running peers unauthenticated.
            peer_secret = read_peer_secret(config.peers.secret_file)
            peer_node = PeerNode(
                ledger.origin, lambda: fingerprint(live.now.config), sched, ledger,
                TreqTransport(client, peer_secret), Membership(config.peers), reactor,
                restore=lambda data: restore_bytes(replicas, data, reactor), tick=peer_tick)
            restore_sources.append(peer_node.pull_all)
            on_leaving.append(peer_node.leave)
        conversations = ConversationState()
        if config.responses.store:
            # Checked by load_config too; read again here, so a key that went away since
            # refuses the start rather than running without one.
            conversations = conversation_state(config.responses, reactor)
        journals = {name: j for name, j in (
            ("usage", journal),
            ("decision_log", None if decision_log is None else decision_log.journal))
            if j is not None}
        metrics = Metrics(state, sched, shadow=shadow, peers=peer_node, journals=journals)
        if conversations.store is not None:
            metrics.registry.register(StoreCollector(conversations.store))
        # The finished requests' subscribers, each a surface of its own: the proxy imports
        # none of them.
        recent = RecentRequests()
        live_map = LiveMap(state, reactor)
        on_done: list[Callable[[Done], object]] = [metrics.done]
        if journal is not None:
            on_done.append(lambda done: journal.write(done.journal()))
        if decision_log is not None:
            on_done.append(decision_log.done)
        if request_log:
            on_done.append(RequestLog())
        on_done += [recent, live_map.on_done]
        public = PublicAPI(
            state=state, sched=sched, client=client, clock=reactor, live=live, ledger=ledger,
            engine=EngineLeg(client, make_client(
                reactor, HTTPConnectionPool(reactor, persistent=False)), reactor),
            inflight=inflight, conversations=conversations, on_done=on_done,
            decision_log=decision_log, watch=live_map,
            manager=ModelManager(state, client, reactor,
                                 lambda: live.now.config.timeouts.stream_idle))
        pages = Pages(StatusPage(state, sched, ledger, recent, peers=peer_node), live_map)
        backends = BackendSet(live, state)
        # The backend set: static, Docker and DNS, before the scrapers it feeds.
        discovery = Discovery(backends.set, reactor, config.backends, config.dns_backends,
                              docker=docker, resolver=resolver)
        reconfigure = Reconfigure(live, sched, shadow, discovery, backends)
        children: list[IService] = [live_map, discovery, state.service, Watchdog(
            sched, reactor, older_than=config.drain.timeout)]
        watcher = None
        if config_path is not None:
            # Hot reload: the file watched, SIGHUP and ``POST /admin/reload``.
            watcher = ConfigWatcher(config_path, watched or config, reconfigure, reactor)
            children += [watcher, Sighup(IReactorFromThreads(reactor), watcher.reload)]

        def reload_config() -> Reloaded:
            assert watcher is not None
            done = watcher.reload()
            if after_reload is not None:
                after_reload()
            return done

        def apply_patch(patched: Config) -> None:
            """A merge patch put in force as a reload is; the file watcher compares the
            file's next change with it, so that change replaces it."""
            reconfigure(patched)
            if watcher is not None:
                watcher.current = patched

        admin = AdminAPI(
            state=state, sched=sched, clock=reactor, live=live, ledger=ledger,
            seed=sched.seed, shadow=shadow,
            reload_config=reload_config if watcher is not None else None,
            config_admin=ConfigAdmin(lambda: live.now.config, apply_patch,
                                     lambda: live.now.fleet.generation, config_path))
        health = Health(restored=False)
        drain = Drain(reactor, health, config.drain.grace, config.drain.timeout)
        site = public_site(
            config, public, admin, pages, drain,
            metrics_page(metrics, client) if metrics_page else MetricsPage(metrics),
            HealthPage(health, state, sched, reactor, live).app.resource(), max_body)
        public_listener = None
        if listen is not None:
            if peer_node is not None and peer_secret is not None and config.peers is not None:
                # The peer listener first, so instances starting together can pull from
                # each other before their public listeners open.
                psite = peer_site(peer_node, peer_secret,
                                  lambda: build_snapshot(replicas, reactor),
                                  wrap=None if peer_resource is None
                                  else lambda inner: peer_resource(inner, metrics))
                children += [listen(config.peers.listen.strports(), psite), peer_node]
            # Opened once restored (a busy port still fails the start, probed).
            public_listener = listen(config.listen.strports(), site)
        children += extra
        return cls(
            reactor=reactor, live=live, pool=pool, client=client, state=state, sched=sched,
            ledger=ledger, public=public, admin=admin, pages=pages, metrics=metrics,
            shadow=shadow, health=health, drain=drain, replicas=replicas,
            discovery=discovery, reconfigure=reconfigure, site=site,
            public_listener=public_listener, watcher=watcher, state_file=state_file,
            peer_node=peer_node, restore_sources=restore_sources, on_leaving=on_leaving,
            journal=journal, decision_log=decision_log, shadow_log=shadow_log,
            children=children, own_process=own_process)

    def startService(self) -> None:
        """Start the children (Discovery hands the static backends to State first); once the
        first scrape round ended, run the restore sources, then open the public listener."""
        super().startService()
        if self.own_process:
            IReactorCore(self.reactor).callWhenRunning(second_signal_ends,
                                                       lambda: self.stopping)
        self.starting = Deferred.fromCoroutine(self._start())

    async def _start(self) -> None:
        """After the first scrape round (so prefix entries find their targets), the restore
        sources in order; then ``/healthz`` turns 200 and the public listener opens."""
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
        if self.own_process:
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
                log.critical("{why}; stopping", why=listen_error(e))
                IReactorCore(self.reactor).stop()
                return
            log.info("restored; public listener open on {listen}",
                     listen=self.config.listen.address)

    def privilegedStartService(self) -> None:
        """Bind the listeners; a busy port fails start-up with a message naming it."""
        try:
            super().privilegedStartService()
            if self.public_listener is not None:
                # It opens only after the restore, but a busy port must fail the start now,
                # while twistd can still report it.
                _probe_listen(self.config.listen.strports())
        except CannotListenError as e:
            raise ListenError(listen_error(e)) from None

    def stopService(self) -> Deferred[None]:
        """Stop the children, then close the engine connections."""
        d: Deferred[Any] = Deferred.fromCoroutine(self._stop())
        return d

    async def _stop(self) -> None:
        """Drain when serving (``/healthz`` 503, grace, listener closed, streams finished or
        cut at the timeout), then ``on_leaving`` (the Leaving delta), the last state-file
        write, and the children in reverse order."""
        self.stopping = True
        listener = self.public_listener
        if listener is not None and listener.running:
            await self.drain.run(lambda: maybeDeferred(listener.disownServiceParent))
        for leaving in self.on_leaving:
            try:
                await leaving()
            except Exception:
                log.failure("an on_leaving hook failed")
        if self.state_file is not None and self.health.restored:
            await self.state_file.write()
        await super().stopService()
        await self.pool.closeCachedConnections()
        for journal in (self.journal, self.decision_log, self.shadow_log):
            if journal is not None:
                await journal.close()


def public_site(config: Config, public: PublicAPI, admin: AdminAPI, pages: Pages,
                drain: Drain, metrics: IResource, health: IResource,
                max_body: int = MAX_BODY_BYTES) -> PublicSite:
    """The public site: one resource tree (``pharos.proxy.site``), bodies bounded while they
    arrive, request heads bounded in time, requests tracked for the drain."""
    pages_app = pages.app.resource()
    gate = Authorized(public.live, admin.app.resource(), {b"status": pages_app,
                                                          b"live": pages_app})
    root = PublicRoot(public.app.resource(), {
        b"metrics": MetricsGate(public.live, metrics), b"healthz": health, b"admin": gate,
        b"usage": gate, b"status": gate, b"live": gate})
    t = config.timeouts
    return PublicSite(root, track=drain.track, head_deadline=t.request_headers,
                      body_deadline=t.request_body, idle=t.idle,
                      requestFactory=streaming_request_factory(bounded_request_factory(
                          max_body, on_too_large=public.too_large)))


def in_thread(reactor: object) -> Callable[[Callable[[], Any]], Deferred[Any]]:
    """Blocking work (the state file's read and write) in the reactor's thread pool (a
    ``Clock`` has none: a test replaces it)."""
    def run(f: Callable[[], Any]) -> Deferred[Any]:
        threads = IReactorThreads(reactor)
        return deferToThreadPool(IReactorFromThreads(reactor), threads.getThreadPool(), f)
    return run


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


def conversation_state(config: Responses, reactor: IReactorTime) -> ConversationState:
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
