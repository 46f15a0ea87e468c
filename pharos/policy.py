"""Routing policy: pick the target that will produce the first token soonest.

``pick(req, candidates, cfg)`` is pure: no I/O, no clock, no logging, and it imports nothing
from Pharos (it is compiled on its own, ``pharos.compiled``). The scheduler takes a slot on
``Decision.target_id``, or waits in the fair queue when ``enqueue`` is set.

Six policies share the signature (``POLICIES``): two that route, and four baselines compared
through Pharos (same admission, queue, retries).

``cost``
    The estimated time to first token, ``est_ttft = wait + load + prefill + kv_penalty +
    evict + reload``: ``wait`` is the prefill already sent the target without a first byte
    (engines compute prompts in arrival order), plus the slot wait without a free slot, or
    the wait for a running request to end when the KV pool cannot take the prompt
    (``kv_free_tokens``); ``kv_penalty`` takes back part of what a prefix match saves under
    KV pressure (the cache is likely to be evicted); ``evict`` is the prefill later requests
    pay for the live prefixes this prompt pushes out of the only cache holding them;
    ``reload`` a cold load's eviction price (``pharos.placement``). The lowest wins; costs
    within the tie window go to the lower utilization, the lower eviction price, then the
    request's seed.
``least-load``
    Utilization only (ties to the seed): the escape hatch if the estimates misbehave.
``round-robin``, ``random``, ``p2c``, ``prefix-hash``
    Baselines over least-load's feasibility: turn ``req.seq`` in target id order; the lowest
    seeded rank; the less utilized of the two lowest ranks; rendezvous hashing on the root
    prefix (``p2c`` without one).

A pick computes only what selection reads (``Decision``). The estimate is written twice, in
full in ``_Shared.terms`` and inlined in the hot loop ``_select_cost``: a new cost term goes in
both, and a property test compares the two.

Unknown is ``None``, never 0: an unknown speed or time falls back to the candidates' median,
then to the documented default, and the score's ``fallbacks`` say so.

Guards, each with a default in ``PolicyConfig``: bounded load sets aside a target holding more
than its share of the model's requests (a hot prefix cannot melt one engine); KV pressure
trusts a match less above the threshold, waived when nearly every candidate is above;
session affinity sends a request back to its session's target while it has a free slot.
Hot-prefix spreading is the scheduler's. A guard sets a score's ``set_aside`` to its reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

PolicyName: TypeAlias = Literal["cost", "least-load", "round-robin", "random", "p2c",
                                "prefix-hash"]
#: Why the target won: the ``route`` outcomes. ``cache``: its cached prefix outweighed load;
#: ``warm``: its loaded model did (whichever saved more against the least utilized other
#: target); ``least_loaded``: it was strictly the least utilized, or it won on wait or prefill
#: speed alone; ``only_choice``: no other candidate was feasible; ``baseline``: a baseline
#: policy's choice that none of the others describes.
Why: TypeAlias = Literal["only_choice", "least_loaded", "cache", "warm", "affinity", "baseline"]

#: Seconds per uncached prompt token. Measured cold on CPU with Qwen2.5-0.5B, 3.1-15 ms.
PREFILL_SEC_PER_TOKEN_DEFAULT: Final = 0.005
#: Seconds to load a cold model. Assumed, not measured on real models [U].
LOAD_SEC_DEFAULT: Final = 10.0
#: Seconds one request holds a slot. Assumed [U].
SERVICE_SEC_DEFAULT: Final = 5.0
#: Estimated TTFTs closer than this tie...
TIE_WINDOW_SEC: Final = 0.001
#: ...or closer than this share of the lowest: the learned speeds behind an estimate are noisy
#: to about this much, and letting that noise decide unbalanced a fleet with nothing cached.
TIE_WINDOW_SHARE: Final = 0.1
#: KV cache usage above which a prefix match is trusted less (it is likely to be evicted).
KV_PRESSURE_THRESHOLD: Final = 0.9
#: The most of a match's saved prefill the KV-pressure guard takes back (at 100 % usage): a
#: target holding the prompt still costs less than one holding nothing.
KV_DISTRUST_MAX: Final = 0.5
#: The guard is waived for every candidate when at most this share of those reporting KV
#: usage is at or below the threshold: a fleet full everywhere (engines under sustained load)
#: gives no candidate a likelier-to-keep cache.
KV_WAIVE_BELOW_SHARE: Final = 0.1
#: ``Decision.guards`` entries of the KV-pressure guard.
KV_WAIVED: Final = "kv_waived"
KV_DISCOUNTED: Final = "kv_discounted"

#: ``Score.set_aside`` of a cold load that would evict a model with requests in flight.
SET_ASIDE_WONT_FIT: Final = "cold load won't fit"
#: ``Score.set_aside`` of a target over its bounded-load share of the model's requests.
SET_ASIDE_BOUNDED_LOAD: Final = "bounded load"
#: Bounded load: a target may hold (1 + epsilon) times the average share (assumed; 0.25 is
#: too tight for hot prefixes).
BOUNDED_LOAD_EPSILON: Final = 1.0
#: Bounded load sets aside no target with fewer of Pharos's requests in flight than this or
#: half its slots, whichever is less: a share of a handful of requests is noise, and sending a
#: prompt away from its holder then pushes other prompts out of small caches.
BOUNDED_LOAD_MIN_INFLIGHT: Final = 8
#: ``Score.fallbacks`` entry of a cold load whose memory headroom is unknown (taken as feasible).
FITS_IF_COLD_UNKNOWN: Final = "fits_if_cold=unknown"
#: ``Score.fallbacks`` entry of a prefix match trusted in full because KV usage is unknown.
KV_USAGE_UNKNOWN: Final = "kv_usage=unknown"

_MASK64: Final = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class RouteReq:
    """What the policy knows about the request."""

    prompt_tokens: int  # estimated: decoded request text bytes / 4
    seed: int  # random per request; breaks exact ties so identical requests don't herd
    affinity: int | None = None  # the target this request's session used last, if any
    #: Requests of this model routed before it (the scheduler's count): round robin's turn.
    seq: int = 0
    #: The prompt's root prefix hash (its chain's first link), None without one: prefix-hash.
    root: int | None = None


@dataclass(slots=True, kw_only=True, unsafe_hash=True)
class Candidate:
    """One target (backend x model) the request could go to, as the scheduler sees it now.

    A value: nothing writes to one once made. Not frozen: a frozen dataclass sets each field
    through ``object.__setattr__``, too slow at 64 a decision; it hashes by value."""

    target_id: int
    #: Model residency; None: the engine reports none (its one model is always loaded).
    warm: bool | None
    capacity: int  # slots, >= 1: engine-reported, config, learned, or the fallback
    free_slots: int  # capacity - occupied; <= 0 means saturated
    queue_ahead: int  # router waiters (all instances) + engine-reported waiting
    kv_usage: float | None  # 0..1
    matched_tokens: int  # estimated tokens of the prompt the target holds in its prefix cache
    prefill_sec_per_token: float | None  # learned seconds per uncached prompt token
    load_sec: float | None  # learned seconds to load the model when cold
    service_sec: float | None  # learned seconds a request holds a slot
    fits_if_cold: bool | None  # memory headroom check for a cold load; None: unknown
    loading: bool  # a load of the cold model is under way: counts as warm
    inflight: int  # Pharos's requests in flight on the target (for the bounded-load guard)
    #: Estimated prefill seconds of Pharos's requests on the target still without a first
    #: byte: a new prompt is computed after them (engines prefill in arrival order).
    queued_prefill_sec: float = 0.0
    #: Tokens of live prefixes this prompt would push out of their only cache (retention).
    evict_tokens: int = 0
    #: Tokens the engine's KV pool can still give a new prompt (None: unknown). A prompt
    #: whose uncached part does not fit waits in the engine for blocks although a slot is free.
    kv_free_tokens: int | None = None
    #: A cold load's eviction price (``pharos.placement``): seconds the next requests of the
    #: models it pushes out (``victims``) wait for their reload; paid only when cold.
    reload_sec: float = 0.0
    victims: tuple[str, ...] = ()
    #: How ``load_sec`` was estimated (a ``Score.fallbacks`` entry); None: learned, or unknown.
    load_basis: str | None = None
    #: Why the scheduler holds this candidate back for now: set aside with this reason.
    held: str | None = None
    #: The backend's calibrated prefill cost (a, b, d): ``P(u, c) = a·u + b·u·(c + u/2) + d``
    #: (``backends[].cost_model``), used instead of ``prefill_sec_per_token``; None: learned.
    prefill_model: tuple[float, float, float] | None = None
    #: ``capacity`` is Pharos's own estimate, never queued at, and the engine reported no
    #: queue at its last round: it may run more (``pharos.sched.with_match``).
    capacity_open: bool = False


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """The policy and its documented defaults."""

    name: PolicyName = "cost"
    prefill_sec_per_token_default: float = PREFILL_SEC_PER_TOKEN_DEFAULT
    load_sec_default: float = LOAD_SEC_DEFAULT
    service_sec_default: float = SERVICE_SEC_DEFAULT
    tie_window_sec: float = TIE_WINDOW_SEC
    #: Estimates within this share of the lowest tie too (0: the absolute window alone).
    tie_window_share: float = TIE_WINDOW_SHARE
    #: KV usage above this discounts a prefix match linearly, by KV_DISTRUST_MAX at 100 %;
    #: 1.0: off.
    kv_pressure_threshold: float = KV_PRESSURE_THRESHOLD
    #: Bounded load's epsilon; None: off.
    bounded_load_epsilon: float | None = BOUNDED_LOAD_EPSILON
    #: Send a request naming its session back to the session's last target while it can.
    session_affinity: bool = True

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"unknown policy {self.name!r} (known: {', '.join(POLICIES)})")
        for name in ("prefill_sec_per_token_default", "load_sec_default", "service_sec_default"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0: a missing signal never becomes 0")
        if not self.tie_window_sec >= 0:
            raise ValueError("tie_window_sec must be >= 0")
        if not 0 <= self.tie_window_share <= 1:
            raise ValueError("tie_window_share must be within 0..1")
        if not 0 <= self.kv_pressure_threshold <= 1:
            raise ValueError("kv_pressure_threshold must be within 0..1")
        if self.bounded_load_epsilon is not None and not self.bounded_load_epsilon >= 0:
            raise ValueError("bounded_load_epsilon must be >= 0 (or None: off)")


#: A score as a plain tuple in ``Score``'s field order: what a decision keeps (64 frozen
#: dataclasses would cost most of a pick).
ScoreTerms: TypeAlias = tuple[
    int, float | None, float, float, float, float, float, tuple[str, ...], str | None, float,
    float,
]
#: Positions in ``ScoreTerms`` the policy itself reads.
_LOAD: Final = 3
_PREFILL: Final = 4
_KV_PENALTY: Final = 5
_FALLBACKS: Final = 7
_EVICT: Final = 9
_RELOAD: Final = 10


@dataclass(frozen=True, slots=True)
class Score:
    """One candidate's terms, in seconds."""

    target_id: int
    est_ttft: float | None  # wait + load + prefill + kv_penalty + evict + reload; None: aside
    wait: float
    load: float
    prefill: float  # uncached tokens only
    kv_penalty: float  # the prefill a match saves, not trusted under KV pressure
    utilization: float  # (capacity - free_slots + queue_ahead) / capacity
    fallbacks: tuple[str, ...] = ()  # "<input>=median" / "=default" / "=unknown", as used
    set_aside: str | None = None  # why the candidate cannot be picked
    #: The prefill later requests pay for the live prefixes taking this prompt in pushes out
    #: of the only cache holding them (``Candidate.evict_tokens`` at this target's speed).
    evict: float = 0.0
    #: A cold load's eviction price: the reloads it forces on the models it evicts
    #: (``Candidate.reload_sec``).
    reload: float = 0.0

    @property
    def feasible(self) -> bool:
        """The candidate may be picked."""
        return self.set_aside is None


@dataclass(frozen=True, slots=True, eq=False)
class Decision:
    """Where the request goes, and why.

    A pick decides the target and whether to queue, and nothing else: what people read and
    every candidate's full terms are built from the pick's working set when first read (most
    decisions read none of it). Equality and the hash cover all of it: a plain value."""

    target_id: int | None  # None: no feasible candidate (or none at all)
    enqueue: bool  # the target has no free slot (or none is feasible): wait in the fair queue
    #: The pick's working set, which builds the rest on first read.
    _scored: _Scored = field(repr=False)

    @property
    def reason(self) -> str:
        """For people: logs, headers, the status page."""
        return self._scored.explanation()[0]

    @property
    def why(self) -> Why | None:
        """The route outcome; None without a target."""
        return self._scored.explanation()[1]

    @property
    def guards(self) -> tuple[str, ...]:
        """Guards that acted on this decision (``KV_WAIVED``, ``KV_DISCOUNTED``)."""
        return self._scored.explanation()[2]

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        """The candidates it chose among (the decision log writes their signals)."""
        return self._scored.candidates

    @property
    def score_terms(self) -> tuple[ScoreTerms, ...]:
        """Per candidate, in the order of the candidates (built on the first read)."""
        return self._scored.all_terms()

    @property
    def target_terms(self) -> ScoreTerms | None:
        """The winner's terms, None without a target: reading them builds no other
        candidate's."""
        if self.target_id is None:
            return None
        return self._scored.terms_at(self._scored.win)

    @property
    def scores(self) -> tuple[Score, ...]:
        """Per candidate, in the order of the candidates (built on each access)."""
        return tuple(Score(*t) for t in self.score_terms)

    def _key(self) -> tuple[object, ...]:
        return (self.target_id, self.enqueue, self.reason, self.why, self.score_terms,
                self.guards)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"Decision(target_id={self.target_id!r}, enqueue={self.enqueue!r}, "
                f"reason={self.reason!r}, why={self.why!r}, guards={self.guards!r})")



def _calibrated(model: tuple[float, float, float], uncached: int, cached: int) -> float:
    """``P(u, c)`` of a calibrated backend; nothing to compute costs nothing."""
    if uncached <= 0:
        return 0.0
    a, b, d = model
    return a * uncached + b * uncached * (cached + uncached / 2) + d

def _median(values: list[float]) -> float:
    values.sort()
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2


def _fleet(values: list[float], default: float, name: str) -> tuple[float, str]:
    """The fleet median of the known values, else the default; with its fallbacks entry."""
    if values:
        return _median(values), f"{name}=median"
    return default, f"{name}=default"


def _matched(matched_tokens: int, prompt: int) -> int:
    """The tokens a match saves: the match estimate within 0..prompt (an estimate longer than
    the prompt estimate never makes prefill negative)."""
    if matched_tokens > prompt:
        return prompt
    return 0 if matched_tokens < 0 else matched_tokens


_UNBOUNDED: Final = 1 << 62


def _over_bound(inflight: int, capacity: int, bound: int) -> bool:
    """Bounded load sets the target aside: its in-flight requests reach the bound, and
    ``BOUNDED_LOAD_MIN_INFLIGHT`` or half its slots, whichever is less."""
    return inflight >= bound and inflight >= min(BOUNDED_LOAD_MIN_INFLIGHT, (capacity + 1) // 2)


class _Shared:
    """What every candidate's terms share in one pick: the prompt, the config, the guards'
    fleet-wide inputs and the fleet medians of unknown inputs, each taken when first needed,
    and once (a pick whose candidates all know their speeds takes no median)."""

    __slots__ = ("_kv", "_load", "_prefill", "_service", "bound", "candidates", "cfg", "prompt",
                 "threshold")

    def __init__(self, req: RouteReq, candidates: tuple[Candidate, ...], cfg: PolicyConfig
                 ) -> None:
        self.prompt = req.prompt_tokens
        self.threshold = cfg.kv_pressure_threshold
        self.cfg = cfg
        self.candidates = candidates
        self._load: tuple[float, str] | None = None
        self._prefill: tuple[float, str] | None = None
        self._service: tuple[float, str] | None = None
        self._kv: tuple[bool, int] | None = None  # (waived, discounted): ``_kv_pressure``
        n = len(candidates)
        epsilon = cfg.bounded_load_epsilon if cfg.name == "cost" else None
        #: Bounded load: a candidate holding this many in-flight requests is set aside.
        if epsilon is None or n < 2:
            self.bound = _UNBOUNDED
        else:
            total_inflight = sum([c.inflight for c in candidates])
            self.bound = max(1, math.ceil((1 + epsilon) * (total_inflight + 1) / n))

    @property
    def kv_waived(self) -> bool:
        """Every (or nearly every) candidate is under KV pressure: the guard is off for all."""
        return self._kv_pressure()[0]

    @property
    def kv_discounted(self) -> int:
        """Matches the guard discounts (0 when it is waived)."""
        return self._kv_pressure()[1]

    def _kv_pressure(self) -> tuple[bool, int]:
        """The KV-pressure guard's fleet-wide inputs, in one pass when first asked."""
        pressure = self._kv
        if pressure is None:
            threshold, prompt = self.threshold, self.prompt
            known = above = pressed = 0
            for c in self.candidates:
                kv = c.kv_usage
                if kv is not None:
                    known += 1
                    if kv > threshold:
                        above += 1
                        if _matched(c.matched_tokens, prompt):
                            pressed += 1
            waived = threshold < 1 and known > 0 and (
                known - above <= math.floor(known * KV_WAIVE_BELOW_SHARE))
            pressure = self._kv = (waived, 0 if waived else pressed)
        return pressure

    def service_sec(self) -> tuple[float, str]:
        """The service time for a candidate that does not know its own, with its note."""
        if self._service is None:
            self._service = _fleet(
                [v for c in self.candidates if (v := c.service_sec) is not None],
                self.cfg.service_sec_default, "service_sec")
        return self._service

    def load_sec(self) -> tuple[float, str]:
        """The load time for a candidate that does not know its own, with its note."""
        if self._load is None:
            self._load = _fleet(
                [v for c in self.candidates if (v := c.load_sec) is not None],
                self.cfg.load_sec_default, "load_sec")
        return self._load

    def prefill_sec_per_token(self) -> tuple[float, str]:
        """The prefill speed for a candidate that does not know its own, with its note."""
        if self._prefill is None:
            self._prefill = _fleet(
                [v for c in self.candidates if (v := c.prefill_sec_per_token) is not None],
                self.cfg.prefill_sec_per_token_default, "prefill_sec_per_token")
        return self._prefill

    def terms(self, c: Candidate) -> ScoreTerms:
        """One candidate's full terms and every input assumed. ``_select_cost`` inlines the
        same est_ttft (the hot loop): a change to a term goes in both, and
        ``test_selection_estimates_equal_the_full_terms`` holds them together."""
        capacity = c.capacity
        fallbacks: tuple[str, ...] = ()
        set_aside: str | None = None
        free = c.free_slots

        if free > 0:
            wait = c.queued_prefill_sec
        else:
            service = c.service_sec
            if service is None:
                service, note = self.service_sec()
                fallbacks = (note,)
            wait = (c.queue_ahead + 1) / capacity * service + c.queued_prefill_sec

        load = reload = 0.0
        if c.warm is False and not c.loading:
            fits = c.fits_if_cold
            if fits is False:
                set_aside = SET_ASIDE_WONT_FIT
            elif fits is None:
                fallbacks = (*fallbacks, FITS_IF_COLD_UNKNOWN)
            load_sec = c.load_sec
            if load_sec is None:
                load_sec, note = self.load_sec()
                fallbacks = (*fallbacks, note)
            elif c.load_basis is not None:
                fallbacks = (*fallbacks, c.load_basis)
            load = load_sec
            reload = c.reload_sec
        if c.held is not None:
            set_aside = c.held

        prompt = self.prompt
        matched = _matched(c.matched_tokens, prompt)
        per_token = c.prefill_sec_per_token
        model = c.prefill_model
        if model is not None:
            per_token = model[0] + model[1] * prompt / 2  # a whole prompt's mean, for guards
        elif per_token is None:
            per_token, note = self.prefill_sec_per_token()
            if prompt > 0:
                fallbacks = (*fallbacks, note)
        prefill = (prompt - matched) * per_token if model is None else _calibrated(
            model, prompt - matched, matched)
        kv_free = c.kv_free_tokens
        if free > 0 and kv_free is not None and prompt - matched > kv_free:
            service = c.service_sec
            if service is None:
                service, note = self.service_sec()
                fallbacks = (*fallbacks, note)
            wait += service / (max(capacity - free, 0) + 1)

        kv_penalty = 0.0
        if matched:
            kv = c.kv_usage
            threshold = self.threshold
            if kv is None:
                fallbacks = (*fallbacks, KV_USAGE_UNKNOWN)
            elif kv > threshold and not self.kv_waived:
                distrust = (kv - threshold) / (1.0 - threshold)
                if distrust > 1.0:
                    distrust = 1.0
                kv_penalty = matched * per_token * (distrust * KV_DISTRUST_MAX)

        if set_aside is None and _over_bound(c.inflight, capacity, self.bound):
            set_aside = SET_ASIDE_BOUNDED_LOAD
        util = (capacity - free + c.queue_ahead) / capacity
        evict = c.evict_tokens * per_token
        est = (None if set_aside is not None
               else wait + load + prefill + kv_penalty + evict + reload)
        return (c.target_id, est, wait, load, prefill, kv_penalty, util, fallbacks, set_aside,
                evict, reload)


#: What a decision says to people: its reason, its route outcome and the guards that acted.
Explanation: TypeAlias = tuple[str, Why | None, tuple[str, ...]]
#: Each kind of decision's wording (``_Scored.kind``), filled by ``pharos.reasons.install``:
#: the policy, compiled on its own, imports nothing of Pharos.
EXPLAIN: dict[str, Callable[[_Scored], Explanation]] = {}


class _Scored:
    """One pick's working set: the columns selection reads, how the winner was chosen, and
    what is built from them when first asked for (terms, utilization, explanation)."""

    __slots__ = ("_all", "_explained", "_some", "_util", "aside", "base_why", "best",
                 "candidates", "est", "feasible", "fleet", "kind", "limit", "sticky", "tie",
                 "win", "window")

    def __init__(self, fleet: _Shared) -> None:
        self.fleet = fleet
        self.candidates = fleet.candidates
        # Per candidate, filled in by index (cheaper than appending).
        n = len(fleet.candidates)
        self.est: list[float | None] = [None] * n  # None: set aside (or not computed)
        self._util: list[float] | None = None  # filled in by least-load's selection
        self.feasible: list[int] = []  # indices of the candidates not set aside
        self.best = math.inf  # the lowest est_ttft
        self.aside: dict[str, int] = {}  # set_aside reason -> how many
        # How the winner was chosen, for the explanation.
        self.win = -1  # the winner's index, once picked
        self.sticky = False  # the winner is the session's target (affinity)
        #: What broke a tie: "utilization", "eviction price", "seed"; None: no tie.
        self.tie: str | None = None
        self.window = self.limit = 0.0  # cost's tie window and the estimate it reaches
        #: Which ``EXPLAIN`` words it ("none": no target), and a baseline's outcome.
        self.kind = "none"
        self.base_why: Why = "baseline"
        self._explained: Explanation | None = None
        self._some: dict[int, ScoreTerms] = {}
        self._all: tuple[ScoreTerms, ...] | None = None

    @property
    def util(self) -> list[float]:
        """Every candidate's utilization (under cost, built on the first read)."""
        if self._util is None:
            self._util = [(c.capacity - c.free_slots + c.queue_ahead) / c.capacity
                          for c in self.candidates]
        return self._util

    def util_at(self, i: int) -> float:
        """Candidate ``i``'s utilization, as in ``util``, without building the column."""
        if self._util is not None:
            return self._util[i]
        c = self.candidates[i]
        return (c.capacity - c.free_slots + c.queue_ahead) / c.capacity

    def terms_at(self, i: int) -> ScoreTerms:
        """The full terms of candidate ``i``."""
        terms = self._some.get(i)
        if terms is None:
            terms = self._some[i] = self.fleet.terms(self.candidates[i])
        return terms

    def all_terms(self) -> tuple[ScoreTerms, ...]:
        """Every candidate's full terms, in the order of the candidates."""
        if self._all is None:
            some, terms = self._some, self.fleet.terms
            self._all = tuple(some.get(i) or terms(c) for i, c in enumerate(self.candidates))
        return self._all

    def explanation(self) -> Explanation:
        """The decision's reason, outcome and guards, worded on the first read."""
        if self._explained is None:
            self._explained = EXPLAIN[self.kind](self)
        return self._explained


def _capacity_error(c: Candidate) -> ValueError:
    return ValueError(f"target {c.target_id}: capacity {c.capacity} < 1")


def _select_cost(fleet: _Shared) -> _Scored:
    """Each candidate's est_ttft, and which are set aside: all cost's selection reads (no
    fallbacks, no per-term record, no utilization). The hot loop of every decision: it inlines
    ``_Shared.terms``' arithmetic, same terms added in the same order, names bound to locals."""
    out = _Scored(fleet)
    ests, aside, add_feasible = out.est, out.aside, out.feasible.append
    prompt, threshold, bound = fleet.prompt, fleet.threshold, fleet.bound
    service_median = load_median = per_token_median = -1.0  # < 0: not taken yet
    best = math.inf
    waived: bool | None = None  # the KV guard's waiver, read at the first match it applies to
    for i, c in enumerate(fleet.candidates):
        capacity = c.capacity
        if capacity < 1:
            raise _capacity_error(c)
        if c.held is not None:
            aside[c.held] = aside.get(c.held, 0) + 1
            continue
        if c.warm is False and not c.loading:
            if c.fits_if_cold is False:
                aside[SET_ASIDE_WONT_FIT] = aside.get(SET_ASIDE_WONT_FIT, 0) + 1
                continue
            load = c.load_sec
            if load is None:
                if load_median < 0:
                    load_median = fleet.load_sec()[0]
                load = load_median
            reload = c.reload_sec
        else:
            load = reload = 0.0
        inflight = c.inflight
        if inflight >= bound and _over_bound(inflight, capacity, bound):
            aside[SET_ASIDE_BOUNDED_LOAD] = aside.get(SET_ASIDE_BOUNDED_LOAD, 0) + 1
            continue

        free = c.free_slots
        if free > 0:
            wait = c.queued_prefill_sec
        else:
            service = c.service_sec
            if service is None:
                if service_median < 0:
                    service_median = fleet.service_sec()[0]
                service = service_median
            wait = (c.queue_ahead + 1) / capacity * service + c.queued_prefill_sec

        matched = c.matched_tokens
        if matched > prompt:
            matched = prompt
        elif matched < 0:
            matched = 0
        per_token = c.prefill_sec_per_token
        model = c.prefill_model
        if model is not None:
            per_token = model[0] + model[1] * prompt / 2
            prefill = _calibrated(model, prompt - matched, matched)
        else:
            if per_token is None:
                if per_token_median < 0:
                    per_token_median = fleet.prefill_sec_per_token()[0]
                per_token = per_token_median
            prefill = (prompt - matched) * per_token
        kv_free = c.kv_free_tokens
        if free > 0 and kv_free is not None and prompt - matched > kv_free:
            service = c.service_sec
            if service is None:
                if service_median < 0:
                    service_median = fleet.service_sec()[0]
                service = service_median
            running = capacity - free
            wait += service / ((running if running > 0 else 0) + 1)

        est = wait + load + prefill
        if matched:  # a KV penalty of 0 is not added (x + 0.0 == x: the same sum)
            kv = c.kv_usage
            if kv is not None and kv > threshold:
                if waived is None:
                    waived = fleet.kv_waived
                if not waived:
                    distrust = (kv - threshold) / (1.0 - threshold)
                    if distrust > 1.0:
                        distrust = 1.0
                    est += matched * per_token * (distrust * KV_DISTRUST_MAX)
        est = est + c.evict_tokens * per_token + reload
        if est < best:
            best = est
        add_feasible(i)
        ests[i] = est
    out.best = best
    if not out.feasible and aside.get(SET_ASIDE_BOUNDED_LOAD):
        # The guard never leaves no target: without it, every other one is infeasible anyway.
        fleet.bound = _UNBOUNDED
        return _select_cost(fleet)
    return out


def _select_least_load(fleet: _Shared) -> _Scored:
    """Each candidate's utilization, and which are set aside: all least-load's selection
    reads (the bound is off under least-load: only a cold load that won't fit is set aside)."""
    out = _Scored(fleet)
    utils, aside, add_feasible = [0.0] * len(fleet.candidates), out.aside, out.feasible.append
    out._util = utils
    bound = fleet.bound
    for i, c in enumerate(fleet.candidates):
        capacity = c.capacity
        if capacity < 1:
            raise _capacity_error(c)
        utils[i] = (capacity - c.free_slots + c.queue_ahead) / capacity
        if c.held is not None:
            aside[c.held] = aside.get(c.held, 0) + 1
        elif c.warm is False and not c.loading and c.fits_if_cold is False:
            aside[SET_ASIDE_WONT_FIT] = aside.get(SET_ASIDE_WONT_FIT, 0) + 1
        elif c.inflight >= bound and _over_bound(c.inflight, capacity, bound):
            aside[SET_ASIDE_BOUNDED_LOAD] = aside.get(SET_ASIDE_BOUNDED_LOAD, 0) + 1
        else:
            add_feasible(i)
    if not out.feasible and aside.get(SET_ASIDE_BOUNDED_LOAD):
        fleet.bound = _UNBOUNDED  # as in _select_cost
        return _select_least_load(fleet)
    return out


def _select(req: RouteReq, candidates: Sequence[Candidate], cfg: PolicyConfig) -> _Scored:
    fleet = _Shared(req, tuple(candidates), cfg)
    return (_select_cost if cfg.name == "cost" else _select_least_load)(fleet)


def score(req: RouteReq, candidates: Sequence[Candidate], cfg: PolicyConfig) -> tuple[Score, ...]:
    """Every candidate's cost terms, in the order of the candidates."""
    return tuple(Score(*t) for t in _select(req, candidates, cfg).all_terms())


def rank(seed: int, target_id: int) -> int:
    """splitmix64 of the seed and the target: a per-request random rank of each target."""
    z = (seed + (target_id + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _break_tie(ties: list[int], scored: _Scored, seed: int, reload: bool = False
               ) -> tuple[int, str | None]:
    """The lowest utilization among the tied indices, then (``reload``: cost's) the lowest
    eviction price, then the lowest seeded rank (rendezvous hashing: independent of candidate
    order). Returns the winner and what broke the tie (None: no tie). The eviction price comes
    before the seed: cold loads of one model on different hosts tie whenever their victims'
    prices are within the window, and the lower price is the victim likelier asked for last."""
    if len(ties) == 1:
        return ties[0], None
    low = math.inf
    least: list[int] = []
    util_at = scored.util_at
    for i in ties:
        u = util_at(i)
        if u < low:
            low, least = u, [i]
        elif u == low:
            least.append(i)
    if len(least) == 1:
        return least[0], "utilization"
    candidates = scored.candidates
    if reload:
        cheapest = min(_paid_reload(candidates[i]) for i in least)
        if any(_paid_reload(candidates[i]) > cheapest for i in least):
            least = [i for i in least if _paid_reload(candidates[i]) == cheapest]
            if len(least) == 1:
                return least[0], "eviction price"
    return min(least, key=lambda i: rank(seed, candidates[i].target_id)), "seed"


def _paid_reload(c: Candidate) -> float:
    """The eviction price the candidate's estimate counts: a cold load's, else none."""
    return c.reload_sec if c.warm is False and not c.loading else 0.0


def _no_target(scored: _Scored) -> Decision:
    """No feasible candidate (or none at all): queue, unless there is nothing to wait for."""
    return Decision(None, bool(scored.candidates), scored)


def _decide(scored: _Scored, win: int, kind: str) -> Decision:
    """The decision for candidate ``win``: its explanation is ``EXPLAIN[kind]``'s, when read."""
    c = scored.candidates[win]
    scored.win = win
    scored.kind = kind
    return Decision(c.target_id, c.free_slots <= 0, scored)


def cost(req: RouteReq, candidates: Sequence[Candidate], cfg: PolicyConfig) -> Decision:
    """The lowest estimated TTFT wins, ties broken by ``_break_tie``. Enqueue when the winner
    has no free slot."""
    scored = _select_cost(_Shared(req, tuple(candidates), cfg))
    if not scored.feasible:
        return _no_target(scored)
    ests = scored.est
    window = max(cfg.tie_window_sec, scored.best * cfg.tie_window_share)
    limit = scored.best + window
    sticky = _affinity(req, scored.candidates, scored, cfg)
    if sticky is not None:
        win, tie = sticky, None
    else:
        ties = [i for i in scored.feasible if (ests[i] or 0.0) <= limit]
        win, tie = _break_tie(ties, scored, req.seed, reload=True)
    scored.sticky, scored.tie, scored.window, scored.limit = sticky is not None, tie, window, limit
    return _decide(scored, win, "cost")


def _affinity(req: RouteReq, candidates: Sequence[Candidate], scored: _Scored,
              cfg: PolicyConfig) -> int | None:
    """The index of the session's last target when affinity applies: it is a candidate, no
    guard set it aside, and it has a free slot."""
    if req.affinity is None or not cfg.session_affinity:
        return None
    for i in scored.feasible:
        if candidates[i].target_id == req.affinity:
            return i if candidates[i].free_slots > 0 else None
    return None


def least_load(req: RouteReq, candidates: Sequence[Candidate], cfg: PolicyConfig) -> Decision:
    """The lowest utilization wins (ties to the request's seed), among feasible candidates
    only. Enqueue when the winner has no free slot."""
    scored = _select_least_load(_Shared(req, tuple(candidates), cfg))
    if not scored.feasible:
        return _no_target(scored)
    win, scored.tie = _break_tie(scored.feasible, scored, req.seed)
    return _decide(scored, win, "least-load")


def _rotation(scored: _Scored) -> list[int]:
    """The feasible indices in target id order (independent of the candidates' order)."""
    candidates = scored.candidates
    return sorted(scored.feasible, key=lambda i: candidates[i].target_id)


def _drawn(scored: _Scored, seed: int) -> list[int]:
    """The feasible indices by seeded rank, lowest first (rendezvous: independent of order)."""
    candidates = scored.candidates
    return sorted(scored.feasible, key=lambda i: rank(seed, candidates[i].target_id))


def _baseline(req: RouteReq, candidates: Sequence[Candidate], cfg: PolicyConfig,
              choose: Callable[[RouteReq, _Scored], tuple[int, str, Why]]) -> Decision:
    """A baseline's decision: least-load's feasibility, ``choose``'s winner, lead and why."""
    scored = _select_least_load(_Shared(req, tuple(candidates), cfg))
    if not scored.feasible:
        return _no_target(scored)
    win, lead, why = choose(req, scored)
    scored.tie, scored.base_why = lead, why
    return _decide(scored, win, "baseline")


def _choose_round_robin(req: RouteReq, scored: _Scored) -> tuple[int, str, Why]:
    order = _rotation(scored)
    turn = req.seq % len(order)
    return order[turn], f"round robin turn {turn + 1} of {len(order)}", "baseline"


def _choose_random(req: RouteReq, scored: _Scored) -> tuple[int, str, Why]:
    return _drawn(scored, req.seed)[0], "random", "baseline"


def _choose_p2c(req: RouteReq, scored: _Scored) -> tuple[int, str, Why]:
    drawn = _drawn(scored, req.seed)
    if len(drawn) == 1:
        return drawn[0], "p2c", "only_choice"
    a, b = drawn[0], drawn[1]
    ua, ub = scored.util_at(a), scored.util_at(b)
    if ub < ua:
        return b, f"p2c: less utilized of 2 ({ub:.0%} vs {ua:.0%})", "least_loaded"
    if ua < ub:
        return a, f"p2c: less utilized of 2 ({ua:.0%} vs {ub:.0%})", "least_loaded"
    return a, "p2c: equal utilization, first drawn", "baseline"


def _choose_prefix_hash(req: RouteReq, scored: _Scored) -> tuple[int, str, Why]:
    if req.root is None:
        win, lead, why = _choose_p2c(req, scored)
        return win, f"no root prefix, {lead}", why
    candidates, root = scored.candidates, req.root & _MASK64
    win = max(scored.feasible, key=lambda i: (rank(root, candidates[i].target_id),
                                              -candidates[i].target_id))
    return win, "prefix hash of the root", "baseline"


def round_robin(req: RouteReq, candidates: Sequence[Candidate], cfg: PolicyConfig) -> Decision:
    """The feasible candidates in target id order, turn ``req.seq``."""
    return _baseline(req, candidates, cfg, _choose_round_robin)


def random_choice(req: RouteReq, candidates: Sequence[Candidate], cfg: PolicyConfig
                  ) -> Decision:
    """A feasible candidate drawn by the request's seed."""
    return _baseline(req, candidates, cfg, _choose_random)


def p2c(req: RouteReq, candidates: Sequence[Candidate], cfg: PolicyConfig) -> Decision:
    """The less utilized of two feasible candidates drawn by the request's seed."""
    return _baseline(req, candidates, cfg, _choose_p2c)


def prefix_hash(req: RouteReq, candidates: Sequence[Candidate], cfg: PolicyConfig) -> Decision:
    """Rendezvous hashing on the root prefix; ``p2c`` without one."""
    return _baseline(req, candidates, cfg, _choose_prefix_hash)


#: Policy name (config ``policy:``) to its function. Adding a policy means adding one function.
POLICIES: Final[dict[str, Callable[[RouteReq, Sequence[Candidate], PolicyConfig], Decision]]] = {
    "cost": cost,
    "least-load": least_load,
    "round-robin": round_robin,
    "random": random_choice,
    "p2c": p2c,
    "prefix-hash": prefix_hash,
}


def pick(req: RouteReq, candidates: Sequence[Candidate], cfg: PolicyConfig) -> Decision:
    """Route one request with the configured policy."""
    return POLICIES[cfg.name](req, candidates, cfg)
