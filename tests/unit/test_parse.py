"""Layer 1: reading a client's request body (spec §9 Parse)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pharos.proxy.errors import ApiError
from pharos.proxy.parse import parse


def test_chat_prompt_size_counts_decoded_text() -> None:
    """An escaped and a UTF-8 body are the same prompt: 4 bytes of decoded text a token."""
    text = "Привет, мир" * 10
    utf8 = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]},
                      ensure_ascii=False).encode()
    escaped = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}
                         ).encode()
    a, b = parse(utf8, "/v1/chat/completions"), parse(escaped, "/v1/chat/completions")
    assert a.prompt_tokens == b.prompt_tokens == (len(text.encode()) + 3) // 4


def test_content_parts_tools_and_prompt_count() -> None:
    """Text parts, tools and completion prompts all count; non-string content routes too."""
    body = {"model": "m", "tools": [{"type": "function", "function": {"name": "f"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "abcd"},
                                                        {"type": "image_url",
                                                         "image_url": {"url": "x"}}]}]}
    p = parse(json.dumps(body).encode(), "/v1/chat/completions")
    assert p.prompt_tokens > 1
    p = parse(b'{"model":"m","prompt":"abcdefgh"}', "/v1/completions")
    assert p.prompt_tokens == 2


def test_a_system_prompt_or_instructions_count_toward_the_prompt() -> None:
    """Anthropic's ``system`` field (a string or text blocks) and a Responses request's
    ``instructions`` head the prompt, so they count in its size (Claude Code's system prompt
    was left out: 10,463 estimated tokens for a 47,768-byte chain)."""
    system = "s" * 400
    for value in (system, [{"type": "text", "text": system, "cache_control": {"type": "x"}}]):
        body = {"model": "m", "max_tokens": 8, "system": value,
                "messages": [{"role": "user", "content": "abcd"}]}
        assert parse(json.dumps(body).encode(), "/v1/messages").prompt_tokens == 101
    body2 = {"model": "m", "instructions": system, "input": "abcd"}
    assert parse(json.dumps(body2).encode(), "/v1/responses").prompt_tokens == 101
    # Elsewhere a field named system is not prompt text.
    body3 = {"model": "m", "system": system, "messages": [{"role": "user", "content": "abcd"}]}
    assert parse(json.dumps(body3).encode(), "/v1/chat/completions").prompt_tokens == 1


def test_streamed_chat_gets_include_usage_keeping_other_options() -> None:
    """A streamed chat that did not ask for usage gets it, other stream options kept."""
    raw = b'{"model":"m","stream":true,"stream_options":{"x":1},"messages":[]}'
    p = parse(raw, "/v1/chat/completions")
    assert p.pharos_asked_usage
    sent = json.loads(p.forward_body("m"))
    assert sent["stream_options"] == {"x": 1, "include_usage": True}


def test_client_that_asked_for_usage_is_forwarded_untouched() -> None:
    """A client that asked for usage (or does not stream) gets its body forwarded as sent."""
    raw = b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}'
    p = parse(raw, "/v1/chat/completions")
    assert not p.pharos_asked_usage
    assert p.forward_body("m") == raw
    assert parse(b'{"model":"m"}', "/v1/chat/completions").forward_body("m") == b'{"model":"m"}'


def test_alias_rewrites_the_model_for_the_engine() -> None:
    """Only the body sent to the engine names the engine's model."""
    p = parse(b'{"model":"small","messages":[]}', "/v1/chat/completions")
    assert json.loads(p.forward_body("qwen2.5:3b-instruct"))["model"] == "qwen2.5:3b-instruct"


def test_ollama_streams_by_default_and_control_requests() -> None:
    """Ollama's native routes stream unless told not to; no messages/prompt is a control."""
    assert parse(b'{"model":"m","messages":[{"role":"user","content":"x"}]}', "/api/chat").stream
    assert not parse(b'{"model":"m","stream":false}', "/api/chat").stream
    assert parse(b'{"model":"m"}', "/api/chat").control
    assert parse(b'{"model":"m","prompt":""}', "/api/generate").control
    assert not parse(b'{"model":"m","prompt":"x"}', "/api/generate").control


@pytest.mark.parametrize(("raw", "status", "code"), [
    (b"{bad", 400, "invalid_json"),
    (b"[1,2]", 400, "invalid_json"),
    (b'{"messages":[]}', 400, "missing_required_parameter"),
    (b'{"model":""}', 400, "missing_required_parameter"),
    (b"\xff\xfe", 400, "invalid_json"),
])
def test_bad_bodies_are_4xx(raw: bytes, status: int, code: str) -> None:
    """Malformed JSON or a missing model is a clear 400, never a 500."""
    with pytest.raises(ApiError) as e:
        parse(raw, "/v1/chat/completions")
    assert (e.value.status, e.value.code) == (status, code)
    assert json.loads(e.value.body(ollama=False))["error"]["code"] == code
    assert isinstance(json.loads(e.value.body(ollama=True))["error"], str)


def test_include_usage_inserted_without_reencoding() -> None:
    """The option is inserted into the client's bytes: escapes and key order survive, and the
    result is the same JSON as a re-encode would give."""
    raw = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"\\u00e9"}]} \n'
    p = parse(raw, "/v1/chat/completions")
    sent = p.forward_body("m")
    assert sent.startswith(b'{"model":"m","stream":true,"messages":[{"role":"user","content":'
                           b'"\\u00e9"}]')
    assert json.loads(sent) == {**json.loads(raw), "stream_options": {"include_usage": True}}
    assert json.loads(p.forward_body("engine-name"))["model"] == "engine-name"


def test_chain_follows_chat_and_prompts_and_says_why_not() -> None:
    """Chat routes and prompt routes get a chain; an escaped and a UTF-8 body give the same
    one; a body the index cannot follow says why; embeddings and control requests have none."""
    import json as _json

    from pharos.proxy.parse import parse as _parse

    body = {"model": "m", "messages": [{"role": "system", "content": "Лоцман " * 50},
                                       {"role": "user", "content": "q"}]}
    escaped = _parse(_json.dumps(body, ensure_ascii=True).encode(), "/v1/chat/completions")
    plain = _parse(_json.dumps(body, ensure_ascii=False).encode(), "/v1/chat/completions")
    assert len(escaped.chain) == 2 and escaped.chain == plain.chain
    prompt = _parse(b'{"model":"m","prompt":"' + b"x" * 3000 + b'"}', "/v1/completions")
    assert len(prompt.chain) == 3 and prompt.unfollowed is None
    batch = _parse(b'{"model":"m","prompt":["a","b"]}', "/v1/completions")
    assert not batch.chain and batch.unfollowed == "batch_prompt"
    empty = _parse(b'{"model":"m","messages":[]}', "/v1/chat/completions")
    assert empty.unfollowed == "no_messages"
    embed = _parse(b'{"model":"m","input":"hi"}', "/v1/embeddings")
    assert not embed.chain and embed.unfollowed is None
    control = _parse(b'{"model":"m"}', "/api/generate")
    assert control.control and control.unfollowed is None
    user = _parse(b'{"model":"m","messages":[{"role":"user","content":"q"}],"user":"u7"}',
                  "/v1/chat/completions")
    assert user.user == "u7"


def test_anthropic_system_heads_the_chain() -> None:
    """On /v1/messages the separate system field is part of the chain: a different system
    prompt gives a different first link."""
    from pharos.proxy.parse import parse as _parse

    a = _parse(b'{"model":"m","system":"A","messages":[{"role":"user","content":"q"}]}',
               "/v1/messages")
    b = _parse(b'{"model":"m","system":"B","messages":[{"role":"user","content":"q"}]}',
               "/v1/messages")
    assert len(a.chain) == 2 and a.chain.keys[0] != b.chain.keys[0]


def test_deep_nesting_is_a_400_not_a_recursion_error() -> None:
    """Valid JSON nested 950 deep (a RecursionError and a 500 before), and 129 deep (past the
    bound, parseable), are both 400 invalid_json naming the bound; 128 deep is accepted."""
    for depth in (950, 129, 20_000):
        raw = b'{"model":"m","x":' + b"[" * depth + b"]" * depth + b"}"
        with pytest.raises(ApiError) as e:
            parse(raw, "/v1/chat/completions")
        assert e.value.status == 400 and "128" in e.value.message, depth
    raw = b'{"model":"m","x":' + b"[" * 127 + b"]" * 127 + b"}"
    assert parse(raw, "/v1/chat/completions").model == "m"


def test_a_long_model_name_is_cut_in_errors() -> None:
    """An unknown 1 MB model name is not echoed back whole."""
    from pharos.proxy.errors import unknown_model

    e = unknown_model("x" * 1_000_000)
    assert len(e.body(ollama=False)) < 1000
    assert "1000000 chars" in e.message


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=12)
FIELDS = ("model", "messages", "prompt", "stream", "stream_options", "tools", "input", "user",
          "system", "content", "role")


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=6),
       st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/messages",
                        "/v1/embeddings", "/api/chat", "/api/generate", "/api/embed"]))
def test_wrong_types_anywhere_are_a_4xx_or_parse(doc: dict[str, object], path: str) -> None:
    """Any JSON value in any field the parser reads: it parses, or it is a 4xx ApiError;
    never another exception (a 500)."""
    try:
        parsed = parse(json.dumps(doc).encode(), path)
    except ApiError as e:
        assert 400 <= e.status < 500
    else:
        assert isinstance(parsed.model, str) and parsed.model
        parsed.forward_body(parsed.model)
