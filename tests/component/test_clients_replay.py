"""Layer 3: every committed client capture (tests/clients/<client>/<version>/calls.jsonl, what
a real client sent, recorded by test_clients.py or tests/clients/record_openwebui.py) replayed
byte for byte through Pharos in front of an Ollama-like double and llama.cpp's recorded
replies, with a key configured when the client sent one. Per call: the status the client got
when it was recorded (its routes are served, its key header accepted, its mistakes refused the
same way); every generation it sent is routed and metered; a streamed chat that did not ask for
usage gets none while Pharos meters it, one that asked keeps its usage chunk; and a turn that
extends an earlier turn's messages is predicted from that turn's prefix and sent to the same
engine (the prefix chain). A client quirk recorded once stays a test."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.web.http_headers import Headers

from pharos.config import Key
from pharos.prefix import BYTES_PER_TOKEN
from pharos.proxy.auth import digest
from pharos.proxy.done import Done
from pharos.proxy.parse import parse
from tests.support.fleet import start_fleet
from tests.support.recorded_engine import start_recorded_llamacpp
from tests.support.sink import KEY, OTHER_KEY, Call, all_captures, load

LLAMA = "llama3.2:3b"
SECRET = "phk-client-replay"
#: Routes whose replies carry usage Pharos meters (embeddings: the engines here refuse them).
#: Clients whose next turn repeats the earlier turn's messages as the engine's prompt has them
#: (Claude Code only once the prefix chain leaves out the cache_control marker it moves to
#: the newest message every turn): the next turn is predicted from the whole earlier turn.
WHOLE_TURN = frozenset({"claude-code"})
GENERATION = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/messages",
                        "/v1/responses", "/api/chat", "/api/generate"})


def headers_of(call: Call) -> Headers:
    """The call's headers with this test's key in place of ``<KEY>``, a wrong one in place of
    ``<OTHER-KEY>``."""
    h = Headers()
    for name, value in call.headers.items():
        if value == "<VALUE>":
            value = "pharos-replay"
        value = value.replace(KEY, SECRET).replace(OTHER_KEY, "phk-not-a-key")
        h.setRawHeaders(name.encode(), [value.encode("latin-1")])
    return h


def conversation(call: Call) -> tuple[str, list[Any]] | None:
    """(model and system prompt, each message's role and text) of a chat-like body; None for
    other calls."""
    doc = call.json()
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
        return None
    return json.dumps([doc.get("model"), text_of(doc.get("system"))]), \
        [(m.get("role"), text_of(m.get("content"))) if isinstance(m, dict) else m
         for m in doc["messages"]]


def text_of(content: Any) -> Any:
    """A message's text whether sent as a string or as a list of text blocks (a client may
    send the same message either way from one turn to the next: Claude Code moves its
    cache_control marker, so the block list of turn 1 is a string in turn 2)."""
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                         for b in content):
        return "".join(str(b.get("text")) for b in content)
    return content


def usage_lines(body: bytes) -> list[Any]:
    """The non-null ``usage`` values of an SSE stream's data lines."""
    found = []
    for line in body.splitlines():
        if line.startswith(b"data: {"):
            doc = json.loads(line[6:])
            if doc.get("usage"):
                found.append(doc["usage"])
    return found


async def replay(calls: list[Call]) -> list[tuple[Call, int, bytes, Done | None]]:
    """Each call through a fresh Pharos, in order: (call, status, body, its Done or None)."""
    # A capture recorded with a key replays against Pharos with keys; one recorded without
    # (Open WebUI's Ollama connection sends none) against Pharos without keys.
    keyed = any(KEY in v or OTHER_KEY in v for c in calls for v in c.headers.values())
    engine, url = start_recorded_llamacpp()
    fleet = await start_fleet([("ollama", {"loaded": [LLAMA]}, {"kind": "ollama"})],
                              extra=[url],
                              keys=(Key(name="team", sha256=digest(SECRET)),) if keyed else ())
    fleet.ports.append(engine)
    dones: dict[str, Done] = {}
    fleet.pharos.public.on_done.append(lambda d: dones.__setitem__(d.request_id, d))
    out = []
    try:
        for call in calls:
            uri = fleet.url + call.path + (f"?{call.query}" if call.query else "")
            response = await treq.request(call.method, uri, headers=headers_of(call),
                                          data=call.body.encode() or None, pool=fleet.pool)
            body = await response.content()
            rid = (response.headers.getRawHeaders(b"x-request-id") or [b""])[0].decode()
            out.append((call, response.code, body, dones.get(rid)))
    finally:
        await fleet.stop()
    return out


@pytest.mark.parametrize(("client", "version"), all_captures())
@pytest_twisted.ensureDeferred
async def test_capture_replays(client: str, version: str) -> None:
    """One client's capture through Pharos: statuses as recorded, generations routed and
    metered, usage chunks as the client asked, second turns follow their prefix."""
    calls = load(client, version)
    results = await replay(calls)
    chains = 0
    whole_turns = 0
    seen: list[tuple[str, list[Any], Done, Call]] = []
    for i, (call, status, body, done) in enumerate(results):
        where = f"{client} {version} call #{i} {call.method} {call.path}"
        assert status == call.status, f"{where}: {status} (recorded {call.status}): {body!r}"
        if call.path not in GENERATION or status != 200:
            continue
        assert done is not None and done.route == call.path, where
        assert done.target is not None and done.metered, f"{where}: {done}"
        assert done.prompt_tokens is not None, where
        doc = call.json()
        streamed = isinstance(doc, dict) and doc.get("stream") is True
        if call.path == "/v1/chat/completions" and streamed:
            asked = isinstance(doc.get("stream_options"), dict) and \
                doc["stream_options"].get("include_usage") is True
            assert ("usage", "client_asked" if asked else "pharos_asked") in done.decisions
            assert bool(usage_lines(body)) == asked, f"{where}: usage chunks as asked"
        convo = conversation(call)
        if convo is None:
            continue
        model, messages = convo
        extended = [(d, c) for m, msgs, d, c in seen
                    if m == model and len(msgs) < len(messages) and messages[:len(msgs)] == msgs]
        earlier = [d for d, _ in extended]
        if earlier:
            # A recorded engine reports the same cached tokens whatever it is sent, so it may
            # correct a prediction (wrong_prediction), which rightly drops it for the turns
            # after; the live engines and the doubles report what they hold.
            corrected = any(d.prefix == "wrong_prediction" for d in earlier)
            assert done.predicted_tokens > 0 or corrected, \
                f"{where}: the next turn was not predicted"
            chains += done.predicted_tokens > 0
            assert done.target == earlier[-1].target, f"{where}: left its prefix's engine"
            if client in WHOLE_TURN and not corrected:
                # The whole earlier turn is predicted, not the turn less its last message
                # (a prediction is capped at the request's own estimated prompt tokens).
                before = parse(extended[-1][1].body.encode(), call.path).chain
                now = parse(call.body.encode(), call.path)
                assert now.chain.keys[:len(before)] == before.keys, \
                    f"{where}: the earlier turn's chain is not a prefix of this one's"
                whole = min(before.total_bytes // BYTES_PER_TOKEN, now.prompt_tokens)
                assert done.predicted_tokens == whole, \
                    f"{where}: predicted {done.predicted_tokens} tokens, not the whole " \
                    f"earlier turn's {whole}"
                whole_turns += 1
        seen.append((model, messages, done, call))
    multi_turn = any(conversation(c) and len(conversation(c)[1]) > 1  # type: ignore[index]
                     for c in calls)
    assert chains or not multi_turn, f"{client}: no prefix chain checked"
    assert whole_turns or client not in WHOLE_TURN, f"{client}: no whole-turn prediction checked"


def test_every_driven_client_has_a_capture() -> None:
    """Each client test_clients.py drives, and Open WebUI's two connections (recorded by
    hand, docs/clients.rst), has at least one committed capture to replay."""
    clients = {c for c, _ in all_captures()}
    assert {"openai-python", "openai-node", "ollama-python", "ollama-js", "langchain-openai",
            "anthropic-python", "claude-code", "open-webui", "open-webui-ollama"} <= clients


def test_a_client_that_sends_something_else_fails_with_the_diff(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """compare() (what each client test fails with) names a field a new client version adds, a
    header it drops and a change of escaping; an installed version with no capture is named."""
    monkeypatch.delenv("PHAROS_RECORD_CLIENTS", raising=False)
    from dataclasses import replace

    from tests.support.sink import compare, versions

    (version,) = versions("openai-python")
    calls = load("openai-python", version)
    assert compare("openai-python", version, calls, "test") == ""
    i = next(n for n, c in enumerate(calls) if c.path == "/v1/chat/completions")
    doc = calls[i].json()
    changed = list(calls)
    changed[i] = replace(calls[i], body=json.dumps({**doc, "parallel_tool_calls": True}),
                         headers={k: v for k, v in calls[i].headers.items() if k != "accept"})
    diff = compare("openai-python", version, changed, "test")
    added = [line for line in diff.splitlines() if line.startswith("+ ")]
    assert any('"parallel_tool_calls": true' in line for line in added), diff
    assert "-  accept: application/json" in diff
    escaped = list(calls)
    escaped[i] = replace(calls[i], body=json.dumps({**doc, "messages": [
        {"role": "user", "content": "Grüße"}]}, ensure_ascii=True))
    raw = list(calls)
    raw[i] = replace(escaped[i], body=json.dumps(json.loads(escaped[i].body),
                                                 ensure_ascii=False))
    assert "unicode-escaped" in compare("openai-python", version, escaped, "test")
    assert "unicode-escaped" not in compare("openai-python", version, raw, "test")
    missing = compare("openai-python", "0.0.0-new", calls, "test")
    assert "no committed capture of openai-python 0.0.0-new" in missing and version in missing
