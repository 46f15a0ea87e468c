"""The log follower: one backend's log feed through its plan's log probes.

Started once the plan has active log probes. Each line goes through ``Plan.follow_line`` in
memory and is dropped; the values it set are kept in ``BackendState.log``, apart from the
scraped rounds so they do not go stale with the scrape interval, and used only where no
scraped probe knows the signal. While the feed is disconnected that is ``None`` (unknown,
never 0) and the follower reconnects with backoff.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, Protocol

from twisted.application.service import Service
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from pharos.config import Backend as BackendSpec
from pharos.discovery.feed import DockerFeeds, FeedUnavailable, LogFeed
from pharos.discovery.logfile import feed_for
from pharos.engine.signals import LOAD_ORDER, Residency, Snapshot, load_of
from pharos.state.registry import BackendState, Target, rename

log = Logger()

#: Reconnect backoff: the first retry after 1 s, doubling up to 30 s.
BACKOFF_FIRST: Final = 1.0
BACKOFF_MAX: Final = 30.0

#: Builds a backend's log feed from its spec; ``None`` when it has none.
FeedFactory = Callable[[BackendSpec], LogFeed | None]


def default_feeds(clock: IReactorTime, docker: DockerFeeds | None = None) -> FeedFactory:
    """The feed of a spec's ``logs:`` URL (``file://`` always; ``docker://`` with ``docker``).
    One that cannot be built is logged and counts as none ("no log feed")."""

    def feed(spec: BackendSpec) -> LogFeed | None:
        if spec.logs is None:
            return None
        url = f"{spec.logs.scheme}://{spec.logs.target}"
        try:
            return feed_for(url, clock, docker)
        except FeedUnavailable as e:
            log.warn("backend {url}: no log feed: {why}", url=spec.url, why=str(e))
            return None

    return feed


def overlay(old: Snapshot, new: Snapshot) -> Snapshot:
    """``old`` with the values ``new`` sets on top: a later line replaces a value, and a
    residency or load value covers only the model (or whole backend) its line names."""
    residency = old.residency
    if new.residency is not None:
        residency = {**(old.residency or {}), **new.residency}
    loads: dict[str, dict[str, int | float]] = {}
    for snap in (old, new):
        for model, load in snap.load.items():
            for s in LOAD_ORDER:
                v = load.get(s)
                if v is not None:
                    loads.setdefault(model, {})[s.value] = v
    return Snapshot(
        version=new.version if new.version is not None else old.version,
        residency=residency,
        load={m: load_of(vals) for m, vals in loads.items()},
        sources={**old.sources, **new.sources},
    )


class Owner(Protocol):
    """What a follower needs of the state service (``State``), named here so this module
    does not import the one that starts it."""

    clock: IReactorTime

    def target_of(self, backend: BackendState, model: str) -> Target | None: ...

    def decided(self, b: BackendState, stage: str, outcome: str) -> None: ...


class LogFollower(Service):
    """One backend's log feed, connected while the service runs, reconnected with backoff."""

    def __init__(self, state: Owner, backend: BackendState, feed: LogFeed) -> None:
        self.state = state
        self.backend = backend
        self.feed = feed
        self.delay = BACKOFF_FIRST
        self.connects = 0
        self._d: Deferred[None] | None = None
        self._retry: IDelayedCall | None = None
        self._live = False  # connected: lines count
        self._lost: str | None = None  # why the feed is down, while it is (logged once)
        self._warned_utf8 = False

    def startService(self) -> None:
        super().startService()
        self._connect()

    def stopService(self) -> None:
        super().stopService()
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        d, self._d, self._live = self._d, None, False
        if d is not None:
            d.cancel()
        self.backend.log = None
        return None

    @property
    def connected(self) -> bool:
        """Whether the feed is connected (its values count)."""
        return self._live

    def _connect(self) -> None:
        self._retry = None
        if not self.running:
            return
        self.connects += 1
        self.backend.log = Snapshot()
        self._live = True
        d = self._d = self.feed.connect(self._line)

        def ended(result: object) -> object:
            if self._d is not d:
                return result  # stopped: the cancellation is trapped below
            self._d, self._live = None, False
            self.backend.log = None
            why = (result.getErrorMessage() if isinstance(result, Failure)
                   else "the feed ended")
            if self._lost is None:
                log.warn("backend {url}: log feed {feed} lost ({why}); its log values are "
                         "unknown until it reconnects", url=self.backend.url,
                         feed=self.feed.describe(), why=why)
            self._lost = why
            if self.running:
                self._retry = self.state.clock.callLater(self.delay, self._connect)
                self.delay = min(self.delay * 2, BACKOFF_MAX)
            return None

        def cancelled(f: Failure) -> None:
            f.trap(CancelledError)

        d.addBoth(ended)
        d.addErrback(cancelled)

    def _line(self, line: bytes) -> None:
        """Match one line in memory; keep only the values it sets."""
        if not self._live:
            return  # stopped, or the feed ended
        if self._lost is not None:
            log.info("backend {url}: log feed {feed} reading again", url=self.backend.url,
                     feed=self.feed.describe())
            self._lost = None
        self.delay = BACKOFF_FIRST
        if not self._warned_utf8 and not line.isascii():
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                self._warned_utf8 = True
                log.warn("backend {url}: log feed {feed} has lines that are not UTF-8; they "
                         "are matched with replacement characters", url=self.backend.url,
                         feed=self.feed.describe())
        plan = self.backend.plan
        if plan is None:
            return
        snap = plan.follow_line(line)
        if snap is None:
            return
        self.publish(rename(snap, self.backend.spec.aliases))

    def publish(self, snap: Snapshot) -> None:
        """Lay one line's values over the log snapshot; a model turned cold bumps its gen."""
        b = self.backend
        old = b.log if b.log is not None else Snapshot()
        if snap.residency:
            self._bump_generations(old, snap.residency)
        b.log = overlay(old, snap)

    def _bump_generations(self, old: Snapshot, residency: Mapping[str, Residency]) -> None:
        b = self.backend
        for model, now in residency.items():
            if now is not Residency.COLD:
                continue
            before = (old.residency or {}).get(model)
            if before is None and b.full is not None and b.full.residency is not None:
                before = b.full.model_info(model).state
            if before not in (Residency.LOADED, Residency.LOADING):
                continue
            t = self.state.target_of(b, model)
            if t is not None:
                t.gen += 1
                self.state.decided(b, "generation", "unloaded")
