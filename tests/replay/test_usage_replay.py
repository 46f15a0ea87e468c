"""Layer 2: the stream tap and the usage field table replayed on every recorded reply
(``fixtures/<engine>/<version>/<state>/streams/``); spec §9 "Tap" (TestReplayUsage) and "Usage
on every stream" (TestTapStripReplaysRecordedStreams).

The expected values below were read by hand from the recorded bodies, not computed by the
code under test. Each is (prompt, cached, completion, prompt_eval_sec, load_sec) of the last
usage-bearing line, or ``None`` for a reply that carries no usage. Every recorded reply must
have a row here, so a new capture cannot go unchecked.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pharos.engine.capture import Capture, RecordedReply
from pharos.proxy.streamtap import StreamTap
from tests.support.captures import all_captures, capture_id

Row = tuple[int | None, int | None, int | None, float | None, float | None] | None

#: engine/version/state → reply name → expected usage.
EXPECTED: dict[str, dict[str, Row]] = {
    "llamacpp/b11312/idle": {
        # usage.* and timings (cache_n 0 + prompt_n 21, prompt_ms 0.781)
        "chat": (21, 0, 12, 0.781e-3, None),
        # no include_usage: no usage object, but timings on the finish chunk:
        # cache_n 20 + prompt_n 1, predicted_n 12, prompt_ms 0.27
        "chat_stream": (21, 20, 12, 0.27e-3, None),
        # usage chunk: cached_tokens 20; timings prompt_ms 0.25
        "chat_stream_usage": (21, 20, 12, 0.25e-3, None),
        "completion": (9, 0, 12, 0.36e-3, None),
        # usage and timings ride on the finish chunk (choices not empty): nothing to strip
        "completion_stream_usage": (9, 8, 12, 0.232e-3, None),
        "embeddings": None,  # 501: started without --embeddings
        # Anthropic: input_tokens 91 (uncached) + cache_read_input_tokens 1; no timings
        "messages": (92, 1, 12, None, None),
        # message_start: cache_read_input_tokens 91 + input_tokens 1 (output_tokens 0, not
        # read); message_delta: output_tokens 12 alone, so the prompt is message_start's
        "messages_stream": (92, 91, 12, None, None),
        # Responses: input_tokens 92 (whole prompt), input_tokens_details.cached_tokens 91;
        # no timings on the non-streamed body
        "responses": (92, 91, 12, None, None),
        # response.completed: response.usage as above, plus top-level timings (prompt_ms 0.294)
        "responses_stream": (92, 91, 12, 0.294e-3, None),
    },
    "vllm/0.32.0/idle": {
        "chat": (18, 0, 12, None, None),
        "chat_stream": None,  # recorded without include_usage: no usage at all
        "chat_stream_usage": (18, 0, 12, None, None),
        "completion": (8, 0, 12, None, None),
        "completion_stream_usage": (8, 0, 12, None, None),
        "embeddings": None,  # 404 {"detail":"Not Found"}
        # Anthropic: input_tokens 19 + cache_creation_input_tokens 64 + cache_read 0
        "messages": (83, 0, 12, None, None),
        # message_start: input_tokens 83 (no cache fields yet), output_tokens 0 (not read);
        # message_delta: input 19 + cache_creation 0 + cache_read 64, output 12
        "messages_stream": (83, 64, 12, None, None),
        # Responses: input_tokens 83, input_tokens_details.cached_tokens 64, output 12
        "responses": (83, 64, 12, None, None),
        # only response.completed carries response.usage (created/in_progress: null)
        "responses_stream": (83, 64, 12, None, None),
    },
    "sglang/0.5.23/busy": {
        "chat": (52, 51, 7, None, None),
        "chat_stream_usage": (52, 31, 7, None, None),
    },
    "mlx-lm/0.32.2/idle": {
        "chat": (52, 51, 7, None, None),
        "chat_stream_usage": (52, 38, 7, None, None),
    },
    "ollama/0.32.15/loaded": {
        # native: no cached count before 0.33.3; durations in ns
        "api_chat": (62, None, 7, 9_812_000e-9, 61_250_377e-9),
        "api_chat_stream": (38, None, 7, 36_118_000e-9, 58_920_419e-9),
        "api_generate_stream": (36, None, 21, 41_775_000e-9, 60_332_918e-9),
        # OpenAI compat: no prompt_tokens_details, no timings
        "v1_chat": (38, None, 7, None, None),
        "v1_chat_stream": None,  # recorded without include_usage
        "v1_chat_stream_usage": (38, None, 7, None, None),
        "v1_completions": (27, None, 16, None, None),
    },
    "ollama/0.33.3/loaded": {
        "api_chat": (62, 45, 7, 9_812_000e-9, 61_250_377e-9),
        "api_chat_stream": (38, 0, 7, 36_118_000e-9, 58_920_419e-9),
        "api_generate_stream": (36, 0, 21, 41_775_000e-9, 60_332_918e-9),
        "v1_chat": (38, 37, 7, None, None),
        "v1_chat_stream": None,
        "v1_chat_stream_usage": (38, 37, 7, None, None),
    },
}

REPLIES: list[tuple[Capture, RecordedReply]] = [
    (c, r) for c in all_captures() for r in c.replies
]
IDS = [f"{capture_id(c)}/{r.name}" for c, r in REPLIES]


def request(r: RecordedReply) -> dict[str, Any]:
    """The recorded request body."""
    obj = json.loads(r.request)
    assert isinstance(obj, dict)
    return obj


def asked_for_usage(r: RecordedReply) -> bool:
    """Whether the recorded request set stream_options.include_usage."""
    return bool((request(r).get("stream_options") or {}).get("include_usage"))


def is_chat_stream(r: RecordedReply) -> bool:
    """A streamed /v1/chat/completions reply (the only kind Pharos adds usage to)."""
    return r.path == "/v1/chat/completions" and bool(request(r).get("stream"))


def events(body: bytes) -> list[bytes]:
    """An SSE body split into its events (each without the blank line that ends it)."""
    assert body.endswith(b"\n\n")
    return body[:-2].split(b"\n\n")


def data(event: bytes) -> Any:
    """The decoded JSON of a single-line ``data:`` event, or None for others."""
    if not event.startswith(b"data: {"):
        return None
    return json.loads(event[len(b"data: "):])


def test_every_recorded_reply_has_an_expectation() -> None:
    """The table covers every recorded reply, and names none that is not recorded."""
    recorded = {(capture_id(c), r.name) for c, r in REPLIES}
    expected = {(cid, name) for cid, rows in EXPECTED.items() for name in rows}
    assert recorded == expected
    # every engine with recorded replies is covered, OpenAI-shaped and native alike
    assert {cid.split("/")[0] for cid, _ in recorded} >= {
        "llamacpp", "vllm", "sglang", "mlx-lm", "ollama"}


@pytest.mark.parametrize("capture,reply", REPLIES, ids=IDS)
def test_replay_usage(capture: Capture, reply: RecordedReply) -> None:
    """Without stripping, the tap passes the recorded body through byte-identical (fed whole
    and in 7-byte pieces) and reads the usage the table says."""
    want = EXPECTED.get(capture_id(capture), {}).get(reply.name, "missing")
    assert want != "missing", "add this reply to EXPECTED"
    body = reply.body
    for pieces in ([body], [body[i:i + 7] for i in range(0, len(body), 7)]):
        tap = StreamTap(embeddings=reply.path in ("/v1/embeddings", "/api/embed"))
        out = b"".join(tap.feed(p) for p in pieces) + tap.finish()
        assert out == body
        u = tap.usage
        if want is None:
            assert u is None
            continue
        assert u is not None
        assert (u.prompt_tokens, u.cached_tokens, u.completion_tokens) == want[:3]
        for got, sec in ((u.prompt_eval_sec, want[3]), (u.load_sec, want[4])):
            assert got == (None if sec is None else pytest.approx(sec, rel=1e-9))


STRIPPABLE = [(c, r) for c, r in REPLIES if is_chat_stream(r) and asked_for_usage(r)]


def test_every_engine_has_a_strippable_stream() -> None:
    """Each engine with recorded streams has a chat stream recorded with include_usage, so
    the strip test below covers every engine."""
    assert {c.engine for c, _ in STRIPPABLE} == {
        c.engine for c, r in REPLIES if is_chat_stream(r)}


@pytest.mark.parametrize(
    "capture,reply", STRIPPABLE, ids=[f"{capture_id(c)}/{r.name}" for c, r in STRIPPABLE]
)
def test_strip_replays_recorded_streams(capture: Capture, reply: RecordedReply) -> None:
    """Stripping a recorded include_usage chat stream removes exactly the usage-only event
    (its data line and blank line) and still reads the usage; what is left is what a client
    that did not ask for usage parses: every other event, in order, ending in [DONE]."""
    body = reply.body
    recorded = events(body)
    usage_only = [i for i, e in enumerate(recorded) if (data(e) or {}).get("choices") == []]
    assert len(usage_only) == 1, "one usage-only chunk per recorded stream"
    kept = recorded[: usage_only[0]] + recorded[usage_only[0] + 1:]

    tap = StreamTap(strip_usage_chunk=True)
    pieces = [body[i:i + 13] for i in range(0, len(body), 13)]
    out = b"".join(tap.feed(p) for p in pieces) + tap.finish()

    assert out == b"".join(e + b"\n\n" for e in kept)
    assert len(body) - len(out) == len(recorded[usage_only[0]]) + 2
    assert events(out)[-1] == b"data: [DONE]"
    for e in events(out):
        obj = data(e)
        assert obj is None or obj.get("choices"), "no chunk without choices is left"
    assert tap.usage is not None
    row = EXPECTED[capture_id(capture)][reply.name]
    assert row is not None
    assert tap.usage.prompt_tokens == row[0]
    assert tap.usage.completion_tokens == row[2]


def _choices(body: bytes) -> list[Any]:
    return [obj["choices"] for e in events(body) if (obj := data(e)) is not None]


def test_stripped_stream_matches_the_stream_recorded_without_usage() -> None:
    """Where an engine was recorded both with and without include_usage, the stripped stream
    carries the same chunks (the same choices, in order) as the one recorded without it."""
    compared = 0
    for c in all_captures():
        by_name = {r.name: r for r in c.replies}
        for r in c.replies:
            if not (is_chat_stream(r) and asked_for_usage(r)):
                continue
            plain = [o for o in c.replies if is_chat_stream(o) and not asked_for_usage(o)]
            if not plain:
                continue
            assert len(plain) == 1 and by_name[plain[0].name] is plain[0]
            tap = StreamTap(strip_usage_chunk=True)
            stripped = tap.feed(r.body) + tap.finish()
            assert _choices(stripped) == _choices(plain[0].body), capture_id(c)
            compared += 1
    assert compared >= 3  # llama.cpp, vLLM, Ollama 0.32.15 and 0.33.3


def test_vllm_stream_without_include_usage_carries_no_usage() -> None:
    """vLLM sends no usage on a chat stream unless asked (so Pharos must ask): the stream
    recorded without include_usage gives none, the one recorded with it does."""
    seen = 0
    for c in all_captures():
        if c.engine != "vllm":
            continue
        for r in c.replies:
            if not is_chat_stream(r):
                continue
            tap = StreamTap()
            tap.feed(r.body)
            tap.finish()
            if asked_for_usage(r):
                assert tap.usage is not None
            else:
                assert tap.usage is None
                assert b'"usage"' not in r.body
                seen += 1
    assert seen >= 1
