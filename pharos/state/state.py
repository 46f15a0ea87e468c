"""The state service: one scraper per backend, targets registered on first sight."""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence

from treq.client import HTTPClient
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from pharos.config import Backend as BackendSpec
from pharos.engine.fetch import Fetcher, HTTPFetcher
from pharos.engine.own import own_probes
from pharos.engine.plan import FETCH_ERROR, BackendUnreachable, DetectionFailed, resolve
from pharos.engine.signals import FAST_SIGNALS, Residency, Snapshot
from pharos.periodic import Periodic
from pharos.state.logs import FeedFactory, LogFollower, default_feeds
from pharos.state.registry import (
    STALE_AFTER_INTERVALS,
    BackendState,
    Target,
    View,
    edge,
    rename,
    view_expires,
    view_of,
)
from pharos.state.stats import Sample, adopt, export_stats, learn, parse_stats

log = Logger()

#: Load probes every second, the whole plan every fifth round.
LOAD_INTERVAL = 1.0
FULL_EVERY = 5
#: The plan is resolved again this often even when nothing changed.
RESOLVE_EVERY = 600.0
#: Removed backends whose state is kept for their return (docker restart).
KEEP_REMOVED = 32
#: Consecutive failed rounds before a backend counts as down (ejected): one slow scrape of a
#: busy engine (vLLM's /metrics past the fetch timeout on a loaded machine) is not a hang.
DOWN_AFTER_FAILED_ROUNDS = 2
#: A backend whose replies delivered bytes within this many load intervals is serving, however
#: its scrapes fare: a loaded vLLM answers streams while its /metrics times out.
REPLYING_INTERVALS = 3
#: Round spacing varies by up to this fraction, so backends do not scrape in step.
JITTER = 0.1
#: Restored stats kept for targets not seen yet; the oldest go first past this.
MAX_PENDING_STATS = 4096


class State:
    """Backends, targets and their views; the scrapers live in ``self.service``."""

    def __init__(
        self,
        clock: IReactorTime,
        client: HTTPClient | None,
        *,
        rng: Callable[[], float] = random.random,
        load_interval: float = LOAD_INTERVAL,
        full_every: int = FULL_EVERY,
        fetch_timeout: float = 0.8,
        on_round: Callable[[BackendState], None] | None = None,
        on_down: Callable[[BackendState, str], None] | None = None,
        on_decision: Callable[[BackendState, str, str], None] | None = None,
        fetcher_for: Callable[[BackendSpec], Fetcher] | None = None,
        log_feed_for: FeedFactory | None = None,
    ) -> None:
        self.clock = clock
        self.client = client
        self.rng = rng
        self.load_interval = load_interval
        self.full_every = full_every
        self.full_interval = load_interval * full_every
        self.fetch_timeout = fetch_timeout
        self.on_round = on_round
        #: Told when a backend stops answering, so requests waiting on it go elsewhere.
        self.on_down = on_down
        #: Told of each background decision as (backend, stage, outcome): metrics count them.
        self.on_decision = on_decision
        if fetcher_for is None:
            assert client is not None, "a client or a fetcher factory"
            http = client

            def fetcher_for(spec: BackendSpec) -> Fetcher:
                return HTTPFetcher(spec.url, http, clock, timeout=fetch_timeout)

        self.fetcher_for = fetcher_for
        #: A backend's log feed from its spec (Docker discovery adds ``docker://``).
        self.log_feed_for = log_feed_for if log_feed_for is not None else default_feeds(clock)
        self.service = MultiService()
        self.backends: dict[str, BackendState] = {}
        self.targets: list[Target] = []
        self._by_key: dict[tuple[str, str], Target] = {}
        self._scrapers: dict[str, Scraper] = {}
        self._removed: OrderedDict[str, BackendState] = OrderedDict()
        self._waiting_ready: list[Deferred[None]] = []
        self._first_set: set[str] | None = None
        self.ready = False
        #: Restored estimates of targets not registered yet, by target key (``merge_stats``).
        self._pending_stats: OrderedDict[str, dict[str, float | None]] = OrderedDict()
        #: Each target's last view, kept while nothing it was derived from changed (``view``).
        self._views: dict[Target, _CachedView] = {}
        #: Each model's up targets, kept while no backend changed (``targets_for``).
        self._up: dict[str, _CachedUp] = {}

    # --- backends ------------------------------------------------------------------------

    def set_backends(self, specs: Sequence[BackendSpec]) -> None:
        """Make the backend set ``specs``: unchanged backends keep their state, new ones start
        scraping, removed ones stop (and are kept for a while in case they come back)."""
        wanted = {s.url: s for s in specs}
        for url in list(self.backends):
            if url not in wanted:
                self._remove(url)
            elif wanted[url] != self.backends[url].spec:
                self._respec(self.backends[url], wanted[url])
        for url, spec in wanted.items():
            if url in self.backends:
                continue
            old = self._removed.pop(url, None)
            b = old if old is not None and old.spec == spec else BackendState(spec)
            b.removed = False
            self.backends[url] = b
            scraper = Scraper(self, b)
            self._scrapers[url] = scraper
            scraper.setServiceParent(self.service)
        if self._first_set is None:
            self._first_set = set(wanted)
            self._check_ready()

    def _respec(self, b: BackendState, spec: BackendSpec) -> None:
        """A changed spec (a reload) is resolved again by a new scraper; the backend keeps its
        targets, stats and requests in flight, and serves on its last round until the new
        plan's first round (removing it would leave its models unserved until then)."""
        b.spec = spec
        self._scrapers.pop(b.url).disownServiceParent()
        scraper = Scraper(self, b)
        self._scrapers[b.url] = scraper
        scraper.setServiceParent(self.service)

    def _remove(self, url: str) -> None:
        b = self.backends.pop(url)
        b.removed = True
        scraper = self._scrapers.pop(url)
        scraper.disownServiceParent()
        self._removed[url] = b
        while len(self._removed) > KEEP_REMOVED:
            self._removed.popitem(last=False)

    def eject(self, backend: BackendState) -> None:
        """A refused connection, a reply that died or a failed round: out until its next
        answered round."""
        if not backend.ejected:
            log.warn("backend {url} ejected", url=backend.url)
        backend.ejected = True

    def down(self, backend: BackendState, why: str) -> None:
        """The backend stopped answering its scrapes: ejected, and its requests that have no
        first byte yet go elsewhere (a hung engine holds nobody)."""
        self.eject(backend)
        if self.on_down is not None:
            self.on_down(backend, why)

    def is_up(self, b: BackendState, now: float | None = None) -> bool:
        """Up while its last full round is fresh and it is not ejected or removed. Fresh in
        time, or in rounds (a reactor held for seconds ran no round, which says nothing of the
        engine), or while its replies flow (``replying``)."""
        now = self.clock.seconds() if now is None else now
        return (not b.ejected and not b.removed and b.full_at is not None
                and (now - b.full_at <= STALE_AFTER_INTERVALS * self.full_interval
                     or b.rounds - b.full_round <= STALE_AFTER_INTERVALS * self.full_every
                     or self.replying(b, now)))

    def replying(self, b: BackendState, now: float) -> bool:
        """Whether bytes of a reply arrived from it within ``REPLYING_INTERVALS`` rounds."""
        return b.replied_at is not None and now - b.replied_at <= (
            REPLYING_INTERVALS * self.load_interval)

    def up_expires(self, b: BackendState, now: float) -> tuple[float, bool]:
        """When ``is_up(b, now)`` may next change by time alone (``inf``: not until something
        is written), and whether it reads ``replied_at`` now (its rounds are stale in time
        and in count: each relayed chunk may change it)."""
        if b.ejected or b.removed or b.full_at is None:
            return math.inf, False
        span = STALE_AFTER_INTERVALS * self.full_interval
        if now - b.full_at <= span:
            return edge(b.full_at, span), False
        if b.rounds - b.full_round <= STALE_AFTER_INTERVALS * self.full_every:
            return math.inf, False
        if self.replying(b, now):
            assert b.replied_at is not None
            return edge(b.replied_at, REPLYING_INTERVALS * self.load_interval), True
        return math.inf, True

    # --- readiness -----------------------------------------------------------------------

    def when_ready(self) -> Deferred[None]:
        """Fires once the first backend set has each finished a round."""
        if self.ready:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._waiting_ready.append(d)
        return d

    def _check_ready(self) -> None:
        if self.ready or self._first_set is None:
            return
        if all(self.backends[u].rounds > 0 for u in self._first_set if u in self.backends):
            self.ready = True
            waiting, self._waiting_ready = self._waiting_ready, []
            for d in waiting:
                d.callback(None)

    # --- targets -------------------------------------------------------------------------

    def target(self, backend: BackendState, model: str, served: str) -> Target:
        """The target for backend × model, registered on first sight and never removed."""
        t = self._by_key.get((backend.url, model))
        if t is None:
            t = Target(len(self.targets), backend, model, served)
            self.targets.append(t)
            self._by_key[(backend.url, model)] = t
            pending = self._pending_stats.pop(t.key, None)
            if pending is not None:
                adopt(t.stats, pending)
                t.touched()
        t.backend = backend
        return t

    def by_key(self, key: str) -> Target | None:
        """The target a peer or a snapshot names by ``Target.key`` (None: not seen here)."""
        url, sep, model = key.partition("#")  # a URL has no "#"; a model name may
        return self._by_key.get((url, model)) if sep else None

    def target_of(self, backend: BackendState, model: str) -> Target | None:
        """The target for backend × model, if registered."""
        return self._by_key.get((backend.url, model))

    def targets_for(self, model: str) -> list[Target]:
        """Targets of up backends that list ``model`` in their last full round (a new list;
        the answer is kept while no backend is written and no round goes stale)."""
        now = self.clock.seconds()
        e = self._up.get(model)
        if e is not None and e[0] == BackendState.changes and e[1] <= now < e[2]:
            return list(e[3])
        out = []
        until, cacheable = math.inf, True
        for b in self.backends.values():
            if b.full is None or b.full.models is None or model not in b.full.models:
                continue
            edge_at, reads_replied = self.up_expires(b, now)
            until = min(until, edge_at)
            cacheable = cacheable and not reads_replied
            if self.is_up(b, now):
                t = self._by_key.get((b.url, model))
                if t is not None:
                    out.append(t)
        if cacheable:
            self._up[model] = (BackendState.changes, now, until, tuple(out))
        else:
            self._up.pop(model, None)
        return out

    def listed_anywhere(self, model: str, kind: str | None = None) -> bool:
        """Whether any backend (of ``kind``), up or not, has ever listed ``model``."""
        return any(t.model == model and (kind is None or t.backend.kind == kind)
                   for t in self.targets)

    def models(self) -> dict[str, list[Target]]:
        """Every model an up backend lists, with its targets."""
        out: dict[str, list[Target]] = {}
        now = self.clock.seconds()
        for b in self.backends.values():
            if b.full is None or b.full.models is None or not self.is_up(b, now):
                continue
            for m in b.full.models:
                t = self._by_key.get((b.url, m))
                if t is not None:
                    out.setdefault(m, []).append(t)
        return out

    def view(self, target: Target) -> View:
        """The target's signals as of now (stale ones unknown). The view is kept exactly as
        long as a fresh view would equal it: no write it reads (stamps), ``replied_at`` as it
        was if ``up`` read it, the clock not gone back, no round gone stale since."""
        return self.view_at(target, self.clock.seconds())

    def view_at(self, target: Target, now: float) -> View:
        """``view`` with the clock read by the caller (a decision reads it once)."""
        b = target.backend
        e = self._views.get(target)
        if (e is not None and e[0] == target.view_stamp and e[1] is b and e[2] == b.stamp
                and e[3] <= now < e[4] and (not e[5] or e[6] == b.replied_at)):
            return e[7]
        view = view_of(target, now, self.load_interval, self.full_interval, self.is_up)
        up_at, reads_replied = self.up_expires(b, now)
        until = min(up_at, view_expires(target, now, self.load_interval, self.full_interval))
        self._views[target] = (target.view_stamp, b, b.stamp, now, until, reads_replied,
                               b.replied_at, view)
        return view

    def kept_view(self, target: Target) -> CachedView | None:
        """The target's kept view with what it is current for (``view_at``'s entry), for a
        caller that keeps what it builds from it (the scheduler's candidates)."""
        return self._views.get(target)

    # --- feedback ------------------------------------------------------------------------

    def feedback(self, target: Target, sample: Sample) -> None:
        """A finished request: learn speeds; a successful reply shows the model loaded."""
        now = self.clock.seconds()
        target.last_release_at = now
        learn(target.stats, sample)
        target.touched()  # its stats changed
        if sample.ok and not sample.control:
            target.loaded_reply_at = now

    # --- replication (stats: snapshot only) ------------------------------------------------

    def export_stats(self) -> list[dict[str, object]]:
        """Every target's estimates that are known (this process's own or restored), by target
        key, for a snapshot."""
        out: list[dict[str, object]] = []
        for t in self.targets:
            values = export_stats(t.stats)
            if any(v is not None for v in values.values()):
                out.append({"target": t.key, **values})
        return out

    def merge_stats(self, rows: Iterable[Mapping[str, object]]) -> tuple[int, int]:
        """Take a snapshot's estimates where there is no local sample; rows for unseen targets
        wait for them (up to ``MAX_PENDING_STATS``). All or nothing (``ValueError``). Returns
        (rows taken now, rows kept for later)."""
        parsed: list[tuple[str, dict[str, float | None]]] = []
        for raw in rows:
            key = raw.get("target")
            if not isinstance(key, str):
                raise ValueError(f"stats: target must be a string, not {key!r}")
            parsed.append((key, parse_stats(raw)))
        taken = kept = 0
        for key, values in parsed:
            t = self.by_key(key)
            if t is not None:
                taken += adopt(t.stats, values)
                t.touched()
                continue
            self._pending_stats.pop(key, None)
            self._pending_stats[key] = values
            kept += 1
            while len(self._pending_stats) > MAX_PENDING_STATS:
                self._pending_stats.popitem(last=False)
        return taken, kept

    # --- publishing rounds ---------------------------------------------------------------

    def publish(self, b: BackendState, snap: Snapshot, full: bool) -> None:
        """Store one round's snapshot, register new targets, bump generations."""
        now = self.clock.seconds()
        aliases, listed = b.spec.aliases, snap.models
        snap = rename(snap, aliases)
        if full:
            self._bump_generations(b, b.full, snap)
            b.full, b.full_at, b.full_round = snap, now, b.rounds
            # Each target serves the name the engine listed (aliases map several to one).
            for served in listed or ():
                self.target(b, aliases.get(served, served), served)
        b.load, b.load_at = snap, now

    def decided(self, b: BackendState, stage: str, outcome: str) -> None:
        """A background round's decision, for ``on_decision``."""
        if self.on_decision is not None:
            self.on_decision(b, stage, outcome)

    def _bump_generations(self, b: BackendState, old: Snapshot | None, new: Snapshot) -> None:
        if old is None:
            return
        mine = [t for t in self.targets if t.backend is b]
        new_version = old.version is not None and new.version is not None and (
            old.version != new.version)
        for t in mine:
            before, after = old.model_info(t.model).state, new.model_info(t.model).state
            went_cold = before in (Residency.LOADED, Residency.LOADING) and (
                after is Residency.COLD)
            unlisted = (old.models is not None and t.model in old.models
                        and new.models is not None and t.model not in new.models)
            if new_version or went_cold or unlisted:
                t.gen += 1
                self.decided(b, "generation", "new_version" if new_version
                             else "unlisted" if unlisted else "unloaded")


#: ``State.view``'s kept view: the target's and its backend's stamps (and the backend), when
#: it was made and until when it holds, whether its ``up`` read ``replied_at`` and the value.
_CachedView = tuple[int, BackendState, int, float, float, bool, float | None, View]
CachedView = _CachedView
#: ``State.targets_for``'s kept answer: ``BackendState.changes`` then, made at, holds until.
_CachedUp = tuple[int, float, float, tuple[Target, ...]]


class Scraper(MultiService):
    """One backend's rounds: resolve, then load rounds every interval and a full round every
    ``full_every``, from a random offset; a failure is recorded and the loop carries on. Its
    child, the ``LogFollower``, runs while the plan has active log probes."""

    def __init__(self, state: State, backend: BackendState) -> None:
        super().__init__()
        self.state = state
        self.backend = backend
        self.fetcher = state.fetcher_for(backend.spec)
        self.own = own_probes(backend.spec.probes)
        self.log_feed = state.log_feed_for(backend.spec)
        self.follower: LogFollower | None = None
        self.loop = Periodic(state.clock, state.load_interval, self.round, spread=True,
                             jitter=JITTER, random=state.rng, cancel=True,
                             what=f"scrape round of {backend.url}")
        self._resolve_due = True
        self._resolved_at = 0.0

    def startService(self) -> None:
        super().startService()
        self.loop.startService()

    def stopService(self) -> Deferred[None]:
        stopped: Deferred[None] = super().stopService()  # the log follower
        self.loop.stopService()
        return stopped

    def _follow_logs(self) -> None:
        """Run the log follower while the plan has active log probes."""
        plan = self.backend.plan
        wanted = self.log_feed is not None and plan is not None and bool(plan.log_probes)
        if wanted and self.follower is None and self.log_feed is not None:
            self.follower = LogFollower(self.state, self.backend, self.log_feed)
            self.follower.setServiceParent(self)
        elif not wanted and self.follower is not None:
            self.follower.disownServiceParent()
            self.follower = None

    async def round(self) -> None:
        """One round; never raises for an engine's fault."""
        b, state = self.backend, self.state
        now = state.clock.seconds()
        try:
            if b.plan is None or self._resolve_due or now - self._resolved_at > RESOLVE_EVERY:
                try:
                    plan, snap = await resolve(self.fetcher, b.spec.kind, self.own,
                                               has_log_feed=self.log_feed is not None)
                except (BackendUnreachable, DetectionFailed):
                    state.decided(b, "resolve", "failed")
                    raise
                self._resolve_due = False
                self._resolved_at = now
                new_plan = b.plan is None or [p.name for p in b.plan.active] != [
                    p.name for p in plan.active]
                state.decided(b, "resolve", "new_plan" if new_plan else "same_plan")
                if new_plan:
                    log.info("backend {url}: {kind} {version}, probes {active}", url=b.url,
                             kind=plan.kind, version=plan.version or "unknown",
                             active=[p.name for p in plan.active])
                b.plan = plan
                state.publish(b, snap, full=True)
                self._follow_logs()
            else:
                full = b.rounds % state.full_every == 0
                snap, failures = await b.plan.scrape(self.fetcher, full=full)
                if failures:
                    self._resolve_due = True
                asked = [p for p in b.plan.http_probes if full or p.signal in FAST_SIGNALS]
                if asked and len(failures) == len(asked) and all(
                        f.reason.startswith(FETCH_ERROR) for f in failures):
                    state.decided(b, "scrape", "unreachable")
                    raise BackendUnreachable(failures[0].reason)
                new_version = full and b.full is not None and snap.version != b.full.version
                if new_version:
                    self._resolve_due = True
                state.decided(b, "scrape", "new_version" if new_version
                              else "probe_failed" if failures else "ok")
                state.publish(b, snap, full=full)
            if b.failing is not None:
                log.info("backend {url} answers again", url=b.url)
            b.failing = None
            b.failed_rounds = 0
            b.ejected = False
        except (BackendUnreachable, DetectionFailed) as e:
            if b.failing is None:
                log.warn("backend {url} unreachable: {why}", url=b.url, why=str(e))
            b.failing = str(e)
            b.failed_rounds += 1
            if b.failed_rounds >= DOWN_AFTER_FAILED_ROUNDS:
                if not state.replying(b, state.clock.seconds()):
                    state.down(b, str(e))
                elif b.failed_rounds == DOWN_AFTER_FAILED_ROUNDS:
                    log.warn("backend {url} misses its scrapes but its replies flow: kept up",
                             url=b.url)
        finally:
            b.rounds += 1
            state._check_ready()
            if state.on_round is not None:
                state.on_round(b)
