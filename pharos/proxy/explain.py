"""``POST /admin/explain/<route>``: what the policy would do with a request now, and why.

The body is read as the route would read it, the scheduler builds the candidates and the
policy decides, and nothing else happens: no slot is taken, no demand counted, the index's LRU
order is not touched, nothing is sent to any engine. The answer names each candidate's signals,
predicted cached tokens, cost terms and set-aside reason, the winner, and the deciding term;
no prompt text.
"""

from __future__ import annotations

from typing import Any

from pharos.config import COST_MODEL_FIELDS
from pharos.engine.library import OLLAMA
from pharos.policy import Score
from pharos.proxy import errors
from pharos.proxy.parse import Parsed
from pharos.reasons import deciding_term
from pharos.sched import (
    Placement,
    SchedRequest,
    Scheduler,
    Unavailable,
    UnknownModel,
    names_victims,
)
from pharos.state.registry import Target, View

#: Routes explain accepts (the generation routes).
ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses",
                    "/api/chat", "/api/generate"})


def explain(sched: Scheduler, route: str, parsed: Parsed, session: int | None,
            seed: int) -> dict[str, Any]:
    """The explanation document of one request on ``route`` (raises the route's errors)."""
    kind = OLLAMA if route.startswith("/api/") else None
    req = SchedRequest(parsed.model, parsed.prompt_tokens, seed, kind=kind, chain=parsed.chain,
                       session=session)
    try:
        targets = sched.targets(req)
    except UnknownModel:
        raise errors.unknown_model(parsed.model) from None
    except Unavailable:
        raise errors.unavailable(parsed.model) from None
    placed = sched.decide(req, targets)
    by_id = {t.id: t for t in targets}
    decision = placed.decision
    scores = decision.scores
    winner = by_id[decision.target_id].key if decision.target_id is not None else None
    return {
        "route": route,
        "model": errors.echo(parsed.model),
        "policy": sched.policy.name,
        "prompt_tokens": parsed.prompt_tokens,
        "chain_links": len(parsed.chain),
        "unfollowed": parsed.unfollowed,
        "session_target": (by_id[placed.affinity].key
                           if placed.affinity is not None and placed.affinity in by_id else None),
        "candidates": [_candidate(sched, by_id[s.target_id], s, placed, parsed.prompt_tokens)
                       for s in scores],
        "winner": winner,
        "enqueue": decision.enqueue,
        "reason": decision.reason,
        "why": decision.why,
        "decided_by": deciding_term(scores, decision.target_id),
        "guards": list(decision.guards),
    }


def signal_sources(t: Target, v: View) -> dict[str, str]:
    """Which probe each of the target's signals came from, the log feed's marked ``log``."""
    b = t.backend
    out: dict[str, str] = {}
    for snap in (b.full, b.load):
        if snap is not None:
            out.update((sig.value, name) for sig, name in snap.sources.items())
    if b.log is not None:
        out.update((sig.value, f"log {name}") for sig, name in b.log.sources.items()
                   if sig.value in v.from_log)
    return out


def _candidate(sched: Scheduler, t: Target, s: Score, placed: Placement,
               prompt_tokens: int) -> dict[str, Any]:
    c = next(c for c in placed.candidates if c.target_id == t.id)
    v = sched.state.view(t)
    match = placed.matches.get(t.id)
    return {
        "target": t.key,
        "backend": t.backend.url,
        "kind": t.backend.kind,
        "signals": {
            "up": v.up,
            "residency": v.residency.value,
            "running": v.running,
            "waiting": v.waiting,
            "capacity": v.capacity,
            "kv_usage": v.kv_usage,
            "kv_pool_tokens": v.kv_pool_tokens,
            "size_bytes": v.size_bytes,
            "load_fresh": v.load_fresh,
        },
        "inflight": t.inflight,
        "capacity": c.capacity,
        "capacity_source": sched.capacity_of(t)[1],
        # Per signal, the probe that read it; "log <probe>" where the engine's log filled a
        # signal no scraped probe knows.
        "signal_sources": signal_sources(t, v),
        "capacity_seen_running": t.capacity_seen_max,
        "free_slots": c.free_slots,
        "queue_ahead": c.queue_ahead,
        "predicted_cached_tokens": min(match.tokens, prompt_tokens) if match else 0,
        "prediction_source": match.source if match else None,
        "hot_prefix_owner": t.id in placed.hot_owners,
        "priced_cached_tokens": c.matched_tokens,
        # Live prefix tokens taking this prompt in would push out of their only cache.
        "evicts_tokens": c.evict_tokens,
        # Room the engine's KV pool has for a new prompt (None: the engine does not say).
        "kv_free_tokens": c.kv_free_tokens,
        # Root-prefix tokens the cache was seen to retain (None: not learned yet).
        "retained_root_tokens": sched.roots.retained.get(t.id),
        # A cold load's victims: the idle models it would push out of the host's memory,
        # and the reloads their recent demand makes likely (seconds).
        "evicts_models": list(c.victims),
        # Pharos names them to the host to unload (Ollama); False: the host picks.
        "unloads_victims": (bool(c.victims) and names_victims(t.backend)
                            and sched.policy.name == "cost"),
        "reload_price_sec": c.reload_sec,
        "load_basis": c.load_basis,
        # The backend's calibrated prefill cost (a, b, d), used instead of the learned speed.
        "cost_model": None if c.prefill_model is None else dict(
            zip(COST_MODEL_FIELDS, c.prefill_model, strict=True)),
        "learned": {
            "prefill_sec_per_token": c.prefill_sec_per_token,
            "load_sec": c.load_sec,
            "service_sec": c.service_sec,
        },
        "estimate": {
            "wait_sec": s.wait,
            "load_sec": s.load,
            "prefill_sec": s.prefill,
            "kv_penalty_sec": s.kv_penalty,
            "evict_sec": s.evict,
            "reload_sec": s.reload,
            "ttft_sec": s.est_ttft,
        },
        "utilization": s.utilization,
        "fallbacks": list(s.fallbacks),
        "set_aside": s.set_aside,
    }
