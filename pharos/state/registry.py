"""Backends and targets, and the view of a target's signals as of now."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from itertools import count
from typing import ClassVar

from pharos.config import Backend as BackendSpec
from pharos.engine.plan import Plan
from pharos.engine.signals import WHOLE_BACKEND, Load, Residency, Signal, Snapshot
from pharos.state.stats import TargetStats

#: A signal older than this many of its intervals is unknown.
STALE_AFTER_INTERVALS = 3

#: Change stamps: every write to a field of a ``Target`` or ``BackendState`` that a view or a
#: candidate reads takes the next number, so a view or candidate built from them is current
#: while the stamps it was built at are unchanged.
_STAMPS = count(1)


def new_stamp() -> int:
    """A stamp above every one taken so far: a target or backend written after this call has
    a greater one (the scheduler's kept fleet finds what changed since it was built)."""
    return next(_STAMPS)


@dataclass(eq=False)
class BackendState:
    """One engine endpoint: its spec, its plan, and the snapshots of its last rounds."""

    spec: BackendSpec
    plan: Plan | None = None
    full: Snapshot | None = None
    full_at: float | None = None
    full_round: int = 0  # ``rounds`` when the last full round was published
    load: Snapshot | None = None
    load_at: float | None = None
    ejected: bool = False
    failing: str | None = None  # why the last round failed; None when it answered
    failed_rounds: int = 0  # consecutive failed rounds
    #: When bytes of a reply last arrived from it (passive health: an engine too busy to
    #: answer its scrapes in time is still serving).
    replied_at: float | None = None
    removed: bool = False
    rounds: int = 0
    #: Values its log feed set, used where no scraped probe knows; ``None``: no feed connected.
    log: Snapshot | None = None

    #: The stamp of its last write that a view may read (``_STAMPS``); ``changes``: the last
    #: such write to any backend (the up targets of a model are as they were while it holds).
    stamp: ClassVar[int] = 0
    changes: ClassVar[int] = 0
    #: Fields no view reads, written without a new stamp. ``replied_at`` is written per relayed
    #: chunk and read only by ``State.is_up`` when its rounds are stale: a view that used it
    #: remembers the value it saw (``State.view``).
    QUIET: ClassVar[frozenset[str]] = frozenset({"plan", "failing", "failed_rounds",
                                                 "replied_at"})

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name not in BackendState.QUIET:
            n = next(_STAMPS)
            object.__setattr__(self, "stamp", n)
            BackendState.changes = n

    @property
    def url(self) -> str:
        """The base URL clients' requests go to."""
        return self.spec.url

    @property
    def kind(self) -> str | None:
        """The engine kind, once resolved."""
        return self.plan.kind if self.plan else None

    @property
    def version(self) -> str | None:
        """The engine version, when it reports one."""
        return self.full.version if self.full else None


@dataclass(eq=False)
class Target:
    """A backend × model: the unit Pharos routes to. ``model`` is the name clients use,
    ``served`` the engine's own name (aliases rewrite one into the other)."""

    id: int
    backend: BackendState
    model: str
    served: str
    gen: int = 0
    stats: TargetStats = field(default_factory=TargetStats)
    inflight: int = 0
    loaded_reply_at: float | None = None  # a successful reply newer than the last full round
    last_release_at: float | None = None  # when a reply on it last ended
    #: Estimated prefill seconds of our requests on it that have no first byte yet.
    queued_prefill: float = 0.0
    #: How many of our requests on it have no first byte yet.
    unstarted: int = 0
    #: When the last of our requests on it had its first byte (a prefill ahead ended).
    last_first_byte_at: float | None = None
    #: Capacity learned when the engine reports none: the most requests seen running at once,
    #: raised a slot a round while requests wait and the engine has no queue, set to Running
    #: when the engine queues with KV blocks to spare (then no longer raised). None: nothing
    #: learned yet. ``capacity_seen_queue``: the engine has queued so.
    learned_capacity: int | None = None
    capacity_seen_queue: bool = False
    capacity_seen_max: int = 0  # the most requests the engine was seen running at once
    queue_rounds: int = 0  # consecutive rounds the engine reported a queue
    pressed: bool = False  # a request came while it had no free slot, since the last round
    #: Uncached prompt tokens sent since the last round: KV its reported usage lacks yet.
    kv_sent_tokens: int = 0
    #: Uncached prompt tokens of Pharos's requests on it still without a first byte: an
    #: engine's usage holds none of a prompt still queued there and only the chunks computed
    #: so far of one being prefilled, so a round's usage does not count them either.
    kv_unstarted_tokens: int = 0
    #: Rounds that reset ``kv_sent_tokens``: a lease that had its first byte in the current
    #: one is still in it, and gives its KV back to it when it ends.
    kv_round: int = 0
    #: KV of Pharos's requests that were running at the last round and have ended since:
    #: that round's usage still shows their blocks, free in the engine now.
    kv_freed_tokens: int = 0
    quiet_rounds: int = 0  # rounds in a row pressed with no engine queue, after one set it
    #: The engine was seen reporting KV usage with nothing running or queued: it counts its
    #: prefix cache's fill, so its usage says nothing of the room a new prompt has.
    kv_counts_cache: bool = False
    #: How many of its unstarted requests are streamed (their first byte ends their prefill),
    #: and until when the last one sent holds it for a key over its share (``Scheduler``
    #: pacing: ``PACE_MAX_SEC`` after the send, unless every one has started before).
    unstarted_streams: int = 0
    pace_until: float = 0.0

    #: The stamp of its last write that its view or candidate may read (``_STAMPS``);
    #: ``view_stamp``: of its last write that its view may read (``VIEWED``). A dispatch
    #: writes only what the candidate reads (in-flight, KV sent, queued prefill), so the
    #: next decision rebuilds the candidate and keeps the view.
    stamp: ClassVar[int] = 0
    view_stamp: ClassVar[int] = 0
    #: Fields ``view_of`` and ``view_expires`` read (a test checks the others do not matter).
    VIEWED: ClassVar[frozenset[str]] = frozenset({
        "id", "backend", "model", "served", "loaded_reply_at", "last_release_at"})
    #: Fields neither ``view_of`` nor ``Scheduler.candidate`` reads, written without a new
    #: stamp (``pressed`` is set on every candidate of every decision). A test checks them.
    QUIET: ClassVar[frozenset[str]] = frozenset({
        "pressed", "unstarted", "last_first_byte_at", "capacity_seen_max", "quiet_rounds",
        "gen", "kv_unstarted_tokens", "kv_round", "pace_until",
        "unstarted_streams"})

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name not in Target.QUIET:
            n = next(_STAMPS)
            object.__setattr__(self, "stamp", n)
            if name in Target.VIEWED:
                object.__setattr__(self, "view_stamp", n)

    def touched(self) -> None:
        """Something the candidate reads changed outside its fields (its stats; no view
        reads them)."""
        object.__setattr__(self, "stamp", next(_STAMPS))

    @property
    def key(self) -> str:
        """The name peers use: backend URL + model."""
        return f"{self.backend.url}#{self.model}"


@dataclass(frozen=True, slots=True)
class View:
    """A target's signals as of now; stale or unknown signals are None."""

    up: bool
    residency: Residency
    running: int | None
    waiting: int | None
    capacity: int | None
    kv_usage: float | None
    kv_pool_tokens: int | None  # the engine's KV pool, tokens (full rounds)
    size_bytes: int | None
    vram_bytes: int | None
    load_fresh: bool  # the load signals are newer than the last reply that ended on it
    #: The signals taken from the backend's log feed (no scraped probe knew them).
    from_log: frozenset[str] = frozenset()


def rename(snap: Snapshot, aliases: Mapping[str, str]) -> Snapshot:
    """The snapshot with the engine's model names replaced by the names clients use."""
    if not aliases:
        return snap

    def n(m: str) -> str:
        return aliases.get(m, m)

    def keys(d: Mapping[str, object] | None) -> dict[str, object] | None:
        return None if d is None else {n(k): v for k, v in d.items()}

    return Snapshot(
        version=snap.version,
        models=None if snap.models is None else tuple(n(m) for m in snap.models),
        residency=keys(snap.residency),  # type: ignore[arg-type]
        vram_bytes=keys(snap.vram_bytes),  # type: ignore[arg-type]
        size_bytes=keys(snap.size_bytes),  # type: ignore[arg-type]
        load={m if m == WHOLE_BACKEND else n(m): v for m, v in snap.load.items()},
        sources=snap.sources,
    )


#: A load with every signal unknown (a ``Load`` is immutable, so one serves every view).
_NO_LOAD = Load()


def view_of(
    target: Target,
    now: float,
    load_interval: float,
    full_interval: float,
    is_up: Callable[[BackendState, float], bool],
) -> View:
    """Derive a target's view from its backend's last rounds (stale signals are unknown)."""
    b = target.backend
    full_fresh = b.full is not None and b.full_at is not None and (
        now - b.full_at <= STALE_AFTER_INTERVALS * full_interval)
    load_fresh = b.load is not None and b.load_at is not None and (
        now - b.load_at <= STALE_AFTER_INTERVALS * load_interval)
    residency = Residency.UNKNOWN
    size = vram = None
    capacity = pool = None
    if full_fresh and b.full is not None:
        info = b.full.model_info(target.model)
        residency, size, vram = info.state, info.size_bytes, info.vram_bytes
        full_load = b.full.load_for(target.model)
        capacity, pool = full_load.capacity, full_load.kv_pool_tokens
    if target.loaded_reply_at is not None and (b.full_at is None or
                                               target.loaded_reply_at > b.full_at):
        residency = Residency.LOADED  # a reply proved it loaded; the next full round decides
    load = _NO_LOAD
    fast_at = None
    if load_fresh and b.load is not None:
        load, fast_at = b.load.load_for(target.model), b.load_at
    elif full_fresh and b.full is not None and b.full_at is not None and (
            now - b.full_at <= STALE_AFTER_INTERVALS * load_interval):
        load, fast_at = b.full.load_for(target.model), b.full_at
    fresh = fast_at is not None and (target.last_release_at is None or
                                     fast_at > target.last_release_at)
    view = View(
        up=is_up(b, now),
        residency=residency,
        running=load.running,
        waiting=load.waiting,
        capacity=capacity if capacity is not None else load.capacity,
        kv_usage=load.kv_usage,
        kv_pool_tokens=pool if pool is not None else load.kv_pool_tokens,
        size_bytes=size,
        vram_bytes=vram,
        load_fresh=fresh,
    )
    return view if b.log is None else with_log(view, b.log, target.model)


def edge(anchor: float, span: float) -> float:
    """A time before which ``now - anchor <= span`` surely holds: a hair before the exact
    boundary, so float rounding never keeps a cached view past the moment a fresh one would
    differ (expiring a little early only rebuilds it)."""
    return anchor + span - 1e-12 * (abs(anchor) + span) - 1e-9


def view_expires(target: Target, now: float, load_interval: float,
                 full_interval: float) -> float:
    """When the target's view as of ``now`` may next change by time alone: the first of its
    fresh rounds to go stale. ``inf``: not until something is written."""
    b = target.backend
    out = math.inf
    full_at, load_at = b.full_at, b.load_at
    full_fresh = b.full is not None and full_at is not None and (
        now - full_at <= STALE_AFTER_INTERVALS * full_interval)
    if full_fresh:
        assert full_at is not None
        out = edge(full_at, STALE_AFTER_INTERVALS * full_interval)
    if b.load is not None and load_at is not None and (
            now - load_at <= STALE_AFTER_INTERVALS * load_interval):
        out = min(out, edge(load_at, STALE_AFTER_INTERVALS * load_interval))
    elif full_fresh and full_at is not None and (
            now - full_at <= STALE_AFTER_INTERVALS * load_interval):  # it stands in for load
        out = min(out, edge(full_at, STALE_AFTER_INTERVALS * load_interval))
    return out


#: The view fields a log value may fill, by signal.
_LOG_FIELDS: tuple[Signal, ...] = (Signal.RUNNING, Signal.WAITING, Signal.CAPACITY,
                                   Signal.KV_USAGE, Signal.KV_POOL_TOKENS)


def with_log(view: View, log: Snapshot, model: str) -> View:
    """The view with the log feed's values where no scraped probe knows the signal;
    ``from_log`` names the signals filled so."""
    filled: dict[str, object] = {}
    if view.residency is Residency.UNKNOWN and log.residency:
        state = log.residency.get(model, Residency.UNKNOWN)
        if state is not Residency.UNKNOWN:
            filled[Signal.RESIDENCY.value] = state
    if log.load:
        load = log.load_for(model)
        for s in _LOG_FIELDS:
            v = load.get(s)
            if v is not None and getattr(view, s.value) is None:
                filled[s.value] = v
    if not filled:
        return view
    return replace(view, from_log=frozenset(filled), **filled)  # type: ignore[arg-type]
