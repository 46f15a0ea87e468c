"""Routing policy (spec §7): pick the target that will produce the first token soonest.

``pick(req, candidates, cfg)`` is pure: no I/O, no clock, no logging, and it imports nothing
from Pharos, so it is a plain function over the value types defined here. The scheduler (§8)
builds the candidates (residency, occupancy, prefix matches, learned estimates) and acts on the
decision: take a slot on ``Decision.target_id``, or wait in the fair queue when ``enqueue`` is
set (with ``target_id`` None: "waiting without a feasible target").

Two policies share the signature (``POLICIES``):

``cost``
    The estimated time to first token in seconds, ``est_ttft = wait + load + prefill`` plus a
    KV-pressure penalty (above ``kv_pressure_threshold`` part of the prefill a prefix match
    saves is added back in proportion, ``KV_DISTRUST_MAX`` of it at 100 % usage: the cache is
    likely to be evicted, so the match is trusted less). ``wait`` is the prefill Pharos has
    already sent the target and that has not produced a first byte yet (engines compute prompts
    in arrival order, so a free slot behind three long prompts still waits for them), plus,
    without a free slot, the slot wait of spec §7. The lowest wins; costs within
    ``tie_window_sec`` of the lowest tie, and ties go to the lower utilization, then to a
    pseudo-random choice seeded by ``req.seed``.
``least-load``
    Utilization only (same tie rule), the escape hatch if the estimates misbehave on a fleet.

Both compute every candidate's ``Score`` (for the decision log, the status page and tests) and
neither ever picks a candidate that is set aside (a cold load that would not fit).

Unknown is ``None``, never 0: an unknown prefill speed, load time or service time falls back to
the median over the candidates that know it, then to the documented default below, and the
score's ``fallbacks`` (and the decision's reason, for the winner) say so.

Guards (spec §7 and the related systems' load guards), each with a documented default in
``PolicyConfig``:

* bounded load: a target already holding ``ceil((1 + epsilon) × (in_flight + 1) / n)`` of the
  model's in-flight requests is set aside, so a hot prefix cannot melt one engine (some target
  always qualifies; the guard steps back when it would leave none);
* KV pressure: above ``kv_pressure_threshold`` the match is trusted less (the penalty above),
  by at most ``KV_DISTRUST_MAX`` of what it saves, so a target holding the prompt still beats
  one holding nothing; when (nearly) every candidate is above, the guard is waived for all
  (``kv_waived``): a fleet full everywhere would otherwise lose its cache signal;
* session affinity: a request naming its conversation (``RouteReq.affinity``: the target its
  session last used) goes back there while that target is feasible and has a free slot;
* hot-prefix spreading is the scheduler's (it prices extra owners of a hot root prefix as
  holding it, through ``matched_tokens``).

A guard sets a score's ``set_aside`` to its reason, and selection skips any score set aside.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal, TypeAlias

PolicyName: TypeAlias = Literal["cost", "least-load"]
#: Why the target won: the ``route`` outcomes of spec §13. ``cache``: its cached prefix
#: outweighed load; ``warm``: its loaded model did (whichever saved more against the least
#: utilized other target); ``least_loaded``: it was strictly the least utilized, or it won on
#: wait or prefill speed alone; ``only_choice``: no other candidate was feasible.
Why: TypeAlias = Literal["only_choice", "least_loaded", "cache", "warm", "affinity"]

#: Seconds per uncached prompt token. Measured cold on CPU with Qwen2.5-0.5B, 3.1-15 ms.
PREFILL_SEC_PER_TOKEN_DEFAULT: Final = 0.005
#: Seconds to load a cold model. Assumed, not measured on real models [U].
LOAD_SEC_DEFAULT: Final = 10.0
#: Seconds one request holds a slot. Assumed [U].
SERVICE_SEC_DEFAULT: Final = 5.0
#: Estimated TTFTs closer than this tie.
TIE_WINDOW_SEC: Final = 0.001
#: KV cache usage above which a prefix match is trusted less (it is likely to be evicted).
KV_PRESSURE_THRESHOLD: Final = 0.9
#: The most of a match's saved prefill the KV-pressure guard takes back (at 100 % usage): a
#: target holding the prompt still costs less than one holding nothing. Taking all of it back
#: erased the cache signal on a busy fleet (hit rate 0.40, issue 10).
KV_DISTRUST_MAX: Final = 0.5
#: The guard is waived for every candidate when at most this share of those reporting KV
#: usage is at or below the threshold: a fleet that is full everywhere (as engines under
#: sustained load report, a full prefix cache) gives no candidate a likelier-to-keep cache.
KV_WAIVE_BELOW_SHARE: Final = 0.1
#: ``Decision.guards`` entries of the KV-pressure guard.
KV_WAIVED: Final = "kv_waived"
KV_DISCOUNTED: Final = "kv_discounted"

#: ``Score.set_aside`` of a cold load that would evict a model with requests in flight.
SET_ASIDE_WONT_FIT: Final = "cold load won't fit"
#: ``Score.set_aside`` of a target over its bounded-load share of the model's requests.
SET_ASIDE_BOUNDED_LOAD: Final = "bounded load"
#: Bounded load: a target may hold (1 + epsilon) times the average share. 1.0, as the related
#: system settled on after measuring 0.25 too tight for hot prefixes (assumed here).
BOUNDED_LOAD_EPSILON: Final = 1.0
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One target (backend x model) the request could go to, as the scheduler sees it now."""

    target_id: int
    #: Model residency; None: the engine reports none (its one model is always loaded).
    warm: bool | None
    capacity: int  # slots, >= 1: engine-reported, config, or the §8 fallback
    free_slots: int  # capacity - occupied (§8); <= 0 means saturated
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


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """The policy and its documented defaults (spec §7 ``policy.Defaults``)."""

    name: PolicyName = "cost"
    prefill_sec_per_token_default: float = PREFILL_SEC_PER_TOKEN_DEFAULT
    load_sec_default: float = LOAD_SEC_DEFAULT
    service_sec_default: float = SERVICE_SEC_DEFAULT
    tie_window_sec: float = TIE_WINDOW_SEC
    #: KV usage above this discounts a prefix match linearly, by KV_DISTRUST_MAX at 100 %
    #: (waived when nearly every candidate is above); 1.0: off.
    kv_pressure_threshold: float = KV_PRESSURE_THRESHOLD
    #: Bounded load's epsilon; None: off.
    bounded_load_epsilon: float | None = BOUNDED_LOAD_EPSILON
    #: Send a request naming its session back to the session's last target while it can.
    session_affinity: bool = True

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"unknown policy {self.name!r} (known: {', '.join(POLICIES)})")
        for field in ("prefill_sec_per_token_default", "load_sec_default", "service_sec_default"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{field} must be > 0: a missing signal never becomes 0")
        if not self.tie_window_sec >= 0:
            raise ValueError("tie_window_sec must be >= 0")
        if not 0 <= self.kv_pressure_threshold <= 1:
            raise ValueError("kv_pressure_threshold must be within 0..1")
        if self.bounded_load_epsilon is not None and not self.bounded_load_epsilon >= 0:
            raise ValueError("bounded_load_epsilon must be >= 0 (or None: off)")


#: A score as a plain tuple in ``Score``'s field order: what the hot path builds (a frozen
#: dataclass costs about 1 µs to construct, 64 of them most of the budget of a pick).
ScoreTerms: TypeAlias = tuple[
    int, float | None, float, float, float, float, float, tuple[str, ...], str | None
]


@dataclass(frozen=True, slots=True)
class Score:
    """One candidate's terms, in seconds."""

    target_id: int
    est_ttft: float | None  # wait + load + prefill + kv_penalty; None when set aside
    wait: float
    load: float
    prefill: float  # uncached tokens only
    kv_penalty: float  # the prefill a match saves, not trusted under KV pressure
    utilization: float  # (capacity - free_slots + queue_ahead) / capacity
    fallbacks: tuple[str, ...] = ()  # "<input>=median" / "=default" / "=unknown", as used
    set_aside: str | None = None  # why the candidate cannot be picked

    @property
    def feasible(self) -> bool:
        """The candidate may be picked."""
        return self.set_aside is None


@dataclass(frozen=True, slots=True)
class Decision:
    """Where the request goes, and why."""

    target_id: int | None  # None: no feasible candidate (or none at all)
    enqueue: bool  # the target has no free slot (or none is feasible): wait in the fair queue
    reason: str  # for people: logs, headers, the status page
    why: Why | None  # the §13 route outcome; None without a target
    score_terms: tuple[ScoreTerms, ...]  # per candidate, in the order of the candidates
    #: Guards that acted on this decision (``KV_WAIVED``, ``KV_DISCOUNTED``).
    guards: tuple[str, ...] = ()

    @property
    def scores(self) -> tuple[Score, ...]:
        """Per candidate, in the order of the candidates (built on each access)."""
        return tuple(Score(*t) for t in self.score_terms)


def _median(values: list[float]) -> float:
    values.sort()
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2


def _fleet(values: list[float], default: float, field: str) -> tuple[float, str]:
    """The fleet median of the known values, else the default; with its fallbacks entry."""
    if values:
        return _median(values), f"{field}=median"
    return default, f"{field}=default"


class _Scored:
    """One pick's working set: the terms, and the columns selection reads."""

    __slots__ = ("aside", "best", "est", "feasible", "kv_discounted", "kv_waived", "terms",
                 "util")

    def __init__(self) -> None:
        self.kv_waived = False  # every (or nearly every) candidate was under KV pressure
        self.kv_discounted = 0  # matches the guard discounted
        self.terms: list[ScoreTerms] = []
        self.est: list[float | None] = []
        self.util: list[float] = []
        self.feasible: list[int] = []  # indices of the candidates not set aside
        self.best = math.inf  # the lowest est_ttft
        self.aside: dict[str, int] = {}  # set_aside reason -> how many


def _score(req: RouteReq, candidates: Sequence[Candidate], cfg: PolicyConfig) -> _Scored:
    # The hot loop of every decision (64 candidates in the benchmark): names are bound to
    # locals and the guards' fleet-wide inputs gathered in one pass before it.
    prompt = req.prompt_tokens
    threshold = cfg.kv_pressure_threshold
    prefill_fleet: tuple[float, str] | None = None
    load_fleet: tuple[float, str] | None = None
    service_fleet: tuple[float, str] | None = None
    out = _Scored()
    terms, ests, utils, feasible = out.terms, out.est, out.util, out.feasible
    add_term, add_est, add_util, add_feasible = (
        terms.append, ests.append, utils.append, feasible.append)
    best = math.inf
    known = above = total_inflight = 0
    for c in candidates:
        total_inflight += c.inflight
        kv = c.kv_usage
        if kv is not None:
            known += 1
            if kv > threshold:
                above += 1
    n = len(candidates)
    epsilon = cfg.bounded_load_epsilon if cfg.name == "cost" else None
    bound = (_UNBOUNDED if epsilon is None or n < 2
             else max(1, math.ceil((1 + epsilon) * (total_inflight + 1) / n)))
    waived = out.kv_waived = threshold < 1 and known > 0 and (
        known - above <= math.floor(known * KV_WAIVE_BELOW_SHARE))
    discounted = 0
    for c in candidates:
        capacity = c.capacity
        if capacity < 1:
            raise ValueError(f"target {c.target_id}: capacity {capacity} < 1")
        fallbacks: tuple[str, ...] = ()
        set_aside: str | None = None
        free = c.free_slots

        if free > 0:
            wait = c.queued_prefill_sec
        else:
            service = c.service_sec
            if service is None:
                if service_fleet is None:
                    service_fleet = _fleet(
                        [v for x in candidates if (v := x.service_sec) is not None],
                        cfg.service_sec_default, "service_sec")
                service, note = service_fleet
                fallbacks = (note,)
            wait = (c.queue_ahead + 1) / capacity * service + c.queued_prefill_sec

        load = 0.0
        if c.warm is False and not c.loading:
            fits = c.fits_if_cold
            if fits is False:
                set_aside = SET_ASIDE_WONT_FIT
                out.aside[set_aside] = out.aside.get(set_aside, 0) + 1
            elif fits is None:
                fallbacks = (*fallbacks, FITS_IF_COLD_UNKNOWN)
            load_sec = c.load_sec
            if load_sec is None:
                if load_fleet is None:
                    load_fleet = _fleet(
                        [v for x in candidates if (v := x.load_sec) is not None],
                        cfg.load_sec_default, "load_sec")
                load_sec, note = load_fleet
                fallbacks = (*fallbacks, note)
            load = load_sec

        matched = c.matched_tokens
        if matched > prompt:
            matched = prompt
        elif matched < 0:
            matched = 0
        per_token = c.prefill_sec_per_token
        if per_token is None:
            if prefill_fleet is None:
                prefill_fleet = _fleet(
                    [v for x in candidates if (v := x.prefill_sec_per_token) is not None],
                    cfg.prefill_sec_per_token_default, "prefill_sec_per_token")
            per_token, note = prefill_fleet
            if prompt > 0:
                fallbacks = (*fallbacks, note)
        prefill = (prompt - matched) * per_token

        kv_penalty = 0.0
        if matched:
            kv = c.kv_usage
            if kv is None:
                fallbacks = (*fallbacks, KV_USAGE_UNKNOWN)
            elif kv > threshold and not waived:
                distrust = (kv - threshold) / (1.0 - threshold)
                if distrust > 1.0:
                    distrust = 1.0
                kv_penalty = matched * per_token * (distrust * KV_DISTRUST_MAX)
                discounted += 1

        if set_aside is None and c.inflight >= bound:
            set_aside = SET_ASIDE_BOUNDED_LOAD
            out.aside[set_aside] = out.aside.get(set_aside, 0) + 1
        util = (capacity - free + c.queue_ahead) / capacity
        est: float | None = None
        if set_aside is None:
            est = wait + load + prefill + kv_penalty
            if est < best:
                best = est
            add_feasible(len(terms))
        add_term(
            (c.target_id, est, wait, load, prefill, kv_penalty, util, fallbacks, set_aside))
        add_est(est)
        add_util(util)
    out.best = best
    out.kv_discounted = discounted
    if not feasible and out.aside.get(SET_ASIDE_BOUNDED_LOAD):
        # The guard never leaves no target: without it, every other one is infeasible anyway.
        return _score(req, candidates, replace(cfg, bounded_load_epsilon=None))
    return out


_UNBOUNDED: Final = 1 << 62


def score(req: RouteReq, candidates: Sequence[Candidate], cfg: PolicyConfig) -> tuple[Score, ...]:
    """Every candidate's cost terms, in the order of the candidates (both policies report
    them; ``Decision.scores`` holds the same)."""
    return tuple(Score(*t) for t in _score(req, candidates, cfg).terms)


def rank(seed: int, target_id: int) -> int:
    """splitmix64 of the seed and the target: a per-request random rank of each target."""
    z = (seed + (target_id + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _break_tie(
    ties: list[int], candidates: Sequence[Candidate], util: list[float], seed: int
) -> tuple[int, str | None]:
    """The lowest utilization among the tied indices, then the lowest seeded random rank
    (rendezvous hashing, so the choice does not depend on candidate order). Returns the winner
    and what broke the tie, None if there was none."""
    if len(ties) == 1:
        return ties[0], None
    low = math.inf
    least: list[int] = []
    for i in ties:
        u = util[i]
        if u < low:
            low, least = u, [i]
        elif u == low:
            least.append(i)
    if len(least) == 1:
        return least[0], "utilization"
    return min(least, key=lambda i: rank(seed, candidates[i].target_id)), "seed"


def _no_target(scored: _Scored) -> Decision:
    if not scored.terms:
        return Decision(None, False, "no candidates", None, ())
    reason = f"no feasible target: {_set_aside_note(scored)}"
    return Decision(None, True, reason, None, tuple(scored.terms))


def _set_aside_note(scored: _Scored) -> str:
    return ", ".join(f"{n} set aside ({why})" for why, n in scored.aside.items())


def _secs(x: float) -> str:
    if x < 0.1:
        return f"{x * 1000:.0f}ms"
    return f"{x:.2f}".rstrip("0").rstrip(".") + "s"


def _tokens(n: int) -> str:
    if n < 1000:
        return str(n)
    return f"{n / 1000:.1f}".rstrip("0").rstrip(".") + "k"


def _label(c: Candidate) -> str:
    """The candidate's state in a reason: warm, loading or cold, and full without a free slot."""
    state = ("loading" if c.loading else "cold") if c.warm is False else "warm"
    return state if c.free_slots > 0 else f"{state}, full"


def _decide(
    candidates: Sequence[Candidate],
    scored: _Scored,
    win: int,
    why: Why,
    parts: list[str],
) -> Decision:
    c = candidates[win]
    enqueue = c.free_slots <= 0
    if enqueue:
        parts.append("queued: no free slot")
    if scored.aside:
        parts.append(_set_aside_note(scored))
    fallbacks = scored.terms[win][7]
    if fallbacks:
        parts.append("assumed " + ", ".join(fallbacks))
    guards: tuple[str, ...] = ()
    if scored.kv_waived:
        guards = (KV_WAIVED,)
        parts.append("kv pressure waived (every candidate above the threshold)")
    elif scored.kv_discounted:
        guards = (KV_DISCOUNTED,)
        parts.append(f"kv pressure discounted {scored.kv_discounted} match"
                     + ("es" if scored.kv_discounted > 1 else ""))
    return Decision(c.target_id, enqueue, ", ".join(parts), why, tuple(scored.terms), guards)


def _why(candidates: Sequence[Candidate], scored: _Scored, win: int, s: Score) -> Why:
    """What the cost winner saved against the least utilized alternative (spec §13 ``route``).

    The reference is the least utilized feasible target other than the winner, the lowest
    est_ttft among equals (then the lowest target id), so the outcome never depends on the
    seed. A winner that is strictly the least utilized won on load alone: ``least_loaded``.
    Otherwise ``warm`` if the load it avoids is the larger saving, ``cache`` if the prefill its
    cached prefix avoids is, and ``least_loaded`` if it saved neither (it won on wait or on
    prefill speed)."""
    util, ests, terms = scored.util, scored.est, scored.terms
    low = min(util[i] for i in scored.feasible)
    ref, ref_key = -1, (math.inf, 0)
    for i in scored.feasible:
        if i != win and util[i] == low:
            key = (ests[i] or 0.0, candidates[i].target_id)
            if ref < 0 or key < ref_key:
                ref, ref_key = i, key
    if ref < 0:
        return "least_loaded"
    r = Score(*terms[ref])
    warm_saved = r.load - s.load
    cache_saved = 0.0
    if candidates[win].matched_tokens > 0:
        cache_saved = (r.prefill + r.kv_penalty) - (s.prefill + s.kv_penalty)
    if warm_saved <= 0 and cache_saved <= 0:
        return "least_loaded"
    return "cache" if cache_saved > warm_saved else "warm"


def cost(req: RouteReq, candidates: Sequence[Candidate], cfg: PolicyConfig) -> Decision:
    """The lowest estimated TTFT wins; ties within the window go to lower utilization, then to
    the request's seed. Enqueue when the winner has no free slot."""
    scored = _score(req, candidates, cfg)
    ests, feasible = scored.est, len(scored.feasible)
    if not feasible:
        return _no_target(scored)
    limit = scored.best + cfg.tie_window_sec
    sticky = _affinity(req, candidates, scored, cfg)
    if sticky is not None:
        win, tie = sticky, None
    else:
        ties = [i for i in scored.feasible if (ests[i] or 0.0) <= limit]
        win, tie = _break_tie(ties, candidates, scored.util, req.seed)
    c, s = candidates[win], Score(*scored.terms[win])
    assert s.est_ttft is not None

    why: Why
    if feasible == 1:
        why = "only_choice"
    elif sticky is not None and (ests[win] or 0.0) > limit:
        why = "affinity"
    else:
        why = _why(candidates, scored, win, s)
    parts = ["only choice", _label(c)] if why == "only_choice" else [_label(c)]
    if sticky is not None:
        parts.insert(0, "session affinity")
    matched = min(c.matched_tokens, req.prompt_tokens)
    if matched > 0:
        parts.append(f"{_tokens(matched)} cached tok")
    runner, runner_est = -1, 0.0
    for i in scored.feasible:
        est = ests[i]
        if i != win and est is not None and (runner < 0 or est < runner_est):
            runner, runner_est = i, est
    if runner < 0:
        parts.append(f"est {_secs(s.est_ttft)}")
    else:
        parts.append(f"est {_secs(s.est_ttft)} vs {_secs(runner_est)} "
                     f"({_label(candidates[runner])})")
    if tie is not None:
        parts.append(f"tie within {_secs(cfg.tie_window_sec)} broken by {tie}")
    return _decide(candidates, scored, win, why, parts)


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


#: The cost terms ``deciding_term`` compares.
TERMS: Final = ("wait", "load", "prefill", "kv_penalty")


def deciding_term(scores: Sequence[Score], winner: int | None) -> str | None:
    """The cost term that put the winner furthest ahead of the runner-up (the feasible
    candidate with the next lowest estimate); None without a winner or a runner-up, or when
    the winner was not ahead on any term (a tie broken by utilization or seed)."""
    mine = next((s for s in scores if s.target_id == winner), None)
    if mine is None:
        return None
    others = [s for s in scores if s.target_id != winner and s.est_ttft is not None]
    if not others:
        return None
    runner = min(others, key=lambda s: (s.est_ttft or 0.0, s.target_id))
    gains = {t: getattr(runner, t) - getattr(mine, t) for t in TERMS}
    term = max(TERMS, key=lambda t: gains[t])
    return term if gains[term] > 0 else None


def least_load(req: RouteReq, candidates: Sequence[Candidate], cfg: PolicyConfig) -> Decision:
    """The lowest utilization wins (ties to the request's seed), among feasible candidates
    only. Enqueue when the winner has no free slot."""
    scored = _score(req, candidates, cfg)
    if not scored.feasible:
        return _no_target(scored)
    win, tie = _break_tie(scored.feasible, candidates, scored.util, req.seed)
    c, utils = candidates[win], scored.util
    only = len(scored.feasible) == 1
    why: Why = "only_choice" if only else "least_loaded"
    parts = ["only choice" if only else "least loaded", _label(c)]
    runner, runner_util = -1, 0.0
    for i in scored.feasible:
        if i != win and (runner < 0 or utils[i] < runner_util):
            runner, runner_util = i, utils[i]
    if runner < 0:
        parts.append(f"util {utils[win]:.0%}")
    else:
        parts.append(f"util {utils[win]:.0%} vs {runner_util:.0%} "
                     f"({_label(candidates[runner])})")
    if tie == "seed":
        parts.append("equal utilization broken by seed")
    return _decide(candidates, scored, win, why, parts)


#: Policy name (config ``policy:``) to its function. Adding a policy means adding one function.
POLICIES: Final[dict[str, Callable[[RouteReq, Sequence[Candidate], PolicyConfig], Decision]]] = {
    "cost": cost,
    "least-load": least_load,
}


def pick(req: RouteReq, candidates: Sequence[Candidate], cfg: PolicyConfig) -> Decision:
    """Route one request with the configured policy (spec §7 ``Pick``)."""
    return POLICIES[cfg.name](req, candidates, cfg)
