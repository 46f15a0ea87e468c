"""Speed estimates learned from request feedback: EWMAs unknown until a sample, never 0."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

#: Weight of a new sample: about the last ten requests count.
ALPHA = 0.2
#: A prefill sample needs this many uncached tokens: a nearly fully cached prompt measures
#: fixed overhead (llama.cpp reports 20-100 ms for 1 uncached token).
MIN_UNCACHED_FOR_PREFILL = 256
#: An engine-reported load under this loaded nothing: residency was a scrape behind.
MIN_REAL_LOAD_SEC = 0.010


@dataclass(slots=True)
class Ewma:
    """An exponentially weighted moving average; ``value`` is None until the first sample."""

    alpha: float = ALPHA
    value: float | None = None
    samples: int = 0

    def add(self, x: float) -> None:
        """Fold one sample in."""
        self.samples += 1
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)


@dataclass(slots=True)
class TargetStats:
    """Per target: prefill seconds per uncached token, load seconds, request seconds."""

    prefill_sec_per_token: Ewma = field(default_factory=Ewma)
    load_sec: Ewma = field(default_factory=Ewma)
    service_sec: Ewma = field(default_factory=Ewma)


@dataclass(frozen=True, slots=True)
class Sample:
    """What one finished request teaches (the proxy fills it from the tap and its timers)."""

    ok: bool
    dispatched_cold: bool
    ttft_sec: float | None
    duration_sec: float | None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    prompt_eval_sec: float | None = None  # the engine's own prefill time, when it reports it
    load_sec: float | None = None  # the engine's own load time (Ollama load_duration)
    control: bool = False  # an Ollama load/unload request: teaches nothing
    #: Seconds from the later of its dispatch and the target's previous first byte to its own
    #: first byte: its TTFT without the prefills that were ahead of it (engines without a
    #: per-request prefill time prefill in arrival order; ``Lease.first_byte`` measures it).
    prefill_window_sec: float | None = None


def learn(stats: TargetStats, s: Sample) -> bool:
    """Update the EWMAs from one request by the sampling rules. Returns whether the dispatch
    really paid a load (an engine-reported load under 10 ms loaded nothing: warm)."""
    if not s.ok or s.control:
        return False
    cold = s.dispatched_cold
    if cold and s.load_sec is not None and s.load_sec < MIN_REAL_LOAD_SEC:
        cold = False
    if cold:
        load = load_sample(stats, s)
        if load is not None:
            stats.load_sec.add(load)
    elif s.duration_sec is not None:
        stats.service_sec.add(s.duration_sec)
    if s.prompt_tokens is not None and s.cached_tokens is not None:
        uncached = s.prompt_tokens - s.cached_tokens
        if uncached >= MIN_UNCACHED_FOR_PREFILL:
            if s.prompt_eval_sec is not None:
                stats.prefill_sec_per_token.add(s.prompt_eval_sec / uncached)
            elif not cold and (seen := (s.prefill_window_sec if s.prefill_window_sec
                                        is not None else s.ttft_sec)) is not None:
                # TTFT alone would count the queue as prefill: a busy target would look slow,
                # lose traffic, and keep the slow estimate for want of new samples.
                stats.prefill_sec_per_token.add(seen / uncached)
    return cold


def load_sample(stats: TargetStats, s: Sample) -> float | None:
    """The load time a successful cold dispatch measured, None when it measured none.

    The engine's own figure when it reports one (Ollama's ``load_duration`` on the native
    API). Otherwise (``/v1`` reports none) its time to first byte less the prefills computed
    ahead of it (``prefill_window_sec``) and its own prefill (``prompt_eval_sec``, else its
    uncached tokens at the learned speed; with neither, the load is over-counted, never
    under-counted). At least ``MIN_REAL_LOAD_SEC``: the dispatch was cold, so it paid one."""
    if not s.ok or s.control or not s.dispatched_cold:
        return None
    if s.load_sec is not None:
        return s.load_sec if s.load_sec >= MIN_REAL_LOAD_SEC else None
    seen = s.ttft_sec
    if s.prefill_window_sec is not None:
        seen = s.prefill_window_sec if seen is None else min(seen, s.prefill_window_sec)
    if seen is None:
        return None
    prefill = s.prompt_eval_sec
    if prefill is None and s.prompt_tokens is not None:
        speed = stats.prefill_sec_per_token.value
        if speed is not None:
            prefill = max(0, s.prompt_tokens - (s.cached_tokens or 0)) * speed
    return max(MIN_REAL_LOAD_SEC, seen - (prefill or 0.0))


#: The estimates a snapshot carries, by their field names on the wire.
STAT_FIELDS = ("prefill_sec_per_token", "load_sec", "service_sec")


def export_stats(stats: TargetStats) -> dict[str, float | None]:
    """The target's estimates for a snapshot; unknown ones are ``None``, never 0."""
    return {name: getattr(stats, name).value for name in STAT_FIELDS}


def parse_stats(raw: Mapping[str, object]) -> dict[str, float | None]:
    """One snapshot row's estimates back (unknown fields are ignored, a missing one is
    unknown); ``ValueError`` names a value that is not a finite non-negative number."""
    out: dict[str, float | None] = {}
    for name in STAT_FIELDS:
        value = raw.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value < 0):
            raise ValueError(f"stats: {name} must be a non-negative number or null, "
                             f"not {value!r}")
        out[name] = None if value is None else float(value)
    return out


def adopt(stats: TargetStats, values: Mapping[str, float | None]) -> bool:
    """Take restored estimates where this process has no sample of its own. The adopted
    value counts no sample, so the first local one moves it by ``ALPHA`` and a later
    snapshot may still replace it. Returns whether anything was taken."""
    took = False
    for name in STAT_FIELDS:
        value = values.get(name)
        ewma: Ewma = getattr(stats, name)
        if value is not None and ewma.samples == 0:
            ewma.value = value
            took = True
    return took
