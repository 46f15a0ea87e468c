"""twistd's entry: ``Options`` and ``makeService``, the one composition root (DESIGN §1)."""

from __future__ import annotations

import uuid
from typing import Any

from twisted.application import strports
from twisted.application.service import IService, MultiService
from twisted.internet.defer import Deferred
from twisted.internet.error import CannotListenError
from twisted.python import usage
from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory
from twisted.web.server import Site

from pharos.config import Config, ConfigError, load_config
from pharos.engine.fetch import make_client
from pharos.journal import Journal
from pharos.policy import PolicyConfig
from pharos.prefix import PrefixIndex
from pharos.proxy.auth import Keyring
from pharos.proxy.body import MAX_BODY_BYTES, bounded_request_factory
from pharos.proxy.channel import PathGuard, PublicSite
from pharos.proxy.public import PublicAPI
from pharos.reload import ConfigWatcher
from pharos.sched import Guards, Scheduler
from pharos.state.registry import BackendState
from pharos.state.state import LOAD_INTERVAL, State
from pharos.usage import Ledger
from pharos.watchdog import Watchdog

# A factory per engine connection would log its start and stop at info, twice a request.
_HTTP11ClientFactory.noisy = False

#: Idle engine connections kept per backend: about the streams one engine serves at once.
POOL_PER_HOST = 32
#: Below the engines' keep-alive (uvicorn: 5 s): a POST on a connection the engine already
#: closed fails, and Twisted retries only idempotent requests (twisted#7843).
POOL_IDLE_SEC = 4


class Options(usage.Options):
    """``twistd pharos -c FILE`` (or ``--demo``): a config that does not parse never starts
    the service."""

    optParameters = [["config", "c", None, "the Pharos config file (YAML)"]]
    optFlags = [["demo", None, "serve in front of three simulated engines on loopback"]]

    def postOptions(self) -> None:
        """Load and validate the config now, so twistd refuses to start on a bad file."""
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
                 config_path: str | None = None) -> None:
        super().__init__()
        self.config = config
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.pool.maxPersistentPerHost = POOL_PER_HOST
        self.pool.cachedConnectionTimeout = POOL_IDLE_SEC
        self.client = make_client(reactor, self.pool)
        self.state = State(reactor, self.client, load_interval=load_interval)
        r = config.routing
        policy = PolicyConfig(name=config.policy, kv_pressure_threshold=r.kv_pressure_threshold,
                              bounded_load_epsilon=r.bounded_load_epsilon,
                              session_affinity=r.session_affinity)
        self.sched = Scheduler(self.state, policy, index=PrefixIndex(r.prefix_entries),
                               guards=Guards(hot_prefix_utilization=r.hot_prefix_utilization,
                                             eviction_pricing=r.eviction_pricing))
        self.state.on_round = self._round
        u = config.usage
        #: Usage cells and quotas; the origin is this process until the state file keeps one.
        self.ledger = Ledger(reactor, origin=uuid.uuid4().hex, timezone=u.timezone,
                             retention_days=u.retention_days)
        self.public = PublicAPI(self.state, self.sched, self.client, reactor,
                                timeouts=config.timeouts,
                                keyring=Keyring(config.keys, config.tenants), ledger=self.ledger)
        self.journal = Journal(u.journal, reactor) if u.journal else None
        if self.journal is not None:
            self.public.on_done.append(self.journal.write)
        self.state.on_down = self.public.backend_down
        self.state.service.setServiceParent(self)
        Watchdog(self.sched, reactor, older_than=config.drain.timeout).setServiceParent(self)
        if config_path is not None:
            watcher = ConfigWatcher(config_path, config, self.reconfigure)
            watcher.clock = reactor
            watcher.setServiceParent(self)

    def reconfigure(self, config: Config) -> None:
        """Apply a reloaded config's live fields: the key set is swapped whole (a request
        sees the old set or the new one, never a mix), backends are added and removed."""
        self.config = config
        self.public.keyring = Keyring(config.keys, config.tenants)
        if self.running:
            self.state.set_backends(config.backends)

    def _round(self, backend: BackendState) -> None:
        """A scrape round ended: learn capacities from it, then re-run the waiters."""
        self.sched.learn_capacity(backend)
        self.sched.kick()

    def startService(self) -> None:
        """Start scraping the configured backends."""
        self.state.set_backends(self.config.backends)
        super().startService()

    def privilegedStartService(self) -> None:
        """Bind the listeners; a busy port fails start-up with a message naming it."""
        try:
            super().privilegedStartService()
        except CannotListenError as e:
            why = e.socketError.strerror if isinstance(e.socketError, OSError) else e.socketError
            where = f"{e.interface or '*'}:{e.port}"
            raise ListenError(f"cannot listen on {where}: {why}") from None

    def stopService(self) -> Deferred[None]:
        """Stop the children, then close the engine connections."""
        d: Deferred[Any] = Deferred.fromCoroutine(self._stop())
        return d

    async def _stop(self) -> None:
        await super().stopService()
        await self.pool.closeCachedConnections()
        if self.journal is not None:
            await self.journal.close()


def public_site(top: PharosService, max_body: int = MAX_BODY_BYTES) -> Site:
    """The public site: the Klein app behind the path guard, bodies bounded while they
    arrive, request heads bounded in time."""
    site = PublicSite(PathGuard(top.public.app.resource()),
                      requestFactory=bounded_request_factory(max_body))
    site.head_deadline = top.config.timeouts.request_headers
    return site


def build(config: Config, reactor: Any, config_path: str | None = None) -> PharosService:
    """The service tree for ``config`` on ``reactor``; ``config_path`` is watched for
    changes (hot reload)."""
    top = PharosService(config, reactor, config_path=config_path)
    site = public_site(top)
    # strports raises at start when the port is busy, so twistd exits non-zero naming it.
    strports.service(config.listen.strports(), site).setServiceParent(top)
    return top


def makeService(options: Any) -> IService:
    """Wire the service tree from the parsed config (or the demo fleet)."""
    from twisted.internet import reactor

    if options["demo"]:
        from pharos.sim.demo import demo_service

        return demo_service(reactor, options["parsed"])
    config: Config = options["parsed"]
    return build(config, reactor, config_path=options["config"])
