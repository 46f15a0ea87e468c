"""The statistics of one run, from its request records alone (so a report can recompute them).

Requests scheduled inside the warm-up were sent (caches warmed) but are not counted. Rates
divide by ``duration - warmup``, the span the counted requests were offered over, so goodput
equals the offered rate when every request meets the SLO.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pharos.bench.records import RequestRecord

#: The default SLO (spec: TTFT at most 2 s, time per output token at most 100 ms).
DEFAULT_SLO_TTFT = 2.0
DEFAULT_SLO_TPOT = 0.1


@dataclass(frozen=True, slots=True)
class Slo:
    """What a request must meet to count towards goodput."""

    ttft: float = DEFAULT_SLO_TTFT
    tpot: float = DEFAULT_SLO_TPOT

    def met(self, r: RequestRecord) -> bool:
        """Whether ``r`` succeeded within both bounds. A reply of one token has no TPOT and
        meets that bound; a reply whose token count is unknown cannot be shown to meet it."""
        if not r.ok or r.ttft is None or r.ttft > self.ttft:
            return False
        if r.completion_tokens is not None and r.completion_tokens <= 1:
            return True
        return r.tpot is not None and r.tpot <= self.tpot


def percentile(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile (0..100) by nearest rank, ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(len(ordered) * p / 100) - 1))
    return ordered[k]


def distribution(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """p50, p90, p95, p99, mean and max of the known values, and how many there were."""
    known = [v for v in values if v is not None]
    return {
        "n": len(known),
        "p50": percentile(known, 50),
        "p90": percentile(known, 90),
        "p95": percentile(known, 95),
        "p99": percentile(known, 99),
        "mean": sum(known) / len(known) if known else None,
        "max": max(known) if known else None,
    }


def hit_rate(records: Iterable[RequestRecord]) -> float | None:
    """Cached over prompt tokens, summed over the requests whose engine reported both;
    ``None`` when none did (Ollama reports no cached tokens)."""
    cached = prompt = 0
    for r in records:
        if r.cached_tokens is not None and r.prompt_tokens:
            cached += r.cached_tokens
            prompt += r.prompt_tokens
    return cached / prompt if prompt else None


def engine_shares(records: Iterable[RequestRecord]) -> tuple[dict[str, int], float | None]:
    """Requests per engine (those whose engine is known) and the busiest one's share."""
    counts = Counter(r.engine for r in records if r.engine is not None)
    total = sum(counts.values())
    busiest = max(counts.values()) / total if total else None
    return dict(sorted(counts.items())), busiest


def summarize(
    records: Sequence[RequestRecord], duration: float, warmup: float = 0.0, slo: Slo = Slo()
) -> dict[str, Any]:
    """The summary of a run: latency distributions of the successful counted requests,
    throughput, goodput, prefix hit rate, per-engine counts, errors by kind and send lag."""
    counted = [r for r in records if not r.warmup]
    ok = [r for r in counted if r.ok]
    window = duration - warmup
    per_engine, busiest = engine_shares(counted)
    errors = Counter(r.error or f"http_{r.status}" for r in counted if not r.ok)
    good = sum(1 for r in counted if slo.met(r))
    output = [r.completion_tokens for r in ok if r.completion_tokens is not None]

    def rate(n: float) -> float | None:
        return n / window if window > 0 else None

    out: dict[str, Any] = {
        "requests": len(records),
        "warmup_requests": len(records) - len(counted),
        "counted": len(counted),
        "ok": len(ok),
        "window_s": window,
        "ttft_s": distribution(r.ttft for r in ok),
        "tpot_s": distribution(r.tpot for r in ok),
        "e2e_s": distribution(r.e2e for r in ok),
        "throughput_rps": rate(len(ok)),
        "output_tokens_per_s": rate(sum(output)),
        "goodput_rps": rate(good),
        "slo_attainment": good / len(counted) if counted else None,
        "prompt_tokens": _total(r.prompt_tokens for r in ok),
        "cached_tokens": _total(r.cached_tokens for r in ok),
        "hit_rate": hit_rate(ok),
        "per_engine": per_engine,
        "busiest_share": busiest,
        "errors": dict(sorted(errors.items())),
        "send_lag_s": distribution(r.lag for r in counted),
    }
    clients = sorted({r.client for r in counted if r.client is not None})
    if clients:
        out["per_client"] = {c: per_client([r for r in counted if r.client == c], window)
                             for c in clients}
    return out


def per_client(counted: Sequence[RequestRecord], window: float) -> dict[str, Any]:
    """One client group's counted requests: how many, how many served, their TTFT and
    end-to-end latency, and requests and output tokens served per second."""
    ok = [r for r in counted if r.ok]
    output = sum(r.completion_tokens or 0 for r in ok)
    errors = Counter(r.error or f"http_{r.status}" for r in counted if not r.ok)
    return {
        "counted": len(counted),
        "ok": len(ok),
        "keys": len({r.key for r in counted if r.key is not None}),
        "ttft_s": distribution(r.ttft for r in ok),
        "e2e_s": distribution(r.e2e for r in ok),
        "throughput_rps": len(ok) / window if window > 0 else None,
        "output_tokens_per_s": output / window if window > 0 else None,
        "errors": dict(sorted(errors.items())),
    }


def _total(values: Iterable[int | None]) -> int | None:
    """The sum of the known values, ``None`` when none is known."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None
