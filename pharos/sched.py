"""The scheduler (spec §8): admission, occupancy, the per-key fair queue and leases.

Picking a target and taking a slot on it is one synchronous step (the reactor is
single-threaded), so two requests never both see one slot as free. A request that cannot be
placed waits in its key's FIFO; keys are served by deficit round-robin on their weights, and
every freed slot (and every scrape round) re-runs the next waiters through the policy.

The scheduler also owns the learning around a decision (spec §6, §7): it looks the request's
prefix chain up in the ``PrefixIndex`` (each target's predicted cached tokens enter the cost),
gives a hot root prefix more than one owner (``pharos.hot``), remembers each session's last
target for affinity, and on release records the prompt (a success), corrects the index (the
engine cached far less than predicted) or forgets it (an error reply), counting every outcome.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field

from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IDelayedCall

from pharos.config import DEFAULT_TENANT
from pharos.engine.library import LLAMASWAP, OLLAMA
from pharos.engine.signals import Residency
from pharos.fairq import FairQueue, Shares
from pharos.hot import UTILIZATION, HotPrefixes
from pharos.placement import (
    KEEP_ALIVE_SEC,
    SLOT_DEMAND_HALF_LIFE_SEC,
    LoadRates,
    ModelDemand,
    ReplicaRule,
    Resident,
    drain_hold,
    horizon,
    reload_price,
    replica_hold,
    replica_needed,
    swap_hold,
    victims,
)
from pharos.policy import Candidate, Decision, PolicyConfig, RouteReq, pick, rank
from pharos.prefix import (
    BYTES_PER_TOKEN,
    EMPTY,
    Chain,
    Match,
    PrefixIndex,
    PrefixOp,
    Source,
    classify,
    drop_oldest,
)
from pharos.retention import RootCaches
from pharos.state.registry import BackendState, Target, View, new_stamp
from pharos.state.state import CachedView, State
from pharos.state.stats import Sample, load_sample

#: Waiters per instance before a new request gets 429 (spec §8).
QUEUE_LIMIT = 1000
#: Slots of a target whose engine and config say nothing: saturated after this many requests
#: or as soon as the engine reports a queue (assumed, spec §14 ledger).
DEFAULT_CAPACITY = 2
#: A Running count above this is not a capacity any engine has: the round's count is taken
#: as unknown for learning (a broken or hostile metrics page).
MAX_PLAUSIBLE_CAPACITY = 4096
#: ``Candidate.warm`` by residency (unknown: None), built once: ``candidate`` runs for every
#: target of every decision.
_WARM: dict[Residency, bool] = {Residency.LOADED: True, Residency.LOADING: True,
                                Residency.COLD: False}
#: Consecutive rounds with an engine queue before its Running is taken as the capacity.
QUEUE_ROUNDS = 2
#: Fleets of fewer targets are decided by the full pass alone: the kept fleet's scan and
#: upkeep cost more than testing a few kept candidates (a 1-target fleet's acquire and
#: release took 53 us with the full pass, 58-73 us with the kept fleet).
FLEET_MIN_TARGETS = 8
#: KV usage (the share of blocks running requests hold, as vLLM counts it) at or above which
#: an engine queue is taken as waiting for blocks, not for a sequence slot (assumed: a pool
#: this full has no room for one more prompt of a few percent of it).
KV_BOUND_USAGE = 0.8
#: KV usage above which an engine running and queueing nothing (and with nothing of Pharos's
#: in flight) counts its cache's fill: vLLM and SGLang count only blocks running requests
#: hold (0 at rest, seen in the live captures), a cache-fill count stays near 1 once the pool
#: has cycled.
KV_AT_REST_CACHE = 0.5
#: Rounds in a row with requests finding a target full and its engine queueing nothing before
#: a capacity an engine queue set is tried past again: a queue seen once (a burst at start, a
#: stalled VM) pinned a 64-sequence engine at 4 slots for good. At a real --max-num-seqs the
#: retry parks one request in the engine's queue for two rounds every this many (assumed).
REPROBE_ROUNDS = 10
#: Where a target's capacity came from (explain, doctor).
CAPACITY_ENGINE, CAPACITY_CONFIG, CAPACITY_LEARNED, CAPACITY_DEFAULT = (
    "engine", "config", "learned", "default")
#: The fair queue's cost of a request (``request_cost``), in decode tokens: a prompt token
#: costs this fraction of one (assumed: batched prefill runs about ten tokens in the engine
#: time of one decode step's token); an output limit counts at most ``MAX_COST_OUTPUT_TOKENS``
#: (a ``max_tokens`` of 10^9 is not a billion tokens of work) and, unset, ``DEFAULT_OUTPUT_TOKENS``.
PREFILL_TOKENS_PER_DECODE_TOKEN = 10
MAX_COST_OUTPUT_TOKENS = 4096
DEFAULT_OUTPUT_TOKENS = 256
#: Sessions remembered for affinity (least recently used go first).
SESSIONS = 100_000
#: Engines whose prefix cache serves every request as soon as a prompt is computed, so a
#: prompt is recorded at its reply's first byte: vLLM (live test
#: test_prefix_is_shared_from_the_first_token). llama.cpp and Ollama cache per slot and are
#: recorded when the reply ends (spec §6, measured).
SHARED_CACHE_KINDS = frozenset({"vllm"})
#: A root prefix shorter than this (estimated tokens) is not worth spreading.
HOT_MIN_TOKENS = 256
#: A peer's gauges count until it has been silent this long (spec §8, §12).
PEER_SILENCE_SEC = 2.0
#: Waiters behind a blocked head that swap grouping tries (``Scheduler._pass``).
PASS_LIMIT = 64

#: A waiter's target set (model, engine kind, targets excluded): waiters with the same set see
#: the same free slots, whatever else differs between them.
Selection = tuple[str, str | None, frozenset[int]]
#: Entries one peer's gauges may hold (targets plus models): far above any fleet, so a peer
#: sending more is broken or hostile and its report is refused.
MAX_GAUGE_ENTRIES = 10_000


def max_loaded(backend: BackendState) -> int | None:
    """Models the backend's host keeps loaded at once: its config's ``max_loaded_models``,
    else 1 for llama-swap (its default group swaps), else None (memory alone limits it)."""
    limit = backend.spec.max_loaded_models
    if limit is None and backend.kind == LLAMASWAP:
        return 1
    return limit


def names_victims(backend: BackendState) -> bool:
    """Whether Pharos tells the host which idle models a cold load pushes out (``Lease.unload``)
    rather than leaving the choice to it: Ollama unloads a model on a request with no prompt
    and ``keep_alive: 0`` (server/routes.go, sched.go ``expireRunner``: its keep-alive becomes
    0, and a load needing room takes the shortest keep-alive first, ``findRunnerToUnload``).
    The cost policy only: the baseline policies leave it to the host, as other routers do."""
    return backend.kind == OLLAMA


def with_match(c: Candidate, matched_tokens: int, holds_root: bool = False) -> Candidate:
    """``c`` with ``matched_tokens`` (``dataclasses.replace`` spelled out: it took 5 us a
    call, and a decision makes one per target holding the prompt). A test checks that it
    copies every field.

    ``holds_root``: the match covers the prompt's root. Such a target full at a capacity
    Pharos estimated (``Candidate.capacity_open``) is given a slot while nothing queues
    ahead: it may run more, and the engine's queue says when it does not (``learn_capacity``
    stops it the round one shows). Shared-prefix bench, virtual time, seeds 1-10 both
    starts: cells where cost's p99 is over prefix-aware's 6 -> 2 of 20; the holders were
    full at the 6-10 slots learned so far of the doubles' 64."""
    free = c.free_slots
    if holds_root and free <= 0 and c.capacity_open and c.queue_ahead <= 1:
        free = 1  # (the request itself is the one waiter counted)
    return Candidate(
        target_id=c.target_id, warm=c.warm, capacity=c.capacity, free_slots=free,
        queue_ahead=c.queue_ahead, kv_usage=c.kv_usage, matched_tokens=matched_tokens,
        prefill_sec_per_token=c.prefill_sec_per_token, load_sec=c.load_sec,
        service_sec=c.service_sec, fits_if_cold=c.fits_if_cold, loading=c.loading,
        inflight=c.inflight, queued_prefill_sec=c.queued_prefill_sec,
        evict_tokens=c.evict_tokens, kv_free_tokens=c.kv_free_tokens,
        reload_sec=c.reload_sec, victims=c.victims, load_basis=c.load_basis,
        held=c.held, prefill_model=c.prefill_model, capacity_open=c.capacity_open)


class GaugeError(ValueError):
    """A peer's gauges are malformed (what is wrong is in the message)."""


def _gauge_counts(raw: object, name: str) -> dict[str, int]:
    """One ``{name: count}`` part of a peer's gauges, checked: strings to non-negative ints."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise GaugeError(f"gauges.{name}: expected an object, got {type(raw).__name__}")
    if len(raw) > MAX_GAUGE_ENTRIES:
        raise GaugeError(f"gauges.{name}: {len(raw)} entries, more than {MAX_GAUGE_ENTRIES}")
    out: dict[str, int] = {}
    for k, v in raw.items():
        if not isinstance(k, str) or type(v) is not int or v < 0:
            raise GaugeError(f"gauges.{name}: expected names to non-negative integers, got "
                             f"{k!r}: {v!r}")
        if v:
            out[k] = v
    return out


@dataclass(slots=True)
class PeerGauges:
    """One peer's last report (spec §8): its in-flight requests per target key and waiters per
    model, and when (on this process's clock) it arrived."""

    heard_at: float
    inflight: dict[str, int]
    waiting: dict[str, int]


class UnknownModel(Exception):
    """No backend has ever listed the model (404)."""


class Unavailable(Exception):
    """Backends list the model, but none of them is up (503)."""


class QueueFull(Exception):
    """The fair queue is at its limit (429)."""


@dataclass(frozen=True, slots=True)
class SchedRequest:
    """What the scheduler needs of one request; ``exclude`` holds targets already tried."""

    model: str
    prompt_tokens: int
    seed: int
    exclude: frozenset[int] = frozenset()
    kind: str | None = None  # only backends of this kind (Ollama's native routes)
    chain: Chain = EMPTY  # the prompt's prefix chain (empty: no prediction)
    session: int | None = None  # the conversation it names (x-session-id or ``user``), hashed
    output_tokens: int | None = None  # the client's output limit (max_tokens), if it set one
    stream: bool = False  # its reply is streamed: its first byte ends its prefill (pacing)
    #: The policy routing it (its model's, or its A/B arm: ``pharos.models``); None: the
    #: scheduler's. A retry carries the same, so it stays on its arm.
    policy: PolicyConfig | None = None


@dataclass(frozen=True, slots=True)
class Guards:
    """The scheduler's side of the load guards; the policy's are in ``PolicyConfig``."""

    #: A root prefix gets another owner once it would keep one owner busier than this; None:
    #: no spreading.
    hot_prefix_utilization: float | None = UTILIZATION
    sessions: int = SESSIONS
    #: Price the live roots a prompt would push out of the only cache holding them
    #: (``pharos.retention``); False: off.
    eviction_pricing: bool = True
    #: Model placement (issue 15): replicas follow demand, single-model hosts group swaps,
    #: within a wait bound (``pharos.placement.ReplicaRule``; the cost policy only).
    placement: ReplicaRule = field(default_factory=ReplicaRule)


@dataclass(slots=True, eq=False)
class _Fleet:
    """The last full decision's candidates without a match over one list of targets, and what
    they stay current for: no write to a target or its backend since ``stamp`` (a scan of
    the stamps finds the few that had one), the clock in ``[lo, hi)`` (every kept view's
    window), the same waiters ahead and the same peers' sums. A decision then rebuilds only
    the targets written since and those in ``recheck`` (not kept: a cold model; or a view
    that read ``replied_at``, which takes no stamp): under load a dispatch or a reply writes
    one or two targets between two decisions, not 64."""

    targets: list[Target]
    base: list[Candidate]
    cold: dict[int, bool]
    colds: int
    recheck: set[int]
    stamp: int
    queued: int
    peers: dict[int, int] | None
    lo: float
    hi: float
    pos: dict[int, int]  # target id to its place in ``targets``


@dataclass(frozen=True, slots=True)
class Placement:
    """A decision with what went into it (for the lease, explain and tests)."""

    decision: Decision
    candidates: tuple[Candidate, ...]
    cold: dict[int, bool]
    matches: dict[int, Match]  # the index's prediction per target (before hot pricing)
    hot_owners: frozenset[int]  # targets priced as holding a hot root they do not hold
    affinity: int | None  # the session's last target, if any
    route: RouteReq | None = None  # what the policy was given (shadow policies replay it)


#: The longest pacing holds a target for a key over its share after a streamed request was
#: sent there, if no first byte comes sooner (an engine that stalls is the watchdog's).
#: Assumed. A reply that is not streamed holds nothing: its first byte is its last, and a
#: predicted TTFT in its place would throttle the flooding key wherever the prediction is
#: long (a layer-1 overload test lost a third of its heavy grants so).
PACE_MAX_SEC = 2.0


@dataclass(eq=False)
class Lease:
    """A slot on a target, held for one request; released once, with its feedback."""

    sched: Scheduler
    target: Target
    decision: Decision
    waited: bool
    cold: bool  # dispatched to a target whose model was cold
    released: bool = False
    key: str = ""  # whose request it is (the fair queue's shares)
    chain: Chain = EMPTY
    predicted_tokens: int = 0  # the index's prediction for this target (0: none)
    source: Source | None = None  # where the predicting slot came from
    est_ttft: float | None = None  # the policy's estimate for this target, seconds
    prefill_sec: float = 0.0  # the policy's prefill estimate, queued on the target until...
    kv_tokens: int = 0  # ...and the KV it takes that the engine's usage does not show
    kv_root: int = 0  # of ``kv_tokens``, its root's (the first there with that root pays it)
    started: bool = False  # ...the first byte of the reply arrived
    #: The target's ``kv_round`` at its first byte (None before it).
    kv_round: int | None = None
    #: Its first byte less the later of its grant and the target's previous first byte.
    prefill_window_sec: float | None = None
    granted_at: float = 0.0
    moved_at: float | None = None  # the last byte of its reply relayed (the watchdog's clue)
    #: Root tokens of the other roots sent to the target since this root was last used there
    #: (None: it was not held there): what the reply's cached tokens teach retention.
    root_ahead: int | None = None
    #: Its reply's prefix outcome (spec §13 ``prefix``), once released with a sample.
    prefix: str | None = None
    #: The policy that routed it (``x-pharos-policy``, metrics).
    policy: str = ""
    #: Its reply is streamed (``SchedRequest.stream``): its first byte holds its target's
    #: pacing until then (``Target.unstarted_streams``).
    stream: bool = False
    #: The idle models (as the host names them) its cold load pushes out, which the proxy asks
    #: the host to unload before sending it (``names_victims``): the ones Pharos priced as the
    #: cheapest to lose, not whichever the host would take.
    unload: tuple[str, ...] = ()

    def touch(self) -> None:
        """Bytes of the reply moved (called per relayed chunk)."""
        self.moved_at = self.target.backend.replied_at = self.sched.state.clock.seconds()

    def first_byte(self) -> None:
        """The engine answered: its prefill is no longer queued on the target, and an engine
        that shares its cache across requests holds the prompt from now on (spec §6)."""
        if self.started or self.released:
            return
        self.started = True
        t = self.target
        self.kv_round = t.kv_round
        now = self.sched.state.clock.seconds()
        since = self.granted_at
        if t.last_first_byte_at is not None and t.last_first_byte_at > since:
            since = t.last_first_byte_at  # a prefill ahead of it ended only then
        self.prefill_window_sec = now - since
        t.last_first_byte_at = now
        self.sched.started(self)

    def release(self, sample: Sample | None = None) -> None:
        """Free the slot and learn from the request; the next waiter runs at once."""
        if self.released:
            return
        self.released = True
        t = self.target
        t.inflight -= 1
        self.sched.shares.ended(self.key)
        self.sched.leases.discard(self)
        # Its own blocks, and its root's once no other request there has that root (the
        # first of them was charged the root; the last to end gives it back).
        back = self.kv_tokens - self.kv_root
        if self.chain:
            back += self.sched.root_ended(t.id, self.chain.keys[0])
        if back:
            if self.kv_round is None or self.kv_round == t.kv_round:
                # Still counted in ``kv_sent_tokens`` (sent, or started, since the last
                # round): its blocks are free in the engine now, and the next round's usage
                # will not show them. Kept, a shared system prompt's hits filled a small
                # pool's room within a round (shared-prefix bench: holders priced as full,
                # misses).
                t.kv_sent_tokens = max(0, t.kv_sent_tokens - back)
            else:
                # It ran at the last round, whose usage shows its blocks: free now, room
                # until the next round reads the usage again. Without this a small pool
                # whose short requests end within a round looked full for the rest of it,
                # and a system prompt's holder lost its hits to engines without it
                # (shared-prefix bench in virtual time: the misses made cost's p99).
                t.kv_freed_tokens += back
        self.sched.released_at = self.sched.state.clock.seconds()
        if not self.started:
            self.started = True
            self.sched.unqueue(self)
        if sample is not None and not sample.ok and self.cold and not sample.control:
            self.sched.failed_load(t)
        if sample is not None:
            load = load_sample(t.stats, sample)  # before feedback moves the prefill speed
            self.sched.state.feedback(t, sample)
            self.sched.learn_load(t, load)
            self.sched.learn(self, sample)
        else:
            t.last_release_at = self.sched.state.clock.seconds()
        self.sched.kick()


@dataclass(eq=False)
class _Waiter:
    key: str
    weight: int
    req: SchedRequest
    tenant: str = DEFAULT_TENANT
    tenant_weight: int = 1
    cost: float = 1.0  # the fair queue's charge (``request_cost``)
    queued_at: float = 0.0  # when it joined the queue (placement's wait bound)
    d: Deferred[Lease] = field(default_factory=Deferred)
    arriving: bool = True  # still inside acquire: a grant now did not wait


def request_cost(req: SchedRequest) -> float:
    """A request's work for the fair queue, in decode tokens: its output (the client's
    ``max_tokens``, capped, else ``DEFAULT_OUTPUT_TOKENS``) plus its prompt at
    ``PREFILL_TOKENS_PER_DECODE_TOKEN``."""
    out = req.output_tokens
    output = DEFAULT_OUTPUT_TOKENS if out is None else min(out, MAX_COST_OUTPUT_TOKENS)
    return 1.0 + output + req.prompt_tokens / PREFILL_TOKENS_PER_DECODE_TOKEN


class Scheduler:
    """Admission and the fair queue over the state's targets."""

    def __init__(
        self,
        state: State,
        policy: PolicyConfig,
        *,
        queue_limit: int = QUEUE_LIMIT,
        default_capacity: int = DEFAULT_CAPACITY,
        seed: Callable[[], int] = lambda: random.getrandbits(63),
        index: PrefixIndex | None = None,
        guards: Guards | None = None,
    ) -> None:
        self.state = state
        self.policy = policy
        self.index = index if index is not None else PrefixIndex()
        self.guards = guards or Guards()
        self.hot = HotPrefixes()
        #: Placement (issue 15): load rates per host, each model's demand, and how long an
        #: evicted model would have stayed loaded (the horizon of its eviction's price).
        self.load_rates = LoadRates()
        self.demand = ModelDemand()
        #: Each model's slot demand (slot-seconds per second, as ``hot`` counts roots): how
        #: many slots it keeps busy, for the replica rule (``placement.replica_hold``).
        self.slot_demand = ModelDemand(SLOT_DEMAND_HALF_LIFE_SEC)
        #: Per host (URL), the model last dispatched there, when, and since when it has been
        #: the one dispatched (its swap-in): on a host that holds one model at a time it is the
        #: loaded one until a round says otherwise.
        self.host_model: dict[str, tuple[str, float, float]] = {}
        #: Per host (URL), the idle models cold dispatches there since its last round were
        #: priced as pushing out of its memory (``Candidate.victims``), and when the last was:
        #: taken as cold until a round says what is loaded (a request for one sent there
        #: meanwhile pays a load that was priced as warm).
        self.host_evicted: dict[str, tuple[frozenset[str], float]] = {}
        #: Targets whose load failed, with their host's full round then: no load is tried
        #: there again until the next full round.
        self.load_failed: dict[int, int] = {}
        #: Waiters by model with when each queued (oldest first): the wait bound's clock.
        self._model_waiters: dict[str, dict[_Waiter, float]] = {}
        self.keep_alive_sec = KEEP_ALIVE_SEC
        self.roots = RootCaches()
        self._root_gens: dict[int, int] = {}  # target -> the generation its roots were sent to
        # A plain dict in LRU order (an OrderedDict of 100k sessions was 17 MB, this is 9).
        self.sessions: dict[int, int] = {}
        #: Every finished request's prefix outcome (spec §13 ``prefix``).
        self.outcomes: Counter[str] = Counter()
        #: Requests with a prediction, by (slot source, outcome): per-source accuracy.
        self.predictions: Counter[tuple[str, str]] = Counter()
        #: Requests the index could not follow, by reason.
        self.unfollowed: Counter[str] = Counter()
        self.queue_limit = queue_limit
        self.seed = seed
        self.queue: FairQueue[_Waiter] = FairQueue()
        self.shares = Shares()
        self._waiting_models: Counter[str] = Counter()  # waiters by model (the policy's queued)
        self._kicking = False
        #: Target sets (``Selection``) whose every target had no free slot, with the last
        #: backend write then (``BackendState.changes``), the time the views the decision read
        #: stay current until, and the targets: a waiter of one is passed over without a
        #: decision while both hold, and until something may free a slot (``kick``: a release,
        #: a scrape round, peers' gauges; a reload's capacities; each empties it). A full set
        #: gives every policy ``enqueue``, so the decision could only repeat itself (issue 16
        #: item 2: at 32 clients about 4 decisions ran per proxied request).
        self._full: dict[Selection, tuple[int, float, tuple[Target, ...]]] = {}
        #: Placement decisions run for waiters (``_try_place``): the count a test reads.
        self.decisions = 0
        #: Grants held back by pacing (a key over its share waits for the prefills already
        #: sent to its target to start), and the call that retries them when no first byte
        #: comes before the predicted one (a reply that is not streamed).
        self.paced = 0
        self._pace_call: IDelayedCall | None = None
        #: Leases held now, for the watchdog; when a request last started or a lease was
        #: last given back (a queue with neither for long is wedged: /healthz).
        self.leases: set[Lease] = set()
        self.granted_at: float | None = None
        self.released_at: float | None = None
        self.waiting_since: float | None = None
        #: Leases the watchdog found stuck (held past the drain timeout, no byte moving).
        self.stuck = 0
        #: Told of every prefix record and correction this process makes, for the peers
        #: (``PeerNode.push``: appends to bounded lists, never waits).
        self.on_prefix: Callable[[PrefixOp], None] | None = None
        #: Peers' last gauges by origin, and their sums over the live ones by target id and
        #: by model (recomputed when a report arrives or goes stale, not per decision).
        self.peers: dict[str, PeerGauges] = {}
        self._peer_inflight: dict[int, int] = {}
        self._peer_waiting: dict[str, int] = {}
        self._peer_until = math.inf  # when the first live report goes stale
        self._peer_since = -math.inf  # the clock when the sums were made (a clock that jumps)
        self._key_ids: dict[str, int] = {}
        #: Each target's last candidate without a match (``candidate``), with what it was
        #: built from: its view's kept entry (``State.kept_view``: the stamps and times it is
        #: current for, and the view), its stamp, the in-flight count with peers' and the
        #: waiters ahead.
        self._cands: dict[Target, tuple[CachedView, int, int, int, Candidate]] = {}
        #: Each target's last candidate with a match: (the unmatched candidate it copies, the
        #: matched tokens, the copy), served again while both are the same.
        self._matched: dict[Target, tuple[Candidate, int, bool, Candidate]] = {}
        #: Each (model, kind)'s kept fleet (``_Fleet``), for requests that exclude no target.
        self._fleets: dict[tuple[str, str | None], _Fleet] = {}
        self._default_capacity = default_capacity
        #: ``models[].cost_model`` by model name, for backends without their own.
        self._model_costs: dict[str, tuple[float, float, float]] = {}
        #: Requests routed per model: round robin's turn (``RouteReq.seq``).
        self.turns: Counter[str] = Counter()
        #: Leases in flight by (target, root prefix): a prompt whose root another of them
        #: holds there finds its cached blocks already in the engine's KV usage.
        self.roots_inflight: Counter[tuple[int, int]] = Counter()
        #: The root tokens the first of them was charged (``_kv_tokens``), given back when
        #: the last one ends.
        self.root_charge: dict[tuple[int, int], int] = {}
        #: Told of every decision that placed a request, with the request and the placement
        #: (shadow policies, ``pharos.shadow``: they queue it and return at once).
        self.on_route: Callable[[SchedRequest, Placement], None] | None = None

    @property
    def model_costs(self) -> dict[str, tuple[float, float, float]]:
        """Each model's prefill cost model (``models[].cost_model``), used on backends that
        have none of their own; set whole (a reload), which rebuilds the candidates."""
        return self._model_costs

    @model_costs.setter
    def model_costs(self, value: dict[str, tuple[float, float, float]]) -> None:
        self._model_costs = dict(value)
        self._full.clear()
        self._cands.clear()
        self._matched.clear()
        self._fleets.clear()

    @property
    def default_capacity(self) -> int:
        """Slots of a target whose engine, config and learning say nothing."""
        return self._default_capacity

    @default_capacity.setter
    def default_capacity(self, value: int) -> None:
        self._default_capacity = value
        self._full.clear()
        self._cands.clear()
        self._matched.clear()
        self._fleets.clear()

    # --- admission -----------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Requests in the fair queue now."""
        return self.queue.waiting

    def acquire(self, key: str, weight: int, req: SchedRequest, front: bool = False, *,
                tenant: str = DEFAULT_TENANT, tenant_weight: int = 1) -> Deferred[Lease]:
        """A lease on the best target now, or a place in the fair queue under ``tenant`` and
        ``key`` (at the front of its key's FIFO for a retry).

        Fails at once with UnknownModel, Unavailable or QueueFull.
        """
        try:
            self.targets(req)
        except (UnknownModel, Unavailable) as e:
            return fail(e)
        w = _Waiter(key, max(1, weight), req, tenant, max(1, tenant_weight), request_cost(req),
                    queued_at=self.state.clock.seconds())
        self.shares.seen(key, w.weight, self.state.clock.seconds(), w.tenant, w.tenant_weight)
        w.d = Deferred(lambda _: self._leave(w))
        if not self.waiting:
            self.waiting_since = self.state.clock.seconds()
        self.queue.push(w, front)
        self._waiting_models[req.model] += 1
        self._model_waiters.setdefault(req.model, {})[w] = w.queued_at
        self._kick()  # an arrival frees no slot: target sets found full stay so
        w.arriving = False
        if not w.d.called and self.waiting > self.queue_limit:
            self._leave(w)
            return fail(QueueFull())
        return w.d

    def stuck_for(self, now: float) -> float | None:
        """How long requests have waited with no request starting and no lease given back;
        None while nothing waits."""
        if not self.waiting:
            return None
        last = max(x for x in (self.granted_at, self.released_at, self.waiting_since)
                   if x is not None)
        return now - last

    def _leave(self, w: _Waiter) -> None:
        if self.queue.remove(w):
            self._unwait(w)

    def _unwait(self, w: _Waiter) -> None:
        waiters = self._model_waiters.get(w.req.model)
        if waiters is not None:
            waiters.pop(w, None)
            if not waiters:
                del self._model_waiters[w.req.model]
        n = self._waiting_models[w.req.model] - 1
        if n:
            self._waiting_models[w.req.model] = n
        else:
            del self._waiting_models[w.req.model]

    # --- the fair queue ------------------------------------------------------------------

    def kick(self) -> None:
        """Something may have freed a slot (a release, a scrape round, peers' gauges): serve
        waiters while slots allow, in the fair queue's order (``pharos.fairq``); a key whose
        head waiter cannot be placed now is passed over without losing its place."""
        self._full.clear()
        self._kick()

    def _kick(self) -> None:
        """``kick`` with no change to what is free (a new waiter): target sets found full
        since the last change are passed over without a decision."""
        if self._kicking:
            return
        self._kicking = True
        try:
            blocked: set[str] = set()
            while self.waiting:
                if not self._grant_one(blocked):
                    break
        finally:
            self._kicking = False

    def _grant_one(self, blocked: set[str]) -> bool:
        for w in self.queue.heads():
            if w.key in blocked:
                continue
            lease = self._try_place(w)
            if lease is None:
                lease, w = self._pass(w)
                if lease is None:
                    blocked.add(w.key)
                    continue
            self.queue.served(w)
            self._unwait(w)
            w.d.callback(lease)
            return True
        return False

    def _pass(self, head: _Waiter) -> tuple[Lease | None, _Waiter]:
        """Swap grouping (issue 15 item 4): a key whose head cannot be placed (its model cold
        where the loaded model is busy, or its swap held) lets a later waiter of another model
        go first, so the loaded model's queued requests are served before a swap; the head
        keeps its place, and the wait bound (``placement.drain_hold``) stops the loaded model
        from taking its host for ever. Off without ``swap_grouping`` or under another policy
        than cost."""
        if (not self.guards.placement.swap_grouping or self.policy.name != "cost"
                or len(self._model_waiters) < 2):
            return None, head  # (every waiter is of the head's model: none may pass it)
        tried: set[str] = {head.req.model}
        for w in self.queue.behind(head, PASS_LIMIT):
            if w.req.model in tried:
                continue
            tried.add(w.req.model)
            lease = self._try_place(w)
            if lease is not None:
                return lease, w
        return None, head

    # --- placing one request -------------------------------------------------------------

    def _pace(self, w: _Waiter, req: SchedRequest, targets: list[Target], placed: Placement,
              target: Target) -> tuple[Placement, Target] | None:
        """Pacing: a key over its share, while a key under its share is active, sends a
        target no prefill while the prefills already sent there have not started. A
        vLLM-like engine runs the prompts joining a step with its decodes, so each prefill a
        flooding key adds to a step delays the light key's requests arriving during it or
        joining it; one at a time per target bounds that to one prompt. The light key's own
        unstarted request holds its target too, so no flooding prefill joins its first step.
        Streamed requests only (``Target.unstarted_streams``): their first byte says their
        prefill ended. A held target's request goes to the best target not held, or waits
        for a first byte (at most ``PACE_MAX_SEC`` after the last streamed send). Returns
        the placement to use, or None to wait."""
        now = self.state.clock.seconds()
        if now >= target.pace_until or not self.shares.over_share(
                w.key, sum(c.capacity for c in placed.candidates), now):
            return placed, target
        self.paced += 1
        ts = self.state.targets
        held = frozenset(c.target_id for c in placed.candidates
                         if ts[c.target_id].unstarted_streams
                         and now < ts[c.target_id].pace_until)
        if len(held) < len(targets):
            other = self.decide(dataclasses.replace(req, exclude=req.exclude | held),
                                [t for t in targets if t.id not in held], now - w.queued_at)
            d = other.decision
            if d.target_id is not None and not d.enqueue:
                return other, ts[d.target_id]
        until = min(ts[i].pace_until for i in held)
        call = self._pace_call
        if call is None or not call.active() or call.getTime() > until:
            if call is not None and call.active():
                call.cancel()
            self._pace_call = self.state.clock.callLater(until - now, self.kick)
        return None

    def _release_sec(self, candidates: tuple[Candidate, ...]) -> float | None:
        """The mean seconds between releases on ``candidates`` (their slots over their
        learned service times, the mean of those learned where one is not yet), which sizes
        the room (``pharos.fairq.room_for``); None while none is learned."""
        known = [v for c in candidates if (v := c.service_sec)]
        if not known:
            return None
        mean = sum(known) / len(known)
        per_sec = sum(c.capacity / (c.service_sec or mean) for c in candidates)
        return 1.0 / per_sec if per_sec > 0 else None

    def targets(self, req: SchedRequest) -> list[Target]:
        """The up targets the request may go to; raises UnknownModel or Unavailable."""
        up = self.state.targets_for(req.model)
        exclude, kind = req.exclude, req.kind
        targets = (list(up) if not exclude and kind is None else
                   [t for t in up if t.id not in exclude
                    and (kind is None or t.backend.kind == kind)])
        if not targets:
            if not self.state.listed_anywhere(req.model, req.kind):
                raise UnknownModel(req.model)
            raise Unavailable(req.model)
        return targets

    def _try_place(self, w: _Waiter) -> Lease | None:
        req = w.req
        sel: Selection = (req.model, req.kind, req.exclude)
        full = self._full.get(sel)
        if full is not None:
            now = self.state.clock.seconds()
            if (full[0] == BackendState.changes and now < full[1]
                    and (not self.peers or now < self._peer_until)):
                for t in full[2]:
                    t.pressed = True  # as the decision would have marked them
                return None
            del self._full[sel]
        try:
            targets = self.targets(req)
        except (UnknownModel, Unavailable) as e:
            self._fail_later(w, e)
            return None
        self.decisions += 1
        placed = self.decide(req, targets, self.state.clock.seconds() - w.queued_at)
        free = False
        for c in placed.candidates:
            if c.free_slots <= 0:
                # A request came while it had no free slot: a reason to try one more there
                # (``learn_capacity``), whether this one waits or goes elsewhere.
                self.state.targets[c.target_id].pressed = True
            else:
                free = True
        decision = placed.decision
        if decision.target_id is None or decision.enqueue:
            if not free:
                self._remember_full(sel, targets)
            return None
        free_slots = sum(max(0, c.free_slots) for c in placed.candidates)
        capacity = sum(c.capacity for c in placed.candidates)
        if free_slots <= self.shares.room_limit(capacity) and self.shares.must_leave_room(
                w.key, w.weight, free_slots, capacity, self.state.clock.seconds(),
                self._release_sec(placed.candidates)):
            return None
        target = self.state.targets[decision.target_id]
        whole = placed  # the decision over every target (pacing may take one over fewer)
        if target.unstarted_streams:
            paced = self._pace(w, req, targets, placed, target)
            if paced is None:
                return None
            placed, target = paced
            decision = placed.decision
        target.inflight += 1
        if self.queue.waiting > 1 and placed is whole and all(
                c.free_slots <= 0 or (c.target_id == target.id and c.free_slots == 1
                                      and c.capacity - 1 <= c.inflight)
                for c in placed.candidates):
            # It took the set's last free slot, one counted from our requests (not from the
            # engine's running count): the next waiter of the set need not be decided.
            self._remember_full(sel, targets)
        self.shares.started(w.key)
        self.turns[req.model] += 1
        match = placed.matches.get(target.id)
        terms = decision.target_terms
        assert terms is not None
        lease = Lease(self, target, decision, waited=not w.arriving, cold=placed.cold[target.id],
                      key=w.key, chain=req.chain,
                      predicted_tokens=min(match.tokens, req.prompt_tokens) if match else 0,
                      source=match.source if match else None, est_ttft=terms[1],
                      prefill_sec=terms[3] + terms[4],
                      policy=(req.policy or self.policy).name)
        target.queued_prefill += lease.prefill_sec
        if req.stream:
            lease.stream = True
            target.unstarted_streams += 1
            target.pace_until = self.state.clock.seconds() + PACE_MAX_SEC
        target.unstarted += 1
        lease.kv_tokens, lease.kv_root = self._kv_tokens(req, target.id, lease.predicted_tokens)
        target.kv_sent_tokens += lease.kv_tokens
        target.kv_unstarted_tokens += lease.kv_tokens
        now = self.state.clock.seconds()
        lease.granted_at = self.granted_at = now
        self.leases.add(lease)
        b = target.backend
        if b.spec.memory_gb is not None or max_loaded(b) is not None:  # a host that may swap
            hm = self.host_model.get(b.url)
            self.host_model[b.url] = (
                target.model, now, hm[2] if hm is not None and hm[0] == target.model else now)
            he = self.host_evicted.get(b.url)
            gone = (he[0] if he is not None and (b.full_at is None or b.full_at <= he[1])
                    else frozenset())  # the earlier ones, while no full round has come since
            if placed.cold[target.id]:
                won = next((c for c in placed.candidates if c.target_id == target.id), None)
                if won is not None:
                    gone |= frozenset(won.victims)
                    if won.victims and names_victims(b) and lease.policy == "cost":
                        served = {o.model: o.served for o in self.state.targets
                                  if o.backend is b}
                        lease.unload = tuple(served[v] for v in won.victims if v in served)
            gone -= {target.model}  # loaded there again
            if gone:
                self.host_evicted[b.url] = (gone, now)
            elif he is not None:
                del self.host_evicted[b.url]
        lease.root_ahead = self._dispatched(req, target, now - w.queued_at)
        if self.on_route is not None:
            self.on_route(req, placed)
        return lease

    def _kv_tokens(self, req: SchedRequest, tid: int, predicted: int) -> tuple[int, int]:
        """The KV a prompt takes on its target that the engine's last reported usage does
        not show, and the part of it that is its root's: its uncached tokens, and its
        predicted cached ones too unless another request in flight there has the same root.
        vLLM's usage counts the blocks of running requests: a cached prefix no running
        request holds is free (evictable) there, and held once this prompt runs. Counting
        only the uncached part priced two cache hits of 2,000 tokens as taking 500 tokens
        where they took 4,500 (mix at 3 req/s, issue 10 item 4: a prompt sent there as
        fitting waited 0.8 s for blocks)."""
        tokens = max(0, req.prompt_tokens)
        if not req.chain:
            return tokens, 0
        key = (tid, req.chain.keys[0])
        held = self.roots_inflight[key] > 0
        self.roots_inflight[key] += 1
        if held:
            return max(0, req.prompt_tokens - predicted), 0
        root = min(tokens, req.chain.ends[0] // BYTES_PER_TOKEN)
        self.root_charge[key] = root
        return tokens, root

    def root_ended(self, tid: int, root: int) -> int:
        """A lease with this root on this target ended (``roots_inflight``): the root's
        tokens its first lease was charged when it was the last one, else 0."""
        key = (tid, root)
        n = self.roots_inflight[key] - 1
        if n > 0:
            self.roots_inflight[key] = n
            return 0
        self.roots_inflight.pop(key, None)
        return self.root_charge.pop(key, 0)

    def _remember_full(self, sel: Selection, targets: list[Target]) -> None:
        """Every target of ``sel`` has no free slot now: remember it until the next ``kick``,
        a backend write, a view the decision read expiring (``State.kept_view``) or a peer's
        report going stale. Not when a view reads ``replied_at`` (an up-ness that a relayed
        byte may change)."""
        until = math.inf
        for t in targets:
            e = self.state.kept_view(t)
            if e is None or e[5]:
                return
            until = min(until, e[4])
        self._full[sel] = (BackendState.changes, until, tuple(targets))

    def _dispatched(self, req: SchedRequest, target: Target, waited: float = 0.0
                    ) -> int | None:
        """Count the root's demand, note the root in the target's cache and remember the
        session's target. Returns ``RootCaches.sent``'s answer.

        A model's slot demand counts the request's time waiting in Pharos with its service:
        the requests wanting a slot, not only those holding one (by Little's law), so it can
        exceed the slots its hosts serve when a queue persists, which is what the replica
        rule asks (``placement.replica_needed``); counting service alone measured the slots
        already busy, never more than there are."""
        now = self.state.clock.seconds()
        self.demand.add(req.model, now)
        self.slot_demand.add(req.model, now, max(0.0, waited) + (
            target.stats.service_sec.value or self.policy.service_sec_default))
        ahead = None
        if req.chain:
            root = req.chain.keys[0]
            if self.guards.hot_prefix_utilization is not None:
                service = target.stats.service_sec.value or self.policy.service_sec_default
                self.hot.add(root, service, now)
            self._roots_gen(target.id, target.gen, now)
            tokens = req.chain.ends[0] // BYTES_PER_TOKEN
            moved = self.roots.pushed_out(target.id, root) or root not in self.roots.held(
                target.id)
            ahead = self.roots.sent(target.id, root, tokens, now)
            if self.on_prefix is not None:  # peers learn of it now, not at the first byte
                self.on_prefix(PrefixOp(target.key, req.chain.keys, now, dispatched=True,
                                        root_tokens=tokens, moved=moved))
        if req.session is not None and self.policy.session_affinity:
            self.sessions.pop(req.session, None)
            self.sessions[req.session] = target.id
            if len(self.sessions) > self.guards.sessions:
                drop_oldest(self.sessions, self.guards.sessions)
        return ahead

    def unqueue(self, lease: Lease) -> None:
        """The lease's prefill is done (or abandoned): off its target's queue."""
        t = lease.target
        t.unstarted -= 1
        if lease.stream:
            t.unstarted_streams -= 1
        t.queued_prefill = t.queued_prefill - lease.prefill_sec if t.unstarted > 0 else 0.0
        t.kv_unstarted_tokens = (max(0, t.kv_unstarted_tokens - lease.kv_tokens)
                                 if t.unstarted > 0 else 0)

    def started(self, lease: Lease) -> None:
        """The first byte of a reply: unqueue its prefill; record the prompt now on engines
        that share their prefix cache across requests."""
        self.unqueue(lease)
        t = lease.target
        if lease.chain and t.backend.kind in SHARED_CACHE_KINDS:
            now = self.state.clock.seconds()
            self.index.record(lease.chain, t.id, t.gen, now)
            self._push(lease.chain, t, now, False)
        # Its prefill is off the queue (holds weigh queued prefill), but no slot is free:
        # target sets found full stay so.
        self._kick()

    def learn(self, lease: Lease, sample: Sample) -> None:
        """What the reply teaches the prefix index (spec §6): record a success, correct a
        wrong prediction, forget an error reply; count the outcome."""
        chain = lease.chain
        if not chain:
            return
        t = lease.target
        now = self.state.clock.seconds()
        if not sample.ok:
            self.index.forget(chain, t.id)
            self._push(chain, t, now, True)
            return
        if sample.control:
            return
        self.roots.learn(t.id, chain.ends[0] // BYTES_PER_TOKEN, lease.root_ahead,
                         sample.cached_tokens, now)
        predicted = lease.predicted_tokens or None
        outcome = classify(predicted, sample.cached_tokens, sample.prompt_tokens,
                           chain.total_bytes // BYTES_PER_TOKEN)
        lease.prefix = outcome
        self.outcomes[outcome] += 1
        if predicted is not None and lease.source is not None:
            self.predictions[(lease.source, outcome)] += 1
        if outcome == "wrong_prediction":
            self.index.correct(chain, t.id)
            self._push(chain, t, now, True)
        else:
            self.index.record(chain, t.id, t.gen, now)
            self._push(chain, t, now, False)

    def _push(self, chain: Chain, t: Target, now: float, remove: bool) -> None:
        """Hand a record or correction to the peers (hashes and a target key: no text)."""
        if self.on_prefix is not None:
            self.on_prefix(PrefixOp(t.key, chain.keys, now, remove))

    # --- gauges for peers (spec §8, §12) --------------------------------------------------

    def export_gauges(self) -> dict[str, dict[str, int]]:
        """This process's own gauges, absolute: in-flight requests per target key, waiters
        per model."""
        return {"inflight": {t.key: t.inflight for t in self.state.targets if t.inflight > 0},
                "waiting": dict(self._waiting_models)}

    def merge_gauges(self, origin: str, gauges: Mapping[str, object], now: float) -> None:
        """A peer's report replaces its previous one; raises ``GaugeError`` (and keeps the
        previous report) when it is malformed. Targets this process has not seen yet are
        kept by key and count once they appear. A freed slot re-runs the queue."""
        inflight = _gauge_counts(gauges.get("inflight"), "inflight")
        waiting = _gauge_counts(gauges.get("waiting"), "waiting")
        self.peers[origin] = PeerGauges(now, inflight, waiting)
        self._peer_until = -math.inf
        self.kick()

    def forget(self, origin: str) -> None:
        """Drop a peer's gauges at once (it said it is leaving)."""
        if self.peers.pop(origin, None) is not None:
            self._peer_until = -math.inf
            self.kick()

    def peer_inflight(self, target_id: int) -> int:
        """Live peers' in-flight requests on a target."""
        self._refresh_peers()
        return self._peer_inflight.get(target_id, 0)

    def peer_waiting(self, model: str) -> int:
        """Live peers' waiters for a model."""
        self._refresh_peers()
        return self._peer_waiting.get(model, 0)

    def target_id(self, key: str) -> int | None:
        """The id of the target a peer names by key; None for one not seen here yet."""
        targets = self.state.targets
        if len(self._key_ids) != len(targets):
            self._key_ids = {t.key: t.id for t in targets}
        return self._key_ids.get(key)

    def merge_prefix(self, ops: list[PrefixOp], now: float, *, roots: bool = True) -> int:
        """Apply a peer's prefix ops as local records and corrections (``PrefixIndex.merge``);
        returns how many were dropped (targets not known here). A record also notes its root
        as sent to its target in ``roots`` (when the root's size is known here): each
        engine's cache takes every instance's prompts, and retention learned, stale
        predictions and eviction pricing counted only this instance's (W1 behind three
        peers: hit rate 0.66 against 0.88 for one instance, half the misses predicted held by
        an engine that had pushed them out). ``roots=False``: the peer tells its sends at
        dispatch (``merge_dispatched``), so its records are not sends again."""
        dropped = self.index.merge(ops, self.target_id, self._gen, now, source="peer")
        if not roots:
            return dropped
        for op in ops:
            if op.remove or not op.hashes:
                continue
            tid = self.target_id(op.target_key)
            gen = self._gen(tid) if tid is not None else None
            tokens = self.roots.tokens_of(op.hashes[0])
            if tid is None or gen is None or tokens is None:
                continue
            self._roots_gen(tid, gen, now)
            self.roots.sent(tid, op.hashes[0], tokens, now)
        return dropped

    def merge_dispatched(self, ops: list[PrefixOp], now: float) -> int:
        """A peer's dispatches, told when it sent them (before any byte came back): each root
        is sent to its target in ``roots`` (in the order the engines took them, not a first
        byte later), counts in the root's demand (``hot``), and on an engine whose cache
        serves every request once the prompt is scheduled (``SHARED_CACHE_KINDS``) is
        recorded in the index as a peer slot, so two instances do not put one new root into
        two caches. The peer's first-byte and release records confirm it; its correction or
        error removal (and a wrong prediction here) drops it. Returns how many were dropped
        (targets or generations not known here)."""
        dropped = 0
        record: list[PrefixOp] = []
        for op in ops:
            tid = self.target_id(op.target_key) if op.hashes else None
            gen = self._gen(tid) if tid is not None else None
            if tid is None or gen is None:
                dropped += 1
                continue
            t = self.state.targets[tid]
            root = op.hashes[0]
            tokens = op.root_tokens if op.root_tokens is not None else self.roots.tokens_of(root)
            if tokens is not None:
                self._roots_gen(tid, gen, now)
                self.roots.sent(tid, root, tokens, now)
            if self.guards.hot_prefix_utilization is not None:
                service = t.stats.service_sec.value or self.policy.service_sec_default
                self.hot.add(root, service, now)
            if t.backend.kind in SHARED_CACHE_KINDS:
                record.append(PrefixOp(op.target_key, op.hashes, op.last_used))
        if record:
            dropped += self.index.merge(record, self.target_id, self._gen, now, source="peer")
        return dropped

    def _roots_gen(self, tid: int, gen: int, now: float) -> None:
        """A new engine process (another generation): its cache started empty. The first
        generation seen is taken as the one ``roots`` describes (restored from a snapshot,
        spec §12, as the prefix index's restored slots are)."""
        seen = self._root_gens.get(tid)
        if seen != gen:
            if seen is not None:
                self.roots.forget(tid, now)
            self._root_gens[tid] = gen

    def _refresh_peers(self) -> None:
        """Re-sum the live peers' gauges when one went stale, a report arrived, a target
        appeared, or the clock went back; a peer silent ``PEER_SILENCE_SEC`` is dropped."""
        now = self.state.clock.seconds()
        if (self._peer_since <= now < self._peer_until
                and len(self._key_ids) == len(self.state.targets)):
            return
        inflight: dict[int, int] = {}
        waiting: dict[str, int] = {}
        until = math.inf
        for origin, g in list(self.peers.items()):
            if g.heard_at > now:
                g.heard_at = now  # the clock went back: silence counts from now
            if now - g.heard_at >= PEER_SILENCE_SEC:
                del self.peers[origin]
                continue
            until = min(until, g.heard_at + PEER_SILENCE_SEC)
            for key, n in g.inflight.items():
                tid = self.target_id(key)
                if tid is not None:
                    inflight[tid] = inflight.get(tid, 0) + n
            for model, n in g.waiting.items():
                waiting[model] = waiting.get(model, 0) + n
        self.target_id("")  # the key map as of now: a new target re-sums
        self._peer_inflight, self._peer_waiting = inflight, waiting
        self._peer_until, self._peer_since = until, now

    def _fail_later(self, w: _Waiter, e: Exception) -> None:
        """A waiter whose model no up backend serves any more fails instead of waiting."""
        self._leave(w)
        w.d.errback(e)

    def decide(self, req: SchedRequest, targets: list[Target], waited: float = 0.0
               ) -> Placement:
        """The policy's decision over the candidates as they are now (no state changes);
        ``waited``: how long the request has queued (placement's wait bound)."""
        queued = self._waiting_models.get(req.model, 0)
        if self.peers:
            self._refresh_peers()
            queued += self._peer_waiting.get(req.model, 0)
        matches = self.index.lookup(req.chain, self._gen) if req.chain else {}
        stale = self._evicted_since(req, matches) if matches else ()
        root_bytes = req.chain.ends[0] if req.chain else 0
        held: list[int] = []  # the candidates the index predicts hold the root
        state = self.state
        now = state.clock.seconds()
        peer_inflight = self._peer_inflight if self.peers else None
        fkey = (None if req.exclude or len(targets) < FLEET_MIN_TARGETS
                else (req.model, req.kind))
        fleet = self._fleets.get(fkey) if fkey is not None else None
        if (fleet is not None and not self.host_model and not self.host_evicted
                and fleet.queued == queued and fleet.peers is peer_inflight
                and fleet.lo <= now < fleet.hi and fleet.targets == targets):
            cands = self._from_fleet(fleet, now, queued, peer_inflight)
            cold, has_cold = dict(fleet.cold), fleet.colds > 0
            if matches:
                kept_matched, pos = self._matched, fleet.pos
                for i in sorted(pos[tid] for tid in matches if tid in pos):
                    c = cands[i]
                    tid = c.target_id
                    m = matches[tid]
                    root = m.matched_bytes >= root_bytes
                    if root:
                        held.append(tid)
                    if tid not in stale and (matched := m.matched_bytes // BYTES_PER_TOKEN):
                        t = targets[i]
                        km = kept_matched.get(t)
                        if km is not None and km[0] is c and km[1] == matched and km[2] == root:
                            cands[i] = km[3]
                        else:
                            cands[i] = with_match(c, matched, root)
                            kept_matched[t] = (c, matched, root, cands[i])
        else:
            cands, cold, has_cold = self._full_loop(
                targets, queued, now, peer_inflight, matches, stale, root_bytes, held, fkey)
        owners = self._hot_owners(req, cands, held)
        if owners:
            root_tokens = req.chain.ends[0] // BYTES_PER_TOKEN
            cands = [dataclasses.replace(c, matched_tokens=root_tokens)
                     if c.target_id in owners else c for c in cands]
        if req.chain and self.guards.eviction_pricing and len(cands) > 1:
            evict = self._evictions(req, cands, matches, owners)
            if evict:
                cands = [dataclasses.replace(c, evict_tokens=evict[c.target_id])
                         if c.target_id in evict else c for c in cands]
        if has_cold:
            name = (req.policy or self.policy).name == "cost"  # the baselines: the host's
            cands = [self._priced(c, now, name) if cold[c.target_id] else c for c in cands]
        if self.policy.name == "cost" and (has_cold or self._model_waiters):
            cands = self._holds(req, cands, cold, now, waited)
        affinity = None
        if req.session is not None and self.policy.session_affinity:
            affinity = self.sessions.get(req.session)
        route = RouteReq(req.prompt_tokens, req.seed, affinity, self.turns.get(req.model, 0),
                         req.chain.keys[0] if req.chain else None)
        decision = pick(route, cands, req.policy or self.policy)
        return Placement(decision, tuple(cands), cold, matches, owners, affinity, route)

    def _full_loop(self, targets: list[Target], queued: int, now: float,
                   peer_inflight: dict[int, int] | None, matches: dict[int, Match],
                   stale: Container[int], root_bytes: int, held: list[int],
                   fkey: tuple[str, str | None] | None
                   ) -> tuple[list[Candidate], dict[int, bool], bool]:
        """Every target's candidate, priced with its match (``held``: the targets the index
        predicts hold the root), kept as ``fkey``'s fleet unless a host may have swapped a
        model out (``_Fleet``). ``candidate`` inlined, and ``State.view_at``'s check of a kept
        view: the clock and the peers' sums read once, not per target."""
        cands: list[Candidate] = []
        add = cands.append
        cold: dict[int, bool] = {}
        has_cold = False
        view_at = self.state.view_at
        kept, kept_matched, host_model = self._cands, self._matched, self.host_model
        host_evicted = self.host_evicted
        capture = fkey is not None and not host_model and not host_evicted
        stamp = new_stamp() if capture else 0
        recheck: set[int] = set()
        lo, hi = -math.inf, math.inf
        unmatched: list[Candidate] = []
        for i, t in enumerate(targets):
            tid = t.id
            b = t.backend
            inflight = (t.inflight if peer_inflight is None
                        else t.inflight + peer_inflight.get(tid, 0))
            e = kept.get(t)
            # The kept candidate holds the kept view it was built from (``State.view_at``'s
            # entry): while that view is current (the same test as ``view_at``'s), so is it.
            if (e is not None and (ve := e[0])[0] == t.view_stamp and ve[1] is b
                    and ve[2] == b.stamp and ve[3] <= now < ve[4]
                    and (not ve[5] or ve[6] == b.replied_at) and e[1] == t.stamp
                    and e[2] == inflight and e[3] == queued):
                c, v = e[4], ve[7]
            else:
                v = view_at(t, now)
                if (e is not None and e[0][7] is v and e[1] == t.stamp and e[2] == inflight
                        and e[3] == queued):
                    c = e[4]
                else:
                    c = self._keep(t, v, queued, inflight)
                if capture:
                    e = kept.get(t)
                    if e is None or e[4] is not c:
                        e = None
                        recheck.add(i)  # not kept (a cold model): built every time
            if capture:
                if e is not None:
                    ve = e[0]
                    lo, hi = max(lo, ve[3]), min(hi, ve[4])
                    if ve[5]:
                        recheck.add(i)  # its view read ``replied_at``, which takes no stamp
                unmatched.append(c)
            if (host_model and c.warm is not False and not inflight
                    and (hm := host_model.get(b.url)) is not None
                    and hm[0] != t.model and self._swapped_out(t, v, hm)):
                c = self._as_cold(t, v, c)
            elif (host_evicted and c.warm is not False and not inflight
                    and (he := host_evicted.get(b.url)) is not None and t.model in he[0]
                    and (b.full_at is None or b.full_at <= he[1])):
                c = self._as_cold(t, v, c)  # priced as pushed out by a load since the round
            if matches and (m := matches.get(tid)) is not None:
                root = m.matched_bytes >= root_bytes
                if root:
                    held.append(tid)
                if tid not in stale and (matched := m.matched_bytes // BYTES_PER_TOKEN):
                    # The copy with this match is kept too, while its base is the same.
                    km = kept_matched.get(t)
                    if km is not None and km[0] is c and km[1] == matched and km[2] == root:
                        c = km[3]
                    else:
                        base, c = c, with_match(c, matched, root)
                        kept_matched[t] = (base, matched, root, c)
            if c.warm is False and not c.loading:
                cold[tid] = has_cold = True
            else:
                cold[tid] = False
            add(c)
        if capture:
            assert fkey is not None
            self._fleets[fkey] = _Fleet(
                list(targets), unmatched, dict(cold), sum(cold.values()), recheck, stamp,
                queued, peer_inflight, lo, hi, {t.id: i for i, t in enumerate(targets)})
        elif fkey is not None:
            self._fleets.pop(fkey, None)
        return cands, cold, has_cold

    def _from_fleet(self, fleet: _Fleet, now: float, queued: int,
                    peer_inflight: dict[int, int] | None) -> list[Candidate]:
        """The kept fleet's candidates without a match as of now: the targets written since
        it was kept (their stamps) and those it rechecks are rebuilt, and kept in it."""
        last, targets = fleet.stamp, fleet.targets
        dirty = [i for i, t in enumerate(targets)
                 if t.stamp > last or t.backend.stamp > last]
        if dirty or fleet.recheck:
            fleet.stamp = new_stamp()
            kept, base, cold, recheck = self._cands, fleet.base, fleet.cold, fleet.recheck
            for i in {*dirty, *recheck}:
                t = targets[i]
                inflight = (t.inflight if peer_inflight is None
                            else t.inflight + peer_inflight.get(t.id, 0))
                v = self.state.view_at(t, now)
                e = kept.get(t)
                if (e is not None and e[0][7] is v and e[1] == t.stamp and e[2] == inflight
                        and e[3] == queued):
                    c = e[4]
                else:
                    c = self._keep(t, v, queued, inflight)
                    e = kept.get(t)
                if e is not None and e[4] is c:
                    ve = e[0]
                    fleet.lo, fleet.hi = max(fleet.lo, ve[3]), min(fleet.hi, ve[4])
                    if ve[5]:
                        recheck.add(i)
                    else:
                        recheck.discard(i)
                else:
                    recheck.add(i)
                is_cold = c.warm is False and not c.loading
                fleet.colds += is_cold - cold[t.id]
                cold[t.id] = is_cold
                base[i] = c
        return list(fleet.base)

    def failed_load(self, t: Target) -> None:
        """A cold dispatch to ``t`` failed: its host is not asked to load the model again
        until its next full round (``_holds``), and its last model is no longer taken as
        this one."""
        self.load_failed[t.id] = t.backend.full_round
        hm = self.host_model.get(t.backend.url)
        if hm is not None and hm[0] == t.model:
            del self.host_model[t.backend.url]

    def median_size(self) -> int | None:
        """The median size of the models the fleet reports one for (None: none does): what
        a model of unknown size is taken to weigh when it loads."""
        sizes = sorted({t.model: s for t in self.state.targets
                        if (s := self.state.view(t).size_bytes)}.values())
        return sizes[len(sizes) // 2] if sizes else None

    def _swapped_out(self, t: Target, v: View, host: tuple[str, float, float]) -> bool:
        """A later dispatch of another model to ``t``'s host (``host_model``), not yet seen
        by a round, pushed ``t``'s model out: the host holds one model at a time (llama-swap)
        or the two do not fit in its memory together."""
        model, at, _ = host
        b = t.backend
        if b.full_at is not None and b.full_at > at:
            return False  # a round since has said what is loaded
        if max_loaded(b) == 1:
            return True
        memory_gb = b.spec.memory_gb
        if memory_gb is None or v.size_bytes is None:
            return False
        other = next((o for o in self.state.targets_for(model) if o.backend is b), None)
        size = self.state.view(other).size_bytes if other is not None else None
        return size is not None and size + v.size_bytes > memory_gb * 1e9

    def _as_cold(self, t: Target, v: View, c: Candidate) -> Candidate:
        """``c`` as a cold candidate: its model was pushed out since the last round."""
        size = v.size_bytes if v.size_bytes is not None else self.median_size()
        load_sec, basis = self._load_estimate(t, size)
        return dataclasses.replace(
            c, warm=False, loading=False, fits_if_cold=self._fits_if_cold(t, size),
            load_sec=load_sec, load_basis=basis)

    def _holds(self, req: SchedRequest, cands: list[Candidate], cold: dict[int, bool],
               now: float, waited: float) -> list[Candidate]:
        """Placement's holds (issue 15; ``Candidate.held`` sets the candidate aside with the
        reason): a host whose load failed is not tried again until its next full round; a
        host draining for a model that has waited past the bound takes no other model; a
        copy of a model warm elsewhere waits for a warm slot while that is cheaper for the
        fleet (``placement.replica_hold``); and a swap waits while the model it pushes out
        has requests queued (``placement.swap_hold``)."""
        rule, targets = self.guards.placement, self.state.targets
        drains = self._drains(now) if self._model_waiters else {}
        if not drains and not any(cold.values()):
            return cands  # nothing to load and no host draining: no hold applies
        out: list[Candidate] = []
        for c in cands:
            t = targets[c.target_id]
            note = None
            if cold[c.target_id] and self.load_failed.get(t.id) == t.backend.full_round:
                note = "load failed here this round (tried again after the next round)"
            elif ((d := drains.get(t.backend.url)) is not None and d[0] != req.model
                  and not self._in_batch(t.backend.url, req.model, now - waited)):
                note = drain_hold(rule, *d)
            out.append(dataclasses.replace(c, held=note) if note else c)
        warm = [c for c in out if not cold[c.target_id] and c.held is None]
        loads = [c for c in out if cold[c.target_id] and c.held is None
                 and c.fits_if_cold is not False]
        if not loads:
            return out
        note = None
        held: dict[int, str] = {}
        if warm:
            demand = self.slot_demand.rate(req.model, now)
            slots = sum(c.capacity for c in warm)
            needed = replica_needed(rule, demand, slots)
            if needed is not None:
                # A queue for the warm hosts would only grow: a request finding them full
                # loads a copy (wherever the cost says, eviction priced).
                held = {c.target_id: needed for c in warm if c.free_slots <= 0}
            else:
                service = self.policy.service_sec_default
                warm_wait = min(c.queued_prefill_sec + (
                    0.0 if c.free_slots > 0 else
                    (c.queue_ahead + 1) / c.capacity * (c.service_sec or service))
                    for c in warm)
                load_cost = min((c.load_sec or self.policy.load_sec_default) + c.reload_sec
                                for c in loads)
                note = replica_hold(rule, demand, slots, warm_wait, load_cost, waited)
        for c in loads:
            if note is not None:
                held[c.target_id] = note
                continue
            url = targets[c.target_id].backend.url
            for victim in c.victims:
                n = self._waiting_models.get(victim, 0) + (
                    self.peer_waiting(victim) if self.peers else 0)
                waiters = self._model_waiters.get(victim)
                batch = bool(waiters) and self._in_batch(
                    url, victim, next(iter(waiters.values())) if waiters else now)
                swap = swap_hold(rule, victim, n, waited, batch)
                if swap is not None:
                    held[c.target_id] = swap
                    break
        if not held:
            return out
        return [dataclasses.replace(c, held=held[c.target_id]) if c.target_id in held else c
                for c in out]

    def _in_batch(self, url: str, model: str, queued_at: float) -> bool:
        """A request for ``model`` that queued at ``queued_at`` is in the batch of the host's
        loaded model: it is that model, and the request queued before the host swapped to it.
        Past the wait bound, a model that drained a host keeps it for its batch (then the
        longest waiting model gets it), so swaps stay grouped under overload while every
        request's wait stays bounded (by the bound and the batches ahead of it)."""
        hm = self.host_model.get(url)
        return hm is not None and hm[0] == model and queued_at <= hm[2]

    def _drains(self, now: float) -> dict[str, tuple[str, float]]:
        """Hosts draining for a swap: per model whose oldest waiter has
        waited past the bound with no host it can load on now (and is its key's head, or
        within reach of swap grouping's passing), the host it gets (the one
        with the fewest requests in flight, then the lowest target id), with that model and
        the wait; the longest waiting first. A request for another model is held off that
        host until the load goes."""
        rule = self.guards.placement
        bound = rule.wait_bound_sec
        reach = PASS_LIMIT if rule.swap_grouping else 0
        out: dict[str, tuple[str, float]] = {}
        starving = []
        for other, waiters in self._model_waiters.items():
            oldest, since = next(iter(waiters.items()))
            if now - since >= bound:
                starving.append((since, other, oldest))
        for since, other, oldest in sorted(starving, key=lambda x: x[0]):
            waited = now - since
            ahead = self.queue.position(oldest)
            if ahead is None or ahead > reach:
                continue  # behind its own key's head: not placeable, so nothing to drain for
            best: tuple[int, int, str] | None = None
            for t in self.state.targets_for(other):
                v = self.state.view_at(t, now)
                hm = self.host_model.get(t.backend.url)
                if t.inflight or (v.residency in (Residency.LOADED, Residency.LOADING) and not (
                        hm is not None and hm[0] != t.model and self._swapped_out(t, v, hm))):
                    best = None
                    break  # warm somewhere: it waits for a slot, not for a swap
                busy = sum(o.inflight for o in self.state.targets if o.backend is t.backend)
                if best is None or (busy, t.id) < best[:2]:
                    best = (busy, t.id, t.backend.url)
            if best is not None and best[2] not in out:
                out[best[2]] = (other, waited)
        return out

    def learn_load(self, t: Target, load_sec: float | None) -> None:
        """A measured load (``load_sample``) teaches the host's bytes per second."""
        if load_sec is not None:
            self.load_rates.learn(t.backend.url, self.state.view(t).size_bytes, load_sec)

    def _load_estimate(self, t: Target, size: int | None) -> tuple[float | None, str | None]:
        """The target's load seconds: learned, else from its model's size at its host's
        learned rate (then the fleet's, then the default: ``LoadRates``), with the
        estimate's basis; (None, None) when neither is known."""
        learned = t.stats.load_sec.value
        if learned is not None:
            return learned, None
        est = self.load_rates.estimate(t.backend.url, size)
        if est is None:
            return None, None
        return est[0], f"load_sec=size/{est[1]}"

    def _priced(self, c: Candidate, now: float, name: bool = True) -> Candidate:
        """A cold candidate with its eviction price: the idle models its load would push out
        of the host's memory (``placement.victims``: none when it fits beside them; unknown
        without a size or ``memory_gb``, then nothing is priced) and the reloads their recent
        demand makes likely within the keep-alive horizon (``placement.reload_price``,
        ``placement.horizon``). Models an earlier load there was priced as pushing out since
        the host's last full round (``host_evicted``) are not counted: the round still lists
        them, and counting them priced a second victim that was gone (``pharos bench
        placement``, 2 hosts: 54 of 306 loads Pharos saw evicted other models than priced)."""
        if c.fits_if_cold is False:
            return c  # set aside: the load waits for a model to go idle
        t = self.state.targets[c.target_id]
        memory_gb = t.backend.spec.memory_gb
        size = self.state.view_at(t, now).size_bytes
        if size is None:
            size = self.median_size()
        limit = max_loaded(t.backend)
        if limit is None and (memory_gb is None or size is None):
            return c
        hm = self.host_model.get(t.backend.url)
        he = self.host_evicted.get(t.backend.url)
        gone = (he[0] if he is not None and (t.backend.full_at is None
                                             or t.backend.full_at <= he[1]) else frozenset())
        resident: list[Resident] = []
        by_model: dict[str, Target] = {}
        for o in self.state.targets:
            if o.backend is not t.backend or o is t:
                continue
            ov = self.state.view_at(o, now)
            inflight = o.inflight + (self.peer_inflight(o.id) if self.peers else 0)
            if ov.residency not in (Residency.LOADED, Residency.LOADING) and not inflight:
                continue
            if not inflight and o.model in gone:
                continue  # pushed out by a load since the round that lists it: not there
            by_model[o.model] = o
            resident.append(Resident(
                o.model, ov.vram_bytes or ov.size_bytes or 0,
                idle=not inflight and ov.residency is Residency.LOADED,
                last_used=(o.last_release_at if o.last_release_at is not None
                           else -math.inf)))
        if hm is not None and hm[0] != t.model and hm[0] not in by_model and (
                t.backend.full_at is None or t.backend.full_at <= hm[1]):
            # Dispatched there since the last round: loaded, whatever the round said.
            h = next((o for o in self.state.targets_for(hm[0]) if o.backend is t.backend), None)
            if h is not None:
                hv = self.state.view_at(h, now)
                by_model[h.model] = h
                resident.append(Resident(h.model, hv.vram_bytes or hv.size_bytes or 0,
                                         idle=not h.inflight, last_used=hm[1]))
        reach = horizon(self.keep_alive_sec)
        fallback = self.policy.load_sec_default

        def price_of(r: Resident) -> float:
            o = by_model[r.model]
            load = self._load_estimate(o, self.state.view_at(o, now).size_bytes)[0]
            return reload_price(self.demand.rate(r.model, now),
                                load if load is not None else fallback, reach)

        named = name and names_victims(t.backend)
        if named:
            resident = [dataclasses.replace(r, price=price_of(r)) if r.idle else r
                        for r in resident]
        out: list[Resident] | None = []
        rest = resident
        if limit is not None and (over := len(resident) - limit + 1) > 0:
            # At its limit of loaded models: idle ones go (the cheapest when Pharos names
            # them, else the least recently used).
            idle = sorted((r for r in resident if r.idle),
                          key=(lambda r: (r.price, r.last_used)) if named
                          else (lambda r: r.last_used))
            out = idle[:over] if len(idle) >= over else None
            rest = [r for r in resident if out is None or r not in out]
        if out is not None and memory_gb is not None and size is not None:
            more = victims(size, memory_gb * 1e9, rest, named)
            out = None if more is None else out + more
        if not out:
            return c
        price = sum(r.price if named else price_of(r) for r in out)
        return dataclasses.replace(c, reload_sec=price, victims=tuple(r.model for r in out))

    def _evicted_since(self, req: SchedRequest, matches: dict[int, Match]) -> set[int]:
        """The targets the index predicts hold the request's root but whose learned retention
        says they have pushed it out since (more root tokens went there after it than the
        cache keeps): the index learns of an eviction only from the next reply, and a stale
        prediction on two holders tied and lost to the one that had evicted it."""
        if not self.guards.eviction_pricing or not self.roots.retained:
            return set()  # off, or no target's retention known: ``pushed_out`` is False
        root, root_bytes, roots = req.chain.keys[0], req.chain.ends[0], self.roots
        return {tid for tid, m in matches.items()
                if m.matched_bytes >= root_bytes and roots.pushed_out(tid, root)}

    def _evictions(self, req: SchedRequest, cands: list[Candidate],
                   matches: dict[int, Match], owners: frozenset[int]) -> dict[int, int]:
        """Per candidate that does not hold the request's root, the tokens of the live roots
        it would push out of its cache that no other candidate holds (``pharos.retention``):
        the prefill a later request pays for them. A hot root's extra owners are meant to
        take it in, and are not priced."""
        chain, roots = req.chain, self.roots
        retained = roots.retained
        out: dict[int, int] = {}
        if not retained:
            return out  # no target's retention is known: ``evicts`` says nothing of any
        root, root_bytes = chain.keys[0], chain.ends[0]
        now = self.state.clock.seconds()
        ids = [c.target_id for c in cands]
        for tid in ids:
            if tid not in retained:
                continue  # its retention is unknown: ``evicts`` says nothing
            m = matches.get(tid)
            if tid in owners or (m is not None and m.matched_bytes >= root_bytes):
                continue
            pushed = roots.evicts(tid, root, root_bytes // BYTES_PER_TOKEN)
            if not pushed:
                continue
            tokens = sum(n for r, n in pushed if roots.live(r, now)
                         and roots.holders(r, (o for o in ids if o != tid)) == 0)
            if tokens:
                out[tid] = tokens
        return out

    def _gen(self, target_id: int) -> int | None:
        targets = self.state.targets
        return targets[target_id].gen if 0 <= target_id < len(targets) else None

    def _hot_owners(self, req: SchedRequest, cands: list[Candidate],
                    held: list[int]) -> frozenset[int]:
        """The targets to price as holding the request's root prefix although they do not:
        when the root's demand needs ``k`` owners and fewer hold it (``held``: the candidates
        the index predicts hold it), the next ones in a rendezvous order of (root, target),
        so the extra owners are the same every time and their caches become real."""
        utilization = self.guards.hot_prefix_utilization
        chain = req.chain
        if utilization is None or not chain or len(cands) < 2:
            return frozenset()
        root_bytes = chain.ends[0]
        if root_bytes // BYTES_PER_TOKEN < HOT_MIN_TOKENS:
            return frozenset()
        if not held:
            return frozenset()
        root = chain.keys[0]
        slots = sum([c.capacity for c in cands]) / len(cands)
        k = self.hot.owners(root, self.state.clock.seconds(), slots, utilization)
        if k <= len(held):
            return frozenset()
        holders = set(held)
        others = sorted((c.target_id for c in cands if c.target_id not in holders),
                        key=lambda tid: rank(root, tid))
        return frozenset(others[: k - len(holders)])

    def capacity_of(self, t: Target) -> tuple[int | None, str]:
        """The target's capacity and its source: the engine's own, else config, else learned,
        else None (the saturation fallback applies)."""
        v = self.state.view(t)
        if v.capacity:
            return v.capacity, CAPACITY_ENGINE
        if t.backend.spec.capacity:
            return t.backend.spec.capacity, CAPACITY_CONFIG
        if t.learned_capacity is not None:
            return t.learned_capacity, CAPACITY_LEARNED
        return None, CAPACITY_DEFAULT

    def learn_capacity(self, backend: BackendState) -> None:
        """After a scrape round: learn the capacity of the backend's targets that report none
        (vLLM exports no max-num-seqs). A count seen running at once is never unlearned;
        when a request came while the target had no free slot (since the last round) and the
        engine reports no queue, one more slot is tried; when the engine queues (two rounds in a
        row), its Running is the capacity (but never below what it was seen running), and no
        more slots are tried (it still rises to a higher count seen running) until
        ``REPROBE_ROUNDS`` rounds in a row find the target full and the engine without a
        queue. A queue while the engine's KV pool is (nearly) full is a wait for blocks,
        which sets nothing."""
        for t in self.state.targets:
            if t.backend is not backend:
                continue
            v = self.state.view(t)
            # This round's counts hold as evidence even when a reply ended since (the view's
            # load_fresh): a queue seen at the scrape was a queue.
            running, queued = v.running, v.waiting
            # Counted for every target: one whose engine queues is full whatever its capacity
            # says (``candidate``).
            t.queue_rounds = t.queue_rounds + 1 if queued is not None and queued > 0 else 0
            pressed, t.pressed = t.pressed, False
            # The engine's usage counts the prompts sent since the last round from this round
            # on, but those still without a first byte only in part (queued in the engine:
            # none of it; being prefilled in chunks: the chunks so far): they stay counted
            # until their first byte. Counting none of them priced a prompt as fitting a pool
            # a chunked prefill was still filling (w6 at 3 req/s, issue 10 item 4).
            t.kv_sent_tokens = t.kv_unstarted_tokens
            t.kv_freed_tokens = 0
            t.kv_round += 1
            if (not t.kv_counts_cache and running == 0 and queued == 0 and t.inflight == 0
                    and v.kv_usage is not None and v.kv_usage > KV_AT_REST_CACHE):
                t.kv_counts_cache = True
            if t.capacity_seen_queue:
                t.quiet_rounds = t.quiet_rounds + 1 if pressed and queued == 0 else 0
                if t.quiet_rounds >= REPROBE_ROUNDS:
                    t.capacity_seen_queue, t.quiet_rounds = False, 0
            if v.capacity or t.backend.spec.capacity:
                continue
            if (t.backend.failing is not None or running is None
                    or not 0 <= running <= MAX_PLAUSIBLE_CAPACITY):
                # The engine's counts are unknown this round: nothing forgotten. A busy vLLM
                # on 2 cores answered /metrics past the deadline for a minute and nothing was
                # learned (the live capacity test). Pharos's own counts are evidence then:
                # every request of its in flight there has its first byte, so the engine runs
                # them all and queues none; while its replies flow, try one more as the
                # engine's "no queue" would.
                if (pressed and not t.capacity_seen_queue and t.inflight > 0
                        and t.unstarted == 0
                        and self.state.replying(t.backend, self.state.clock.seconds())):
                    base = (t.learned_capacity if t.learned_capacity is not None
                            else self.default_capacity)
                    t.capacity_seen_max = max(t.capacity_seen_max, t.inflight)
                    if t.inflight >= base:
                        t.learned_capacity = base + 1
                continue
            current = t.learned_capacity
            base = current if current is not None else self.default_capacity
            t.capacity_seen_max = seen = max(t.capacity_seen_max, running)
            if t.queue_rounds >= QUEUE_ROUNDS and (v.kv_usage is None
                                                   or v.kv_usage < KV_BOUND_USAGE):
                # The engine queues (two rounds running: a request waiting for the next engine
                # step is not a queue) with blocks to spare: it runs all it can.
                learned = max(seen, 1)
                t.capacity_seen_queue = True
            elif t.queue_rounds >= QUEUE_ROUNDS:
                # A queue behind a KV pool its running requests hold (nearly) all of says
                # nothing of the sequence cap: vLLM admits no request its free blocks cannot
                # hold, so a 64-sequence engine with a small pool queues at 4 long prompts and
                # runs 20 short ones. ``candidate`` takes it as full while the queue lasts.
                if seen <= base:
                    continue
                learned = seen
            elif not t.capacity_seen_queue and queued == 0 and pressed:
                # A request came while Pharos saw no free slot here since the last round (it
                # waited, or went elsewhere), and the engine has no queue of its own: try one
                # more. A target left full at 2 slots while others took the load never learned.
                # Read at the round alone (waiters then),
                # this missed most of the bursts of short requests (0.5 s each, rounds of 1 s:
                # a small-pool fleet at 20 req/s stayed at 5 slots, Pharos queueing its bursts,
                # p99 TTFT 175-240 ms against 69 ms when told 64). Pharos's leases on replies
                # the engine has finished (a slow client) fill slots too: the engine has room
                # then, so one more is right. Once the engine has queued, its Running then is
                # the capacity and no slot is tried past it (each try would park a request in
                # the engine's queue until two rounds in a row see it).
                learned = base + 1
            elif seen > base:
                learned = seen  # it ran more than that at once (clients bypassing Pharos)
            else:
                continue
            t.learned_capacity = learned

    def candidate(self, t: Target, queued: int, matched_tokens: int = 0) -> Candidate:
        """One target as the policy sees it: occupancy = max(our in-flight, the engine's fresh
        Running); capacity from the engine, else config, else learned, else the saturation
        fallback. An engine that has queued for ``QUEUE_ROUNDS`` rounds and still reports a
        queue is full at what it runs, whatever its capacity says: vLLM admits no request its
        KV pool cannot hold, so a 64-sequence engine with a small pool queues at 4, and a
        request sent there waits for one of those 4 to end.

        The candidate without a match is kept per target and served again while its view is
        the same object (``State.view`` keeps one while current), the target has had no
        write it reads (``Target.stamp``) and the in-flight count with peers' and the waiters
        ahead are as they were; a match makes a copy with it (``with_match``). A target
        whose model is cold is built each time (whether it fits reads the other targets)."""
        v = self.state.view(t)
        # Occupancy counts everyone (spec §8): ours, live peers', or the engine's own count.
        inflight = t.inflight + self.peer_inflight(t.id) if self.peers else t.inflight
        e = self._cands.get(t)
        if (e is not None and e[0][7] is v and e[1] == t.stamp and e[2] == inflight
                and e[3] == queued):
            c = e[4]
        else:
            c = self._keep(t, v, queued, inflight)
        return with_match(c, matched_tokens) if matched_tokens else c

    def _keep(self, t: Target, v: View, queued: int, inflight: int) -> Candidate:
        """A new unmatched candidate, kept unless the target's model is cold."""
        c = self._build(t, v, queued, inflight)
        if c.warm is not False and (ve := self.state.kept_view(t)) is not None and ve[7] is v:
            self._cands[t] = (ve, t.stamp, inflight, queued, c)
        return c

    def _build(self, t: Target, v: View, queued: int, inflight: int) -> Candidate:
        """``candidate`` without a match, from the target's view as of now."""
        engine_running = v.running if v.load_fresh else None
        if engine_running is not None and engine_running > MAX_PLAUSIBLE_CAPACITY:
            engine_running = None  # no engine runs that many: unknown this round, not "full"
        engine_waiting = v.waiting if v.load_fresh else None
        occupied = max(inflight, engine_running or 0)
        capacity = v.capacity or t.backend.spec.capacity or t.learned_capacity
        # Pharos's own estimate, never seen queued at, the engine without a queue at its last
        # round (``Candidate.capacity_open``).
        capacity_open = (not v.capacity and not t.backend.spec.capacity
                         and not t.capacity_seen_queue and v.waiting is not None
                         and not engine_waiting)
        if capacity is None:
            capacity = self.default_capacity
            saturated = (engine_waiting or 0) > 0 or inflight >= capacity
            free = 0 if saturated else capacity - occupied
        else:
            free = capacity - occupied
            if (engine_waiting or 0) > 0 and t.queue_rounds >= QUEUE_ROUNDS and engine_running:
                capacity, free = min(capacity, engine_running), 0
        warm = _WARM.get(v.residency)
        loading = v.residency is Residency.LOADING or (
            v.residency is Residency.COLD and t.inflight > 0)
        load_sec, load_basis = t.stats.load_sec.value, None
        size = v.size_bytes
        if warm is False and size is None:
            size = self.median_size()  # unknown: the load still counts, at the fleet median
        if load_sec is None and warm is False:  # a cold candidate is never kept: always fresh
            load_sec, load_basis = self._load_estimate(t, size)
            if load_basis is not None and v.size_bytes is None:
                load_basis += " (size=fleet median)"
        return Candidate(
            target_id=t.id,
            warm=warm,
            capacity=capacity,
            free_slots=free,
            queue_ahead=queued + (engine_waiting or 0),
            kv_usage=v.kv_usage,
            matched_tokens=0,
            prefill_sec_per_token=t.stats.prefill_sec_per_token.value,
            load_sec=load_sec,
            service_sec=t.stats.service_sec.value,
            fits_if_cold=self._fits_if_cold(t, size) if warm is False else None,
            loading=loading,
            inflight=inflight,
            queued_prefill_sec=t.queued_prefill,
            kv_free_tokens=self._kv_free(t, v),
            load_basis=load_basis,
            prefill_model=t.backend.spec.cost_model_terms or self._model_costs.get(t.model),
            capacity_open=capacity_open,
        )

    @staticmethod
    def _kv_free(t: Target, v: View) -> int | None:
        """Tokens the engine's KV pool can still give a new prompt: the pool less what its
        running requests hold (vLLM's usage) less the prompts Pharos sent since that was
        read, plus what its requests running then have freed since; None unless the engine
        reports both, and for an engine whose usage counts its cache's fill
        (``Target.kv_counts_cache``): evictable blocks are room."""
        if v.kv_usage is None or v.kv_pool_tokens is None or t.kv_counts_cache:
            return None
        pool = v.kv_pool_tokens
        return max(0, min(pool, int((1.0 - v.kv_usage) * pool) - t.kv_sent_tokens
                          + t.kv_freed_tokens))

    def _fits_if_cold(self, t: Target, size: int | None) -> bool | None:
        """Whether the model fits in the host's memory beside the models that have requests
        in flight (idle loaded models are evictable). Unknown without a size or memory_gb."""
        memory_gb = t.backend.spec.memory_gb
        limit = max_loaded(t.backend)
        if limit is not None:  # not beside as many busy models as the host holds
            busy_models = sum(1 for o in self.state.targets
                              if o.backend is t.backend and o is not t and o.inflight > 0)
            if busy_models >= limit:
                return False
            if size is None or memory_gb is None:
                return True
        if size is None or memory_gb is None:
            return None
        busy = 0
        for other in self.state.targets:
            if other.backend is t.backend and other is not t and other.inflight > 0:
                v = self.state.view(other)
                busy += v.vram_bytes or v.size_bytes or 0
        return size <= memory_gb * 1e9 - busy
