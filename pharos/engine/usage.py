"""Token usage of one reply, read from what the engine sent (spec §9 "Tap").

``parse_usage`` reads one decoded JSON object: an SSE ``data:`` line, an NDJSON line (Ollama's
native API) or a whole non-streamed body. Where each value can be is data, ``USAGE_FIELDS``: per
value an ordered list of places, newer names first (the probe rule of §4: a newer name goes
ahead of an older one only once a recorded stream shows it; ``tests/replay/
test_usage_replay.py`` replays every recorded reply). The first place present wins.

Every value is ``None`` when the engine did not say it, and 0 only when the engine said 0
(DESIGN §3). Known meanings, per engine:

- OpenAI shape (vLLM, SGLang, mlx-lm, Ollama's /v1, llama.cpp): ``usage.prompt_tokens``
  counts the whole prompt, cached tokens included; ``usage.prompt_tokens_details.
  cached_tokens`` is the cached part (vLLM only with ``--enable-prompt-tokens-details``,
  SGLang only with ``--enable-cache-report``; otherwise absent or null: unknown).
- llama.cpp: ``timings.prompt_n`` counts only the tokens it evaluated, so the whole prompt is
  ``timings.prompt_n + timings.cache_n``; ``timings.prompt_ms`` is its prefill time. In a
  stream the timings sit on the last item (the finish chunk when usage was not asked for).
- Ollama native: ``prompt_eval_count`` is the whole prompt, cached included, from v0.30.1 on.
  v0.30.0 alone counted only the uncached tokens there; no capture of v0.30.0 exists, so this
  table does not special-case it (its prompt count would read low). ``prompt_eval_cached_count``
  exists from v0.33.3 (present with 0 when nothing was cached). Durations are nanoseconds, and
  every metric is omitted when zero (so a missing one is unknown, not 0).

Embeddings generate no tokens: their completion count is 0, not unknown. Nothing in an
embeddings body says "I generated nothing", so the caller says which route it forwarded:
``parse_usage(obj, embeddings=True)`` (and ``StreamTap(embeddings=True)``) for
``/v1/embeddings`` and ``/api/embed``. A reply with no usage at all stays ``None`` there too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Usage:
    """What one reply cost, as the engine reported it; ``None`` is unknown, never 0."""

    prompt_tokens: int | None = None
    """The whole prompt, cached tokens included."""
    cached_tokens: int | None = None
    """The part of the prompt the engine took from its cache."""
    completion_tokens: int | None = None
    prompt_eval_sec: float | None = None
    """The engine's own prefill time (llama.cpp prompt_ms, Ollama prompt_eval_duration)."""
    load_sec: float | None = None
    """Time the engine spent loading the model for this request (Ollama load_duration)."""

    @property
    def total_tokens(self) -> int | None:
        """Prompt plus completion tokens, unknown if either is."""
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class UsageField:
    """One place a usage value can be: the sum of the numbers at ``paths`` (every one must be
    there, or this place does not apply). A duration's ``per_sec`` is how many of its units
    make a second (1e3 for milliseconds); a count has none."""

    paths: tuple[tuple[str, ...], ...]
    per_sec: float | None = None


def _at(*dotted: str, per_sec: float | None = None) -> UsageField:
    return UsageField(tuple(tuple(d.split(".")) for d in dotted), per_sec)


#: Where each ``Usage`` value can be, first match wins, newer names first. The one truth for
#: usage field names; the stream tap derives its cheap pre-decode markers from it.
USAGE_FIELDS: Mapping[str, tuple[UsageField, ...]] = {
    "prompt_tokens": (
        _at("usage.prompt_tokens"),
        _at("timings.prompt_n", "timings.cache_n"),  # llama.cpp: prompt_n excludes the cache
        _at("prompt_eval_count"),  # Ollama ≥0.30.1 (0.30.0: uncached only; not recorded)
    ),
    "cached_tokens": (
        _at("usage.prompt_tokens_details.cached_tokens"),  # llama.cpp only from b8772
        _at("timings.cache_n"),  # llama.cpp, every build from b6602
        _at("prompt_eval_cached_count"),  # Ollama ≥0.33.3
    ),
    "completion_tokens": (
        _at("usage.completion_tokens"),
        _at("timings.predicted_n"),  # llama.cpp
        _at("eval_count"),  # Ollama native
    ),
    "prompt_eval_sec": (
        _at("timings.prompt_ms", per_sec=1e3),  # llama.cpp, milliseconds
        _at("prompt_eval_duration", per_sec=1e9),  # Ollama, nanoseconds
    ),
    "load_sec": (
        _at("load_duration", per_sec=1e9),  # Ollama, nanoseconds
    ),
}

#: The top-level keys any usage value can hang from ("usage", "timings", "eval_count", ...).
USAGE_KEYS: frozenset[str] = frozenset(
    path[0] for fields in USAGE_FIELDS.values() for f in fields for path in f.paths
)


def _number(obj: Mapping[str, Any], path: tuple[str, ...]) -> int | float | None:
    value: Any = obj
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return value


def _read(obj: Mapping[str, Any], f: UsageField) -> int | float | None:
    total: int | float = 0
    for path in f.paths:
        n = _number(obj, path)
        if n is None:
            return None
        total += n
    if f.per_sec is not None:
        return total / f.per_sec
    if isinstance(total, float):
        return int(total) if total.is_integer() else None
    return total


def parse_usage(obj: Mapping[str, Any], *, embeddings: bool = False) -> Usage | None:
    """The usage in one decoded JSON object, or ``None`` if it carries none.

    ``embeddings``: the object answers an embeddings request, so an unreported completion
    count is 0 (embeddings generate nothing) rather than unknown.
    """
    if not isinstance(obj, Mapping):
        return None
    values: dict[str, Any] = {}
    for name, fields in USAGE_FIELDS.items():
        for f in fields:
            v = _read(obj, f)
            if v is not None:
                values[name] = v
                break
    if not values:
        return None
    if embeddings and "completion_tokens" not in values:
        values["completion_tokens"] = 0
    return Usage(**values)
