"""Layer 1: the Responses conversation store (``pharos.responses``) and the request side
(``pharos.proxy.conversation``): encryption round trip, tampering and misplaced blobs read as
absent, retention by count and age (oldest first) and size, tenant scoping, the key file's
checks, the ``responses:`` config section, the expansion of ``previous_response_id`` and the
capture of a reply (plain, streamed, cut, over the cap)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.task import Clock

from pharos.config import ConfigError, load_config, parse_config
from pharos.proxy.auth import Identity
from pharos.proxy.conversation import Capture, ConversationState, Turn
from pharos.proxy.errors import ApiError
from pharos.proxy.streamtap import StreamTap
from pharos.responses import ConversationStore, read_key

KEY = bytes(range(32))
ITEMS: list[Any] = [{"role": "user", "content": "the secret plan"},
                    {"type": "message", "role": "assistant",
                     "content": [{"type": "output_text", "text": "noted"}]}]
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def store(clock: Clock | None = None, **kw: Any) -> ConversationStore:
    clock = clock or Clock()
    opts = {"max_responses": 100, "max_age": 3600.0, "max_bytes": 1 << 20, **kw}
    return ConversationStore(KEY, clock.seconds, **opts)


def who(tenant: str) -> Identity:
    return Identity(name=f"key-{tenant}", tenant=tenant)


def test_round_trip_and_ciphertext() -> None:
    """What is put comes back equal, and the blob held does not contain the text."""
    s = store()
    assert s.put("t1", "resp_a", ITEMS)
    assert s.get("t1", "resp_a") == ITEMS
    assert b"secret plan" not in s._blob("t1", "resp_a")
    assert s.stats().held == 1 and s.stats().bytes > 0


def test_tampered_blob_reads_as_absent() -> None:
    """A flipped bit in the ciphertext fails authentication: the record reads as absent
    and the rejection is counted."""
    s = store()
    s.put("t1", "resp_a", ITEMS)
    blob = bytearray(s._blob("t1", "resp_a"))
    blob[20] ^= 1
    s._replace_blob("t1", "resp_a", bytes(blob))
    assert s.get("t1", "resp_a") is None
    assert s.stats().rejected == 1


def test_blob_moved_to_another_tenant_or_id_fails() -> None:
    """The tenant and id are bound to the blob: copied to another tenant's or id's place it
    does not decrypt (a forged record cannot be made from a real one)."""
    s = store()
    s.put("t1", "resp_a", ITEMS)
    s.put("t2", "resp_b", [{"role": "user", "content": "other"}])
    s._replace_blob("t2", "resp_b", s._blob("t1", "resp_a"))
    assert s.get("t2", "resp_b") is None
    s.put("t1", "resp_c", [])
    s._replace_blob("t1", "resp_c", s._blob("t1", "resp_a"))
    assert s.get("t1", "resp_c") is None
    assert s.get("t1", "resp_a") == ITEMS


def test_tenant_scoping() -> None:
    """An id stored for one tenant is absent for another, exactly as an id never stored."""
    s = store()
    s.put("t1", "resp_a", ITEMS)
    assert s.get("t2", "resp_a") is None
    assert s.get("t2", "resp_zz") is None


def test_retention_by_count_drops_oldest_first() -> None:
    """Past max_responses the oldest record goes first."""
    clock = Clock()
    s = store(clock, max_responses=2)
    for i in range(3):
        clock.advance(1)
        s.put("t", f"r{i}", [i])
    assert s.get("t", "r0") is None
    assert s.get("t", "r1") == [1] and s.get("t", "r2") == [2]
    assert s.stats().evicted == 1 and len(s) == 2


def test_retention_by_age() -> None:
    """A record older than max_age is gone (dropped when the store is next touched)."""
    clock = Clock()
    s = store(clock, max_age=60.0)
    s.put("t", "old", [1])
    clock.advance(30)
    s.put("t", "young", [2])
    clock.advance(31)
    assert s.get("t", "old") is None
    assert s.get("t", "young") == [2]
    assert s.stats().expired == 1


def test_over_the_size_cap_is_not_stored() -> None:
    """A conversation over max_bytes (plaintext JSON) is not stored at all."""
    s = store(max_bytes=50)
    assert not s.put("t", "big", [{"content": "x" * 100}])
    assert s.get("t", "big") is None and s.stats().too_large == 1


def test_repeated_id_drops_both() -> None:
    """An engine that repeats an id: the held record is dropped and the new one not stored
    (either would answer for the other conversation)."""
    s = store()
    assert s.put("t", "same", [1])
    assert not s.put("t", "same", [2])
    assert s.get("t", "same") is None


def test_key_file_forms(tmp_path: Path) -> None:
    """The key is 32 raw bytes or 64 hex digits; anything else, or no file, is refused with
    the reason."""
    raw = tmp_path / "raw"
    raw.write_bytes(KEY)
    hexed = tmp_path / "hex"
    hexed.write_text(KEY.hex() + "\n")
    assert read_key(str(raw)) == KEY and read_key(str(hexed)) == KEY
    short = tmp_path / "short"
    short.write_bytes(b"x" * 16)
    with pytest.raises(ValueError, match="256-bit key"):
        read_key(str(short))
    with pytest.raises(ValueError, match="cannot read"):
        read_key(str(tmp_path / "missing"))


def test_config_section(tmp_path: Path) -> None:
    """``responses:`` parses every field; store without key_file, a bad key file, a wrong
    type and an unknown field are refused naming the field; more than one worker with store
    is refused."""
    key = tmp_path / "key"
    key.write_text(KEY.hex())
    c = parse_config(f"responses: {{store: true, key_file: {key}, max_responses: 5, "
                     f"max_age: 10m, max_bytes_per_conversation: 4096}}")
    r = c.responses
    assert (r.store, r.key_file, r.max_responses, r.max_age, r.max_bytes_per_conversation) == \
        (True, str(key), 5, 600.0, 4096)
    assert parse_config("").responses.store is False
    for text, where in (("responses: {store: true}", "responses.key_file"),
                        ("responses: {store: 1}", "responses.store"),
                        ("responses: {max_responses: 0}", "responses.max_responses"),
                        ("responses: {max_age: 0}", "responses.max_age"),
                        ("responses: {max_bytes_per_conversation: -1}",
                         "responses.max_bytes_per_conversation"),
                        ("responses: {bogus: 1}", "responses: unknown field 'bogus'"),
                        (f"workers: 2\nresponses: {{store: true, key_file: {key}}}",
                         "responses.store")):
        with pytest.raises(ConfigError) as e:
            parse_config(text)
        assert any(m.startswith(where) for m in e.value.errors), (text, e.value.errors)
    bad = tmp_path / "bad"
    bad.write_text("short")
    path = tmp_path / "pharos.yaml"
    path.write_text(f"responses: {{store: true, key_file: {bad}}}")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.errors[0].startswith("responses.key_file: ") and "256-bit" in str(e.value)


# --- the request side -------------------------------------------------------------------


def body(**kw: Any) -> bytes:
    return json.dumps({"model": "tiny", **kw}).encode()


def test_off_refuses_previous_response_id() -> None:
    """With the state off, a request naming a previous response is a 400 saying the state
    is off; any other request is parsed as before and nothing is captured."""
    state = ConversationState()
    with pytest.raises(ApiError) as e:
        state.parse(body(input="hi", previous_response_id="resp_x"), who("t"), None)
    assert e.value.status == 400 and e.value.code == "conversation_state_off"
    assert "responses.store" in e.value.message
    parsed, turn = state.parse(body(input="hi", store=True), who("t"), None)
    assert turn is None and parsed.raw == body(input="hi", store=True)


def test_expansion_and_scoping() -> None:
    """previous_response_id becomes the stored items before the new input, the field is
    removed, instructions stay the request's own; the prompt estimate and the prefix chain
    cover the whole conversation; another tenant, a forged id and a non-string id are
    refused, the first two with one and the same 404."""
    s = store()
    s.put("t1", "resp_a", ITEMS)
    state = ConversationState(s)
    parsed, turn = state.parse(body(input="next?", previous_response_id="resp_a", store=True,
                                    instructions="be brief"), who("t1"), None)
    sent = json.loads(parsed.forward_body("tiny"))
    assert "previous_response_id" not in sent and sent["instructions"] == "be brief"
    assert sent["input"] == [*ITEMS, {"role": "user", "content": "next?"}]
    assert turn is not None and turn.items == sent["input"]
    alone, _ = state.parse(body(input="next?"), who("t1"), None)
    assert parsed.prompt_tokens > alone.prompt_tokens
    assert len(parsed.chain) >= 3
    messages = []
    for tenant, rid in (("t2", "resp_a"), ("t1", "resp_forged")):
        with pytest.raises(ApiError) as e:
            state.parse(body(input="x", previous_response_id=rid), who(tenant), None)
        assert e.value.status == 404 and e.value.code == "previous_response_not_found"
        messages.append(e.value.message.replace(rid, "ID"))
    assert messages[0] == messages[1]
    with pytest.raises(ApiError) as e:
        state.parse(body(input="x", previous_response_id=7), who("t1"), None)
    assert e.value.status == 400


def test_not_store_eligible_is_not_captured() -> None:
    """Without store: true there is no turn (nothing will be captured); the body goes as the
    client sent it."""
    state = ConversationState(store())
    raw = body(input="hi")
    parsed, turn = state.parse(raw, who("t"), None)
    assert turn is None and parsed.forward_body("tiny") == raw


def eligible(state: ConversationState, raw: bytes) -> Turn:
    """The turn of a store-eligible request."""
    _, turn = state.parse(raw, who("t"), None)
    assert turn is not None
    return turn


def replay(turn: Any, reply: bytes, chunk: int = 7) -> bytes:
    tap = turn.tap(StreamTap())
    out = b"".join(tap.feed(reply[i:i + chunk]) for i in range(0, len(reply), chunk))
    return out + tap.finish()


@pytest.mark.parametrize("engine", ["llamacpp/b11312", "vllm/0.32.0"])
@pytest.mark.parametrize("stream", [False, True])
def test_capture_of_recorded_replies(engine: str, stream: bool) -> None:
    """A recorded reply of llama.cpp and vLLM, plain and streamed, passes unchanged through
    the capture and is stored under its own id, the input items then its output items."""
    s = store()
    state = ConversationState(s)
    turn = eligible(state, body(input="Count", store=True, stream=stream))
    name = "responses_stream.body" if stream else "responses.body"
    reply = (FIXTURES / engine / "idle" / "streams" / name).read_bytes()
    assert replay(turn, reply) == reply
    turn.finish(True)
    assert turn.stored is not None and turn.stored.startswith("resp_")
    assert turn.stored.encode() in reply
    items = s.get("t", turn.stored)
    assert items is not None and items[0] == {"role": "user", "content": "Count"}
    assert items[1]["type"] == "message" and items[1]["role"] == "assistant"


def test_capture_cut_failed_or_over_the_cap_stores_nothing() -> None:
    """A stream cut before its final event, a reply that did not end cleanly, and a reply
    over max_bytes store nothing (the bytes still pass unchanged)."""
    reply = (FIXTURES / "llamacpp/b11312/idle/streams/responses_stream.body").read_bytes()
    s = store()
    state = ConversationState(s)
    turn = eligible(state, body(input="x", store=True, stream=True))
    cut = reply[: reply.index(b"event: response.completed")]
    assert replay(turn, cut) == cut
    turn.finish(True)
    assert turn.stored is None
    turn = eligible(state, body(input="x", store=True, stream=True))
    replay(turn, reply)
    turn.finish(False)
    assert turn.stored is None
    small = ConversationState(store(max_bytes=200))
    turn = eligible(small, body(input="x", store=True, stream=True))
    assert replay(turn, reply) == reply
    turn.finish(True)
    assert turn.stored is None
    assert isinstance(turn.capture, Capture) and turn.capture.over
    assert len(s) == 0


def test_section_needs_a_restart_and_round_trips(tmp_path: Path) -> None:
    """A change to responses: is reported as needing a restart (the key and the store are
    made at start), and the admin config document carries the section both ways."""
    from pharos.config import reload_diff
    from pharos.proxy.admin import _yaml, to_document

    key = tmp_path / "key"
    key.write_text(KEY.hex())
    on = parse_config(f"responses: {{store: true, key_file: {key}, max_age: 90s}}")
    live, restart = reload_diff(parse_config(""), on)
    assert live == [] and restart == ["responses"]
    assert parse_config(_yaml(to_document(on))) == on


def test_start_refuses_a_missing_or_wrong_key(tmp_path: Path) -> None:
    """twistd's options refuse a config whose key file is missing or of the wrong size with
    a message naming responses.key_file; a key gone between the check and the service's
    construction is a ValueError naming it too."""
    from twisted.python import usage

    from pharos.config import Responses
    from pharos.service import conversation_state
    from pharos.tap import Options

    for content in (None, b"0123456789abcdef"):
        key = tmp_path / "key"
        if content is None:
            key.unlink(missing_ok=True)
        else:
            key.write_bytes(content)
        path = tmp_path / "pharos.yaml"
        path.write_text(f"responses: {{store: true, key_file: {key}}}\n")
        with pytest.raises(usage.UsageError, match=r"responses\.key_file: "):
            Options().parseOptions(["-c", str(path)])
    with pytest.raises(ValueError, match=r"responses\.key_file: cannot read"):
        conversation_state(Responses(store=True, key_file=str(tmp_path / "gone")), Clock())
    key.write_bytes(KEY)
    state = conversation_state(Responses(store=True, key_file=str(key), max_responses=7),
                               Clock())
    assert state.store is not None and state.store.max_responses == 7
