"""Token usage of one reply, read from what the engine sent.

``parse_usage`` reads one decoded JSON object: an SSE ``data:`` line, an NDJSON line (Ollama's
native API) or a whole non-streamed body. Where each value can be is data, ``USAGE_FIELDS``: per
value an ordered list of places, newer names first (a newer name goes ahead of an older one
only once a recorded stream shows it; ``tests/replay/test_usage_replay.py`` replays every
recorded reply). The first place present wins.

Every value is ``None`` when the engine did not say it, and 0 only when the engine said 0.
Known meanings, per engine:

- OpenAI shape (vLLM, SGLang, mlx-lm, Ollama's /v1, llama.cpp): ``usage.prompt_tokens``
  counts the whole prompt, cached tokens included; ``usage.prompt_tokens_details.
  cached_tokens`` is the cached part (vLLM only with ``--enable-prompt-tokens-details``,
  SGLang only with ``--enable-cache-report``; otherwise absent or null: unknown).
- llama.cpp: ``timings.prompt_n`` counts only the tokens it evaluated, so the whole prompt is
  ``timings.prompt_n + timings.cache_n``; ``timings.prompt_ms`` is its prefill time. In a
  stream the timings sit on the last item (the finish chunk when usage was not asked for).
- Anthropic Messages (``/v1/messages``; vLLM, llama.cpp): ``usage.input_tokens`` counts only
  the prompt tokens neither read from nor written to the cache, so the whole prompt is
  ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens`` (each cache field
  only when sent; vLLM sends them only with ``--enable-prompt-tokens-details``, and then its
  ``input_tokens`` is the rest); ``cache_read_input_tokens`` is the cached part. In a stream,
  ``message_start`` carries ``message.usage`` (prompt counts; its ``output_tokens`` is a
  placeholder, 0, so it is not read) and ``message_delta`` the final ``usage`` (llama.cpp:
  ``output_tokens`` alone; vLLM: every field again).
- OpenAI Responses (``/v1/responses``; vLLM, llama.cpp): ``usage.input_tokens`` is the whole
  prompt, ``usage.input_tokens_details.cached_tokens`` the cached part, ``usage.output_tokens``
  the completion. In a stream only ``response.completed`` carries it, as ``response.usage``
  (``response.created`` and ``response.in_progress`` have ``"usage": null``).
- Ollama native: ``prompt_eval_count`` is the whole prompt, cached included, from v0.30.1 on
  (v0.30.0 alone counted only the uncached tokens; not special-cased, no capture exists).
  ``prompt_eval_cached_count`` exists from v0.33.3 (0 when nothing was cached). Durations are
  nanoseconds; every metric is omitted when zero (so a missing one is unknown, not 0).

Embeddings generate no tokens, but nothing in their body says so: the caller passes
``embeddings=True`` for ``/v1/embeddings`` and ``/api/embed`` and the completion count is 0.
A reply with no usage at all stays ``None`` there too.

A stream may spread its usage over several events (Anthropic's ``message_start`` and
``message_delta``): ``merge_usage`` keeps what an earlier event said unless a later one says it
again.
"""

from __future__ import annotations

import dataclasses
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
    """One place a usage value can be: the sum of the numbers at ``paths`` (all present, or
    the place does not apply) plus those at ``plus`` that are. ``per_sec``: a duration's units
    per second (1e3 for milliseconds); None for a count."""

    paths: tuple[tuple[str, ...], ...]
    per_sec: float | None = None
    plus: tuple[tuple[str, ...], ...] = ()


def _at(*dotted: str, per_sec: float | None = None, plus: tuple[str, ...] = ()) -> UsageField:
    return UsageField(tuple(tuple(d.split(".")) for d in dotted), per_sec,
                      tuple(tuple(d.split(".")) for d in plus))


def _anthropic_prompt(usage: str) -> UsageField:
    """Anthropic's whole prompt under ``usage``: the uncached input plus the cache reads and
    writes that were sent (a Responses usage has none of them, so its input_tokens alone)."""
    return _at(f"{usage}.input_tokens", plus=(f"{usage}.cache_read_input_tokens",
                                              f"{usage}.cache_creation_input_tokens"))


#: Keys under which a stream event wraps a whole reply object: Anthropic's ``message_start``
#: (``message``) and the Responses events (``response``). A path's marker for the tap is its
#: first key below them.
ENVELOPES: frozenset[str] = frozenset({"message", "response"})


#: Where each ``Usage`` value can be, first match wins, newer names first. The one truth for
#: usage field names; the stream tap derives its cheap pre-decode markers from it.
USAGE_FIELDS: Mapping[str, tuple[UsageField, ...]] = {
    "prompt_tokens": (
        _at("usage.prompt_tokens"),
        _anthropic_prompt("usage"),  # Anthropic (body, message_delta); Responses body
        _anthropic_prompt("message.usage"),  # Anthropic message_start
        _at("response.usage.input_tokens"),  # Responses stream: response.completed
        _at("timings.prompt_n", "timings.cache_n"),  # llama.cpp: prompt_n excludes the cache
        _at("prompt_eval_count"),  # Ollama ≥0.30.1 (0.30.0: uncached only; not recorded)
    ),
    "cached_tokens": (
        _at("usage.prompt_tokens_details.cached_tokens"),  # llama.cpp only from b8772
        _at("usage.cache_read_input_tokens"),  # Anthropic
        _at("message.usage.cache_read_input_tokens"),  # Anthropic message_start
        _at("usage.input_tokens_details.cached_tokens"),  # Responses
        _at("response.usage.input_tokens_details.cached_tokens"),  # Responses stream
        _at("timings.cache_n"),  # llama.cpp, every build from b6602
        _at("prompt_eval_cached_count"),  # Ollama ≥0.33.3
    ),
    "completion_tokens": (
        _at("usage.completion_tokens"),
        _at("usage.output_tokens"),  # Anthropic (body, message_delta); Responses body
        _at("response.usage.output_tokens"),  # Responses stream
        # not message.usage.output_tokens: message_start's is a placeholder 0
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


def _below_envelope(path: tuple[str, ...]) -> str:
    i = 0
    while i < len(path) - 1 and path[i] in ENVELOPES:
        i += 1
    return path[i]


#: The keys any usage value hangs from, at the top or inside an envelope: a line carrying
#: usage holds one.
USAGE_KEYS: frozenset[str] = frozenset(
    _below_envelope(path)
    for fields in USAGE_FIELDS.values() for f in fields for path in (*f.paths, *f.plus)
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
    for path in f.plus:
        n = _number(obj, path)
        if n is not None:
            total += n
    if f.per_sec is not None:
        return total / f.per_sec
    if isinstance(total, float):
        return int(total) if total.is_integer() else None
    return total


def parse_usage(obj: Mapping[str, Any], *, embeddings: bool = False) -> Usage | None:
    """The usage in one decoded JSON object, or ``None``. ``embeddings``: an unreported
    completion count is 0 (embeddings generate nothing), not unknown."""
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


_USAGE_VALUES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Usage))


def merge_usage(earlier: Usage | None, later: Usage) -> Usage:
    """The usage of a reply that said ``earlier`` and then ``later``: each value from the later
    line where it says one, else from the earlier (Anthropic's ``message_delta`` from
    llama.cpp gives only the completion; the prompt came with ``message_start``)."""
    if earlier is None:
        return later
    values = {}
    for name in _USAGE_VALUES:
        v = getattr(later, name)
        values[name] = getattr(earlier, name) if v is None else v
    return Usage(**values)
