"""The policy's decisions in words: each decision's reason, its route outcome (``Why``) and
the guards that acted, worded when first read (``Decision.reason``), and the cost term that
decided it (explain). ``install`` puts the wording into ``pharos.policy.EXPLAIN``: the policy,
compiled on its own, imports nothing of Pharos."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Final

from pharos.policy import (
    _EVICT,
    _FALLBACKS,
    _KV_PENALTY,
    _LOAD,
    _PREFILL,
    KV_DISCOUNTED,
    KV_WAIVED,
    Candidate,
    Explanation,
    Score,
    Why,
    _Scored,
)


def install(policy: ModuleType) -> None:
    """Word ``policy``'s decisions (``pharos.policy``, or a copy of its source)."""
    policy.EXPLAIN.update({"none": explain_no_target, "cost": explain_cost,
                           "least-load": explain_least_load, "baseline": explain_baseline})


def explain_no_target(scored: _Scored) -> Explanation:
    if not scored.candidates:
        return "no candidates", None, ()
    return f"no feasible target: {_set_aside_note(scored)}", None, ()


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
    if c.free_slots <= 0:
        return f"{state}, full"
    if c.capacity_open and c.inflight >= c.capacity:
        return f"{state}, past its learned capacity"
    return state


def _explained(scored: _Scored, why: Why, parts: list[str]) -> Explanation:
    """The notes every policy's reason ends with, and the guards that acted."""
    win = scored.win
    if scored.candidates[win].free_slots <= 0:
        parts.append("queued: no free slot")
    if scored.aside:
        parts.append(_set_aside_note(scored))
    fallbacks = scored.terms_at(win)[_FALLBACKS]
    if fallbacks:
        parts.append("assumed " + ", ".join(fallbacks))
    guards: tuple[str, ...] = ()
    fleet = scored.fleet
    if fleet.kv_waived:
        guards = (KV_WAIVED,)
        parts.append("kv pressure waived (every candidate above the threshold)")
    elif discounted := fleet.kv_discounted:
        guards = (KV_DISCOUNTED,)
        parts.append(f"kv pressure discounted {discounted} match"
                     + ("es" if discounted > 1 else ""))
    return ", ".join(parts), why, guards


def _alternatives(scored: _Scored) -> tuple[int, int]:
    """The cost winner's reference for ``_why`` (the least utilized other, then the lowest
    est_ttft, then target id; -1 when the winner is strictly the least utilized or alone) and
    the runner-up its reason names (the lowest est_ttft; -1 when alone)."""
    candidates, ests, win = scored.candidates, scored.est, scored.win
    ref, ref_util, ref_est, ref_id = -1, 0.0, 0.0, 0
    runner, runner_est = -1, 0.0
    for i in scored.feasible:
        if i == win:
            continue
        est = ests[i] or 0.0
        if runner < 0 or est < runner_est:
            runner, runner_est = i, est
        c = candidates[i]
        u = (c.capacity - c.free_slots + c.queue_ahead) / c.capacity  # as in _Scored.util
        if ref < 0 or u < ref_util or (u == ref_util and (
                est < ref_est or (est == ref_est and c.target_id < ref_id))):
            ref, ref_util, ref_est, ref_id = i, u, est, c.target_id
    if ref >= 0 and scored.util_at(win) < ref_util:
        ref = -1
    return ref, runner


def _why(scored: _Scored, ref: int) -> Why:
    """What the cost winner saved against the least utilized alternative ``ref`` (chosen so
    that the outcome never depends on the seed): ``warm`` if the load it avoids is the larger
    saving, ``cache`` if the prefill its cached prefix avoids is, else ``least_loaded``."""
    if ref < 0:
        return "least_loaded"
    win = scored.win
    r, s = scored.terms_at(ref), scored.terms_at(win)
    warm_saved = r[_LOAD] - s[_LOAD]
    cache_saved = 0.0
    if scored.candidates[win].matched_tokens > 0:
        cache_saved = ((r[_PREFILL] + r[_KV_PENALTY] + r[_EVICT])
                       - (s[_PREFILL] + s[_KV_PENALTY] + s[_EVICT]))
    if warm_saved <= 0 and cache_saved <= 0:
        return "least_loaded"
    return "cache" if cache_saved > warm_saved else "warm"


def explain_cost(scored: _Scored) -> Explanation:
    """A cost decision's reason: the winner's state and cached tokens, its estimate against
    the runner-up's, what broke a tie; and its route outcome."""
    candidates, ests, win = scored.candidates, scored.est, scored.win
    c, win_est = candidates[win], ests[win]
    assert win_est is not None
    ref, runner = _alternatives(scored)
    why: Why
    if len(scored.feasible) == 1:
        why = "only_choice"
    elif scored.sticky and win_est > scored.limit:
        why = "affinity"
    else:
        why = _why(scored, ref)
    parts = ["only choice", _label(c)] if why == "only_choice" else [_label(c)]
    if scored.sticky:
        parts.insert(0, "session affinity")
    matched = min(c.matched_tokens, scored.fleet.prompt)
    if matched > 0:
        parts.append(f"{_tokens(matched)} cached tok")
    if c.victims and c.warm is False and not c.loading:
        parts.append(f"evicts {'+'.join(c.victims)} (reload {_secs(c.reload_sec)})")
    if runner < 0:
        parts.append(f"est {_secs(win_est)}")
    else:
        parts.append(f"est {_secs(win_est)} vs {_secs(ests[runner] or 0.0)} "
                     f"({_label(candidates[runner])})")
    if scored.tie is not None:
        parts.append(f"tie within {_secs(scored.window)} broken by {scored.tie}")
    return _explained(scored, why, parts)


#: The cost terms ``deciding_term`` compares.
TERMS: Final = ("wait", "load", "prefill", "kv_penalty", "evict", "reload")


def deciding_term(scores: Sequence[Score], winner: int | None) -> str | None:
    """The cost term that put the winner furthest ahead of the runner-up; None without a
    winner or a runner-up, or when it was ahead on no term (a tie broken by utilization or
    seed)."""
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


def explain_least_load(scored: _Scored) -> Explanation:
    """A least-load decision's reason: the winner's state and utilization against the
    runner-up's, and whether the seed broke a tie."""
    candidates, utils, win = scored.candidates, scored.util, scored.win
    only = len(scored.feasible) == 1
    why: Why = "only_choice" if only else "least_loaded"
    parts = ["only choice" if only else "least loaded", _label(candidates[win])]
    runner, runner_util = -1, 0.0
    for i in scored.feasible:
        if i != win and (runner < 0 or utils[i] < runner_util):
            runner, runner_util = i, utils[i]
    if runner < 0:
        parts.append(f"util {utils[win]:.0%}")
    else:
        parts.append(f"util {utils[win]:.0%} vs {runner_util:.0%} "
                     f"({_label(candidates[runner])})")
    if scored.tie == "seed":
        parts.append("equal utilization broken by seed")
    return _explained(scored, why, parts)


def explain_baseline(scored: _Scored) -> Explanation:
    """A baseline's reason: how it chose (in ``tie``), the winner's state and utilization."""
    c, win, why = scored.candidates[scored.win], scored.win, scored.base_why
    if len(scored.feasible) == 1:
        why = "only_choice"
    parts = [scored.tie or "", _label(c), f"util {scored.util_at(win):.0%}"]
    return _explained(scored, why, parts)
