"""Layer 3: Responses conversation state (issue 17 item 6) over loopback with the OpenAI
Python SDK: ``responses.create(store=True)`` then turns with ``previous_response_id``, plain
and streamed, against a llama.cpp answering from its recorded replies (it keeps no state and
refuses ``previous_response_id``, as the real one does); the engine's received bodies show
the expanded input. Bad input: a forged id, another tenant's id, an expired one, the state
off, and a reply cut mid-stream (nothing stored)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest_twisted
import treq
from openai.types.responses import ResponseCompletedEvent, ResponseCreatedEvent
from twisted.internet.threads import deferToThread
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from zope.interface import implementer

from pharos.config import Key, Responses, Tenant
from pharos.proxy.auth import digest
from tests.support.fleet import Fleet, sleep, start_fleet
from tests.support.responses_engine import ResponsesEngine, start_responses_engine

KEY_A = "phk-tenant-a"
KEY_A2 = "phk-tenant-a-second"
KEY_B = "phk-tenant-b"
KEYS = (Key(name="a", sha256=digest(KEY_A), tenant="ta"),
        Key(name="a2", sha256=digest(KEY_A2), tenant="ta"),
        Key(name="b", sha256=digest(KEY_B), tenant="tb"))
TENANTS = (Tenant(name="ta"), Tenant(name="tb"))


async def fleet_with(tmp_path: Path, store: bool = True, **responses: Any
                     ) -> tuple[Fleet, ResponsesEngine]:
    """Pharos in front of the recorded llama.cpp only, with three keys in two tenants and
    the conversation state on (or off)."""
    key = tmp_path / "responses.key"
    key.write_text("ab" * 32)
    engine, port, url = start_responses_engine()
    config = Responses(store=True, key_file=str(key), **responses) if store else Responses()
    fleet = await start_fleet([], extra=[url], keys=KEYS, tenants=TENANTS, responses=config)
    fleet.ports.append(port)
    return fleet, engine


def client(fleet: Fleet, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.url + "/v1", api_key=key, max_retries=0)


def error_of(call: Any) -> Any:
    try:
        call()
    except openai.APIStatusError as e:
        return e
    return None


@pytest_twisted.ensureDeferred
async def test_multi_turn_plain_and_streamed(tmp_path: Path) -> None:
    """Turn 1 stores; turn 2 (plain) names turn 1 and the engine receives the whole
    conversation without previous_response_id; turn 3 streamed names turn 2 and is stored
    from its stream; turn 4 names turn 3. Each reply's id is the one the engine gave, and a
    key of the same tenant continues the conversation."""
    fleet, engine = await fleet_with(tmp_path)
    a, a2 = client(fleet, KEY_A), client(fleet, KEY_A2)
    events: list[str] = []

    @implementer(ILogObserver)
    def observe(event: LogEvent) -> None:
        events.append(str(formatEvent(event)) + repr(event))

    globalLogPublisher.addObserver(observe)

    def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        r1 = a.responses.create(model="tiny", input="Hello", store=True, max_output_tokens=8)
        r2 = a.responses.create(model="tiny", input="And then?", store=True,
                                previous_response_id=r1.id, max_output_tokens=8)
        streamed = list(a.responses.create(model="tiny", input="Third", store=True,
                                         previous_response_id=r2.id, stream=True,
                                         max_output_tokens=8))
        final = streamed[-1]
        assert isinstance(final, ResponseCompletedEvent)
        r3_id = final.response.id
        r4 = a2.responses.create(model="tiny", input="Fourth", store=True,
                                 previous_response_id=r3_id, max_output_tokens=8)
        out.update(r1=r1, r2=r2, events=streamed, r3_id=r3_id, r4=r4)
        return out

    try:
        got = await deferToThread(run)
        metrics = await (await treq.get(fleet.url + "/metrics", pool=fleet.pool)).text()
    finally:
        globalLogPublisher.removeObserver(observe)
        a.close()
        a2.close()
        await fleet.stop()
    assert "pharos_responses_stored 4.0" in metrics
    assert 'pharos_responses_records_total{outcome="stored"} 4.0' in metrics
    for text in ("Hello", "And then?", "Third", "Fourth"):  # no prompt text
        assert text not in metrics and not any(text in e for e in events), text
    assert [got["r1"].id, got["r2"].id, got["r3_id"], got["r4"].id] == engine.ids
    assert got["events"][-1].type == "response.completed"
    bodies = engine.received
    assert all("previous_response_id" not in b for b in bodies)
    assert bodies[0]["input"] == "Hello"
    out1 = got["r1"].output[0].model_dump(exclude_none=True)
    second = bodies[1]["input"]
    assert second[0] == {"role": "user", "content": "Hello"}
    assert second[1]["id"] == out1["id"] and second[1]["role"] == "assistant"
    assert second[1]["content"][0]["text"] == got["r1"].output_text
    assert second[2] == {"role": "user", "content": "And then?"}
    third = bodies[2]["input"]
    assert third[:3] == second and third[4] == {"role": "user", "content": "Third"}
    assert bodies[2]["stream"] is True
    fourth = bodies[3]["input"]
    assert fourth[:5] == third and fourth[6] == {"role": "user", "content": "Fourth"}
    assert fourth[5]["type"] == "message" and fourth[5]["role"] == "assistant"


@pytest_twisted.ensureDeferred
async def test_forged_other_tenant_and_expired_ids(tmp_path: Path) -> None:
    """A forged id and another tenant's real id get the same 404 in OpenAI's shape (code
    previous_response_not_found) and reach no engine; an id past max_age is a 404 too; a
    turn without store: true is not kept."""
    fleet, engine = await fleet_with(tmp_path, max_age=1.0)
    a, b = client(fleet, KEY_A), client(fleet, KEY_B)

    def first() -> tuple[str, str]:
        kept = a.responses.create(model="tiny", input="Hello", store=True)
        unkept = a.responses.create(model="tiny", input="Hello")
        return kept.id, unkept.id

    def later(kept: str, unkept: str) -> dict[str, Any]:
        def turn(c: openai.OpenAI, rid: str) -> Any:
            return error_of(lambda: c.responses.create(model="tiny", input="x",
                                                       previous_response_id=rid))
        return {"forged": turn(a, "resp_" + "0" * 32), "other": turn(b, kept),
                "unkept": turn(a, unkept), "own": turn(a, kept)}

    try:
        kept, unkept = await deferToThread(first)
        got = await deferToThread(later, kept, unkept)
        sent = len(engine.received)
        await sleep(1.5)
        expired = await deferToThread(lambda: later(kept, unkept)["own"])
    finally:
        a.close()
        b.close()
        await fleet.stop()
    assert got["own"] is None  # the owner continues it
    assert sent == 3  # two first turns and the owner's second: the refused reached no engine
    for name in ("forged", "other", "unkept"):
        e = got[name]
        assert isinstance(e, openai.NotFoundError), name
        assert e.code == "previous_response_not_found" and e.type == "invalid_request_error"
    assert got["other"].message.replace(kept, "ID") == got["forged"].message.replace(
        "resp_" + "0" * 32, "ID")
    assert isinstance(expired, openai.NotFoundError)
    assert expired.code == "previous_response_not_found"


@pytest_twisted.ensureDeferred
async def test_state_off_refuses_previous_response_id(tmp_path: Path) -> None:
    """Without responses.store, previous_response_id is a 400 saying the state is off (not
    the engine's refusal, not a silent answer without context); store: true is passed on
    untouched and nothing is kept."""
    fleet, engine = await fleet_with(tmp_path, store=False)
    a = client(fleet, KEY_A)

    def run() -> tuple[Any, Any]:
        r = a.responses.create(model="tiny", input="Hello", store=True)
        return r, error_of(lambda: a.responses.create(model="tiny", input="x",
                                                      previous_response_id=r.id))

    try:
        reply, e = await deferToThread(run)
    finally:
        a.close()
        await fleet.stop()
    assert reply.output_text
    assert isinstance(e, openai.BadRequestError) and e.code == "conversation_state_off"
    assert "responses.store" in e.message
    assert len(engine.received) == 1 and engine.received[0]["store"] is True
    assert fleet.pharos.public.conversations.store is None


@pytest_twisted.ensureDeferred
async def test_reply_cut_mid_stream_is_not_stored(tmp_path: Path) -> None:
    """An engine dying mid-stream: the client's stream breaks, and the id it saw in
    response.created is not stored (a 404 when named)."""
    fleet, engine = await fleet_with(tmp_path)
    a = client(fleet, KEY_A)
    engine.cut_next = True

    def run() -> tuple[str | None, bool, Any]:
        seen: str | None = None
        broke = False
        try:
            for event in a.responses.create(model="tiny", input="Hello", store=True,
                                            stream=True):
                if isinstance(event, ResponseCreatedEvent):
                    seen = event.response.id
        except (openai.APIError, Exception):
            broke = True
        assert seen is not None
        return seen, broke, error_of(lambda: a.responses.create(
            model="tiny", input="x", previous_response_id=seen))

    try:
        seen, broke, e = await deferToThread(run)
    finally:
        a.close()
        await fleet.stop()
    assert broke
    assert [seen] == engine.ids  # one attempt: no retry after the first byte
    assert isinstance(e, openai.NotFoundError) and e.code == "previous_response_not_found"
    store = fleet.pharos.public.conversations.store
    assert store is not None and len(store) == 0
