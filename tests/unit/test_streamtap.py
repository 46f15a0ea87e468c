"""Layer 1: the stream tap's line scanning (``pharos.proxy.streamtap``) and the usage field table
(``pharos.engine.usage``), on hand-made streams and on the recorded ones under any chunking."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import fields
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pharos.proxy.streamtap as tap_module
from pharos.engine.usage import (
    ENVELOPES,
    USAGE_FIELDS,
    USAGE_KEYS,
    Usage,
    merge_usage,
    parse_usage,
)
from pharos.proxy.streamtap import MAX_LINE, StreamTap
from tests.support.captures import all_captures, capture_id

RECORDED: list[tuple[str, bytes]] = [
    (f"{capture_id(c)}/{r.name}", r.body) for c in all_captures() for r in c.replies
]


def run(body: bytes | Iterable[bytes], *, strip: bool = False,
        embeddings: bool = False) -> tuple[bytes, Usage | None]:
    """Feed ``body`` (one chunk, or the given chunks) through a fresh tap: (output, usage)."""
    chunks = [body] if isinstance(body, bytes) else list(body)
    t = StreamTap(strip_usage_chunk=strip, embeddings=embeddings)
    out = b"".join(t.feed(c) for c in chunks) + t.finish()
    return out, t.usage


def cut(body: bytes, points: Iterable[int]) -> list[bytes]:
    """``body`` cut at the given offsets."""
    edges = [0, *sorted(set(points)), len(body)]
    return [body[a:b] for a, b in pairwise(edges)]


def sse(obj: dict[str, Any]) -> bytes:
    """One SSE event carrying ``obj`` compactly, as most engines write it."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def chunk(text: str | None = None, finish: str | None = None) -> dict[str, Any]:
    """A content (or finish) chunk of an OpenAI chat stream."""
    delta = {} if text is None else {"content": text}
    return {"id": "c1", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


USAGE_CHUNK = {"id": "c1", "object": "chat.completion.chunk", "choices": [],
               "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14,
                         "prompt_tokens_details": {"cached_tokens": 8}}}
USAGE = Usage(prompt_tokens=11, cached_tokens=8, completion_tokens=3)
HEAD = sse(chunk("Hel")) + sse(chunk("lo")) + sse(chunk(finish="stop"))
DONE = b"data: [DONE]\n\n"
STREAM = HEAD + sse(USAGE_CHUNK) + DONE


# --- parse_usage and the field table ------------------------------------------------------


def test_field_table_names_every_usage_value() -> None:
    """The field table is the one truth: it has an entry for each Usage field, no other, and
    its top-level keys are the ones the tap searches for before decoding."""
    assert set(USAGE_FIELDS) == {f.name for f in fields(Usage)}
    assert {"usage", "timings", "prompt_eval_count", "eval_count"} <= USAGE_KEYS
    # the envelopes are not markers: Ollama's content lines carry "message" (/api/chat) and
    # "response" (/api/generate), and must not be decoded
    assert not ENVELOPES & USAGE_KEYS


PLACES = [(name, f) for name, fs in USAGE_FIELDS.items() for f in fs]


@pytest.mark.parametrize("name,place", PLACES,
                         ids=[f"{n}:{'+'.join('.'.join(p) for p in f.paths)}" for n, f in PLACES])
def test_tap_reaches_every_place_of_the_table(name: str, place: Any) -> None:
    """Each place of the table, nested envelopes included (Anthropic's message.usage,
    Responses' response.usage), read alone from a data line: the tap's pre-decode search lets
    it through and the value comes out under its name."""
    root: dict[str, Any] = {"type": "x"}
    for i, path in enumerate(place.paths):
        cursor = root
        for key in path[:-1]:
            cursor = cursor.setdefault(key, {})
        cursor[path[-1]] = 3 + i
    got = run(sse(root) + DONE)[1]
    assert got is not None
    value = getattr(got, name)
    assert value is not None
    want = sum(3 + i for i in range(len(place.paths)))
    assert value == (want / place.per_sec if place.per_sec else want)


@pytest.mark.parametrize("key", sorted(USAGE_KEYS))
def test_tap_finds_every_key_of_the_table(key: str) -> None:
    """The tap's cheap pre-decode search, derived from the table, lets through a line whose
    only usage field is ``key`` (so no table entry is unreachable from a stream)."""
    leaf: dict[str, Any] = {
        "usage": {"prompt_tokens": 4},
        "timings": {"predicted_n": 4},
    }
    obj = {"done": True, key: leaf.get(key, 4)}
    body = json.dumps(obj).encode() + b"\n"
    assert parse_usage(obj) is not None
    assert run(body)[1] == parse_usage(obj)
    assert run(b"data: " + body + b"\n" + DONE)[1] == parse_usage(obj)


def test_parse_reads_openai_usage() -> None:
    """The OpenAI shape gives prompt, cached and completion counts and no timings."""
    assert parse_usage(USAGE_CHUNK) == USAGE


def test_parse_llamacpp_timings_add_the_cache_to_the_prompt() -> None:
    """llama.cpp's timings.prompt_n excludes the cached tokens: the prompt is prompt_n +
    cache_n, and prompt_ms is the prefill time in milliseconds."""
    obj = {"timings": {"cache_n": 20, "prompt_n": 1, "prompt_ms": 250.0, "predicted_n": 12}}
    assert parse_usage(obj) == Usage(21, 20, 12, 0.25, None)


def test_parse_prefers_usage_over_timings() -> None:
    """Newer names come first: usage.* wins over timings.* when both are there."""
    obj = {"usage": {"prompt_tokens": 30, "completion_tokens": 5,
                     "prompt_tokens_details": {"cached_tokens": 7}},
           "timings": {"cache_n": 1, "prompt_n": 1, "predicted_n": 1, "prompt_ms": 2.0}}
    assert parse_usage(obj) == Usage(30, 7, 5, 0.002, None)


def test_parse_ollama_native_final_line() -> None:
    """Ollama's final line: prompt_eval_count, prompt_eval_cached_count, eval_count and
    nanosecond durations."""
    obj = {"done": True, "load_duration": 2_000_000_000, "prompt_eval_count": 40,
           "prompt_eval_cached_count": 0, "prompt_eval_duration": 500_000_000,
           "eval_count": 9}
    assert parse_usage(obj) == Usage(40, 0, 9, 0.5, 2.0)


def test_parse_unknown_is_none_and_zero_stays_zero() -> None:
    """A value the engine did not send is None; a 0 it sent is 0; nulls, booleans, negative
    numbers and strings are not counts."""
    u = parse_usage({"usage": {"prompt_tokens": 0, "completion_tokens": None,
                               "prompt_tokens_details": None}})
    assert u == Usage(prompt_tokens=0)
    assert parse_usage({"usage": {"prompt_tokens": True, "completion_tokens": -1}}) is None
    assert parse_usage({"usage": {"prompt_tokens": "12"}}) is None


def test_parse_without_usage_is_none() -> None:
    """A line with no usage-bearing field gives None, not an all-unknown Usage."""
    assert parse_usage(chunk("x")) is None
    assert parse_usage({"usage": None}) is None
    assert parse_usage({"done": True, "done_reason": "load"}) is None


def test_parse_embeddings_completion_is_zero() -> None:
    """An embeddings reply generates nothing: with embeddings=True its completion count is 0,
    not unknown; without usage at all it stays None."""
    body = {"object": "list", "data": [], "usage": {"prompt_tokens": 3, "total_tokens": 3}}
    assert parse_usage(body) == Usage(prompt_tokens=3)
    assert parse_usage(body, embeddings=True) == Usage(prompt_tokens=3, completion_tokens=0)
    assert parse_usage({"prompt_eval_count": 4}, embeddings=True) == Usage(4, None, 0)
    assert parse_usage({"embeddings": []}, embeddings=True) is None


def test_parse_anthropic_prompt_adds_the_cache_reads_and_writes() -> None:
    """Anthropic's input_tokens leaves out the cache: the prompt is input_tokens plus
    cache_read_input_tokens plus cache_creation_input_tokens, each only when sent; the cached
    part is cache_read_input_tokens; output_tokens is the completion."""
    full = {"usage": {"input_tokens": 19, "output_tokens": 12,
                      "cache_creation_input_tokens": 4, "cache_read_input_tokens": 60}}
    assert parse_usage(full) == Usage(83, 60, 12)
    reads = {"usage": {"cache_read_input_tokens": 20, "input_tokens": 1, "output_tokens": 12}}
    assert parse_usage(reads) == Usage(21, 20, 12)
    # vLLM without --enable-prompt-tokens-details: no cache fields, input_tokens is the prompt
    bare = {"usage": {"input_tokens": 83, "output_tokens": 12}}
    assert parse_usage(bare) == Usage(83, None, 12)
    # a null cache field is not a count: left out of the sum, and the cached part unknown
    nulls = {"usage": {"input_tokens": 83, "output_tokens": 1,
                       "cache_read_input_tokens": None, "cache_creation_input_tokens": None}}
    assert parse_usage(nulls) == Usage(83, None, 1)


def test_parse_anthropic_message_start_gives_no_completion() -> None:
    """message_start's message.usage gives the prompt and cached counts; its output_tokens
    is a placeholder (0) and stays unknown, so a stream cut before message_delta is never
    metered as 0 completion tokens."""
    start = {"type": "message_start",
             "message": {"id": "m", "usage": {"cache_read_input_tokens": 20,
                                              "input_tokens": 1, "output_tokens": 0}}}
    assert parse_usage(start) == Usage(21, 20, None)


def test_parse_responses_usage() -> None:
    """The Responses API: input_tokens is the whole prompt, input_tokens_details.cached_tokens
    the cached part, output_tokens the completion; in a stream, response.usage of
    response.completed, while the earlier events' "usage": null gives nothing."""
    usage = {"input_tokens": 83, "output_tokens": 12, "total_tokens": 95,
             "input_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 0}}
    assert parse_usage({"object": "response", "usage": usage}) == Usage(83, 64, 12)
    done = {"type": "response.completed", "response": {"object": "response", "usage": usage}}
    assert parse_usage(done) == Usage(83, 64, 12)
    created = {"type": "response.created", "response": {"max_output_tokens": 12, "usage": None}}
    assert parse_usage(created) is None


def test_merge_usage_keeps_what_a_later_line_does_not_say() -> None:
    """A later line's values win; values it leaves unknown keep the earlier line's; a 0 is a
    value, not unknown."""
    start = Usage(prompt_tokens=21, cached_tokens=20, completion_tokens=None)
    delta = Usage(completion_tokens=12)
    assert merge_usage(None, delta) == delta
    assert merge_usage(start, delta) == Usage(21, 20, 12)
    assert merge_usage(Usage(9, 9, 9, 1.0, 2.0), Usage(0, 0, 0)) == Usage(0, 0, 0, 1.0, 2.0)


def anthropic_event(event: str, obj: dict[str, Any]) -> bytes:
    """One Anthropic SSE event: an event line and a data line."""
    return f"event: {event}\n".encode() + sse({"type": event, **obj})


ANTHROPIC_HEAD = anthropic_event(
    "message_start",
    {"message": {"id": "m", "type": "message", "role": "assistant", "content": [],
                 "usage": {"cache_read_input_tokens": 20, "input_tokens": 1,
                           "output_tokens": 0}}},
) + anthropic_event(
    "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}},
) + anthropic_event(
    "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "usage"}},
)
ANTHROPIC_TAIL = anthropic_event("content_block_stop", {"index": 0}) + anthropic_event(
    "message_delta",
    {"delta": {"stop_reason": "max_tokens", "stop_sequence": None},
     "usage": {"output_tokens": 12}},
) + anthropic_event("message_stop", {})


def test_anthropic_stream_takes_the_prompt_from_start_and_completion_from_delta() -> None:
    """An Anthropic stream whose message_delta says only output_tokens (llama.cpp) gives the
    prompt and cached counts of message_start and the completion of message_delta; cut
    before message_delta it gives no completion count (unknown, not 0)."""
    body = ANTHROPIC_HEAD + ANTHROPIC_TAIL
    assert run(body) == (body, Usage(21, 20, 12))
    assert run(cut(body, range(0, len(body), 5))) == (body, Usage(21, 20, 12))
    assert run(ANTHROPIC_HEAD)[1] == Usage(21, 20, None)


def test_only_usage_bearing_events_are_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Anthropic and Responses streams cost a decode only on the events that carry
    usage: message_start and message_delta; response.completed (response.created says
    "usage": null)."""
    calls: list[bytes] = []
    real = tap_module._decode

    def counting(payload: bytes) -> dict[str, Any] | None:
        calls.append(payload)
        return real(payload)

    monkeypatch.setattr(tap_module, "_decode", counting)
    run(ANTHROPIC_HEAD + ANTHROPIC_TAIL)
    assert [json.loads(c)["type"] for c in calls] == ["message_start", "message_delta"]
    calls.clear()
    response = {"id": "r", "object": "response", "status": "in_progress", "usage": None}
    usage = {"input_tokens": 5, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 0}}
    body = (b"event: response.created\n" + sse({"type": "response.created", "response": response})
            + b"event: response.output_text.delta\n"
            + sse({"type": "response.output_text.delta", "delta": "usage"})
            + b"event: response.completed\n"
            + sse({"type": "response.completed",
                   "response": {**response, "status": "completed", "usage": usage}}))
    assert run(body)[1] == Usage(5, 0, 2)
    assert [json.loads(c)["type"] for c in calls] == ["response.completed"]


# --- pass-through and chunking ------------------------------------------------------------


def test_without_stripping_every_chunk_passes_as_is() -> None:
    """Without stripping, feed returns the very chunk it was given (no copy, no delay)."""
    t = StreamTap()
    for piece in cut(STREAM, [3, 50, 51, 200]):
        assert t.feed(piece) is piece
    assert t.finish() == b""
    assert t.usage == USAGE


@pytest.mark.parametrize("name,body", RECORDED, ids=[n for n, _ in RECORDED])
def test_every_split_point_of_a_recorded_reply(name: str, body: bytes) -> None:
    """Cutting a recorded reply in two at any byte, or feeding it byte by byte, changes
    neither the output (with and without stripping) nor the usage."""
    for strip in (False, True):
        whole = run(body, strip=strip)
        if not strip:
            assert whole[0] == body
        for i in range(len(body) + 1):
            assert run(cut(body, [i]), strip=strip) == whole, (strip, i)
        assert run([body[i:i + 1] for i in range(len(body))], strip=strip) == whole


@st.composite
def chunked_replies(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    """A recorded reply and an arbitrary chunking of it."""
    _, body = draw(st.sampled_from(RECORDED))
    points = draw(st.lists(st.integers(0, len(body)), max_size=40))
    return body, cut(body, points)


@given(chunked_replies(), st.booleans())
def test_any_chunking_gives_the_same_output_and_usage(
    reply: tuple[bytes, list[bytes]], strip: bool
) -> None:
    """Any chunking of any recorded reply gives the output and usage of the unchunked body;
    without stripping that output is the body itself."""
    body, pieces = reply
    assert run(pieces, strip=strip) == run(body, strip=strip)
    if not strip:
        assert run(pieces)[0] == body


@given(st.lists(st.integers(0, len(STREAM)), max_size=30))
def test_any_chunking_of_crlf_stream_strips_the_same(points: list[int]) -> None:
    """A CRLF stream cut anywhere (even between \\r and \\n) strips the same bytes."""
    body = STREAM.replace(b"\n", b"\r\n")
    assert run(cut(body, points), strip=True) == run(body, strip=True)


# --- framing -------------------------------------------------------------------------------


def test_crlf_lines() -> None:
    """CRLF line ends: passed byte-identical, usage read, and stripping drops the usage line
    and its blank CRLF line only."""
    body = STREAM.replace(b"\n", b"\r\n")
    assert run(body) == (body, USAGE)
    want = HEAD.replace(b"\n", b"\r\n") + b"data: [DONE]\r\n\r\n"
    assert run(body, strip=True) == (want, USAGE)


def test_comment_lines_pass() -> None:
    """SSE comments (llama.cpp's ':' pings, vLLM's ': keep-alive', mlx-lm's ': keepalive
    n/m') pass through, stripping or not, and do not disturb the usage."""
    pings = b":\n\n: keep-alive\n\n: keepalive 1/2\n\n"
    body = pings + HEAD + pings + sse(USAGE_CHUNK) + pings + DONE
    assert run(body) == (body, USAGE)
    assert run(body, strip=True) == (pings + HEAD + pings + pings + DONE, USAGE)


def test_last_usage_line_wins() -> None:
    """With usage on every chunk (vLLM continuous_usage_stats), the last one counts."""
    body = b"".join(
        sse({**chunk(str(i)), "usage": {"prompt_tokens": 5, "completion_tokens": i}})
        for i in range(1, 4)
    ) + DONE
    assert run(body)[1] == Usage(prompt_tokens=5, completion_tokens=3)


def test_null_usage_is_not_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines that cannot carry usage (content chunks, "usage":null on every chunk as SGLang
    sends it, [DONE], comments) are never JSON-decoded: only the usage chunk is."""
    calls: list[bytes] = []
    real = tap_module._decode

    def counting(payload: bytes) -> dict[str, Any] | None:
        calls.append(payload)
        return real(payload)

    monkeypatch.setattr(tap_module, "_decode", counting)
    body = b"".join(sse({**chunk(t), "usage": None}) for t in ("a", "b")) + b": x\n\n"
    body += sse(USAGE_CHUNK) + DONE
    assert run(body, strip=True)[1] == USAGE
    assert len(calls) == 1


def test_usage_as_a_string_value_is_not_a_key() -> None:
    """Model output that says "usage" or "timings" is text, not a usage field."""
    body = sse(chunk('"usage": {"prompt_tokens": 1}')) + sse(chunk("usage")) + DONE
    assert run(body, strip=True) == (body, None)


def test_broken_json_with_usage_marker_is_ignored() -> None:
    """A line that looks usage-bearing but is not valid JSON is passed and ignored."""
    body = b'data: {"usage": {"prompt_tokens": 1\n\ndata: {"choices":[], "usage": 3\n\n' + DONE
    assert run(body, strip=True) == (body, None)


def test_ndjson_stream() -> None:
    """Ollama's NDJSON: usage comes from the final done line, under any chunking, and a
    mid-stream error line passes."""
    lines = [
        {"model": "m", "message": {"role": "assistant", "content": "Hi"}, "done": False},
        {"error": "something"},
        {"model": "m", "message": {"role": "assistant", "content": ""}, "done": True,
         "total_duration": 9, "load_duration": 1_000_000, "prompt_eval_count": 12,
         "prompt_eval_duration": 3_000_000, "eval_count": 2, "eval_duration": 5},
    ]
    body = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    want = Usage(12, None, 2, 0.003, 0.001)
    assert run(body) == (body, want)
    assert run([body[i:i + 5] for i in range(0, len(body), 5)]) == (body, want)


# --- non-streamed bodies ---------------------------------------------------------------------


def test_one_line_body_without_newline() -> None:
    """A non-streamed body with no final newline (gin's c.JSON) is parsed at finish."""
    body = json.dumps({"done": True, "prompt_eval_count": 7, "eval_count": 1}).encode()
    t = StreamTap()
    assert t.feed(body[:10]) == body[:10]
    assert t.feed(body[10:]) == body[10:]
    assert t.usage is None
    assert t.finish() == b""
    assert t.usage == Usage(prompt_tokens=7, completion_tokens=1)


def test_pretty_printed_body_is_parsed_whole() -> None:
    """A multi-line (indented) JSON body within the limit is decoded whole at finish."""
    body = json.dumps({"choices": [{"index": 0}], "usage": USAGE_CHUNK["usage"]},
                      indent=2).encode() + b"\n"
    assert run(cut(body, range(0, len(body), 17))) == (body, USAGE)


def test_pretty_printed_body_over_the_limit_gives_no_usage() -> None:
    """A multi-line JSON body over the limit is not kept, so it gives no usage."""
    body = json.dumps({"data": ["x" * 100] * (MAX_LINE // 100),
                       "usage": USAGE_CHUNK["usage"]}, indent=1).encode()
    assert len(body) > MAX_LINE
    assert run(cut(body, range(0, len(body), 4096))) == (body, None)


def test_embeddings_body() -> None:
    """A small embeddings body read with embeddings=True has completion 0."""
    body = json.dumps({"object": "list", "data": [{"embedding": [0.1, 0.2]}],
                       "usage": {"prompt_tokens": 3, "total_tokens": 3}}).encode()
    assert run(body, embeddings=True) == (body, Usage(3, None, 0))


# --- the line limit --------------------------------------------------------------------------


def padded_usage_line(length: int) -> bytes:
    """A usage chunk's data line, newline excluded, padded to exactly ``length`` bytes."""
    base = b"data: " + json.dumps({**USAGE_CHUNK, "pad": ""},
                                  separators=(",", ":")).encode()
    line = base[:-2] + b"x" * (length - len(base)) + b'"}'
    assert len(line) == length
    return line


def pieces_of(body: bytes, size: int) -> list[bytes]:
    """``body`` in pieces of ``size`` bytes (0: whole)."""
    return cut(body, range(0, len(body), size)) if size else [body]


@pytest.mark.parametrize("size", [0, 1000])
@pytest.mark.parametrize("strip", [False, True])
def test_line_of_exactly_the_limit_is_parsed(strip: bool, size: int) -> None:
    """A line of MAX_LINE bytes (without its newline) is still parsed (and stripped), within
    one chunk or across many."""
    body = HEAD + padded_usage_line(MAX_LINE) + b"\n\n" + DONE
    out, usage = run(pieces_of(body, size), strip=strip)
    assert usage == USAGE
    assert out == (HEAD + DONE if strip else body)


@pytest.mark.parametrize("size", [0, 1000])
@pytest.mark.parametrize("strip", [False, True])
def test_longer_line_passes_unparsed(strip: bool, size: int) -> None:
    """A line one byte over the limit passes through whole and unparsed (so it is neither
    counted nor stripped), within one chunk or across many, and the tap reads the lines
    after it again."""
    long = padded_usage_line(MAX_LINE + 1) + b"\n\n"
    body = HEAD + long + DONE
    assert run(pieces_of(body, size), strip=strip) == (body, None)
    after = body.replace(DONE, sse(USAGE_CHUNK) + DONE)
    want = after if not strip else HEAD + long + DONE
    assert run(pieces_of(after, size and size - 1), strip=strip) == (want, USAGE)


def test_long_line_is_not_held_back_when_stripping() -> None:
    """Stripping holds a partial line only up to the limit: past it, bytes flow at once."""
    t = StreamTap(strip_usage_chunk=True)
    line = b"data: " + b"x" * (3 * MAX_LINE)
    passed = b"".join(t.feed(line[i:i + 1024]) for i in range(0, len(line), 1024))
    assert len(line) - len(passed) <= MAX_LINE
    assert passed + t.feed(b"\n\n") + t.finish() == line + b"\n\n"


def test_huge_one_line_body_gives_no_usage() -> None:
    """A one-line non-streamed reply over the limit (say, a big embedding) gives no usage."""
    body = json.dumps({"data": [{"embedding": [0.123456789] * 10_000}],
                       "usage": {"prompt_tokens": 3, "total_tokens": 3}}).encode()
    assert len(body) > MAX_LINE
    assert run(cut(body, range(0, len(body), 8192)), embeddings=True) == (body, None)


# --- stripping -------------------------------------------------------------------------------


def test_strip_removes_exactly_the_usage_chunk() -> None:
    """Stripping drops the choices:[] data line and its blank line, nothing else, and the
    usage is still read."""
    assert run(STREAM, strip=True) == (HEAD + DONE, USAGE)
    assert run(STREAM) == (STREAM, USAGE)


def test_strip_holds_a_partial_line_until_its_newline() -> None:
    """When stripping, a partial line is held back and released whole at its newline, or at
    finish if the body ends without one."""
    t = StreamTap(strip_usage_chunk=True)
    first = sse(chunk("Hel"))
    assert t.feed(first[:10]) == b""
    assert t.feed(first[10:]) == first
    assert t.feed(b"data: [DO") == b""
    assert t.finish() == b"data: [DO"


def test_strip_keeps_the_line_after_the_usage_chunk_when_not_blank() -> None:
    """Only a blank line right after the usage chunk goes with it: a following non-blank
    line (an event with no separator) stays."""
    usage_line = sse(USAGE_CHUNK)[:-1]  # no blank line after it
    body = HEAD + usage_line + DONE
    assert run(body, strip=True) == (HEAD + DONE, USAGE)


def test_strip_leaves_chunks_with_choices() -> None:
    """A chunk carrying usage alongside non-empty choices (llama.cpp /v1/completions, vLLM
    continuous usage) is not the usage-only chunk and stays."""
    body = sse({**chunk("x", "stop"), "usage": USAGE_CHUNK["usage"]}) + DONE
    assert run(body, strip=True) == (body, USAGE)


def test_strip_with_python_separators() -> None:
    """mlx-lm writes JSON with ', ' and ': ' separators; its usage chunk is still found."""
    line = b"data: " + json.dumps(USAGE_CHUNK).encode() + b"\n\n"
    assert b'"choices": []' in line
    assert run(HEAD + line + DONE, strip=True) == (HEAD + DONE, USAGE)


def test_strip_ignores_ndjson() -> None:
    """Stripping touches SSE data lines only: an NDJSON line with choices:[] stays."""
    body = json.dumps(USAGE_CHUNK, separators=(",", ":")).encode() + b"\n"
    assert run(body, strip=True) == (body, USAGE)


@pytest.mark.parametrize("body", [
    STREAM,
    b'{"done":false}\n{"done":false}\n',
    b'  \n{"done":false}\n',
], ids=["sse", "ndjson", "ndjson-after-blank"])
def test_streams_are_not_kept_whole(body: bytes) -> None:
    """Only a body that may be one multi-line JSON object is kept for a decode at finish: an
    SSE stream, or an NDJSON stream once its first line is a whole object, is not (memory
    per stream stays a partial line)."""
    t = StreamTap()
    t.feed(body)
    assert t._body is None
