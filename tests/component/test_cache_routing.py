"""Layer 3: cache-aware routing through real sockets: a repeated prefix is predicted, sent to
the engine holding it and confirmed by the engine's usage; the prediction and estimate headers;
``POST /admin/explain/<route>`` answers without routing anything or changing any state; odd
bodies route without error."""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
import treq
from twisted.web.http_headers import Headers

from tests.support.fleet import Fleet, eventually, start_fleet

SYSTEM = "Answer as a ship's pilot would, briefly and exactly. " * 60  # ~3.2 kB


def chat(question: str, system: str = SYSTEM, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 4, "stream": True,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}], **extra}


async def three_vllm() -> Fleet:
    return await start_fleet([("vllm", {"seed": i}, {"kind": "vllm"}) for i in range(3)])


async def send(fleet: Fleet, body: dict[str, Any], path: str = "/v1/chat/completions",
               raw: bytes | None = None) -> tuple[Any, bytes]:
    if raw is None:
        r = await fleet.post(path, body)
    else:
        r = await treq.post(fleet.url + path, raw, pool=fleet.pool,
                            headers=Headers({b"content-type": [b"application/json"]}))
    return r, await r.content()


def header(r: Any, name: bytes) -> str | None:
    v = r.headers.getRawHeaders(name)
    return v[0].decode() if v else None


@pytest_twisted.ensureDeferred
async def test_repeated_prefix_is_predicted_routed_and_confirmed() -> None:
    """The second request sharing a system prompt goes to the engine that served the first,
    with a prediction in its headers, and the engine's cached tokens confirm it."""
    fleet = await three_vllm()
    try:
        r1, _ = await send(fleet, chat("first question"))
        assert r1.code == 200
        assert header(r1, b"x-pharos-predicted-cached-tokens") == "0"
        assert header(r1, b"x-pharos-estimated-ttft-ms") is not None
        sched = fleet.pharos.sched
        await eventually(lambda: sum(sched.outcomes.values()) == 1)
        r2, _ = await send(fleet, chat("second question"))
        assert header(r2, b"x-pharos-backend") == header(r1, b"x-pharos-backend")
        predicted = int(header(r2, b"x-pharos-predicted-cached-tokens") or 0)
        assert predicted >= len(SYSTEM) // 4 - 1
        await eventually(lambda: sum(sched.outcomes.values()) == 2)
        assert sched.predictions[("local", "predicted_hit")] == 1
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_explain_changes_nothing() -> None:
    """Explain names every candidate with its signals, prediction and cost terms, the winner
    and the deciding term, and takes no slot, sends nothing and records nothing."""
    fleet = await three_vllm()
    try:
        r1, _ = await send(fleet, chat("first question"))
        served = header(r1, b"x-pharos-backend")
        sched = fleet.pharos.sched
        await eventually(lambda: sum(sched.outcomes.values()) == 1)
        before = ([d.stats.started for d in fleet.doubles], len(sched.index),
                  sched.index.lru_order(), dict(sched.sessions), len(sched.hot),
                  [t.inflight for t in fleet.pharos.state.targets])
        r, body = await send(fleet, chat("another", user="u1"),
                             path="/admin/explain/v1/chat/completions")
        assert r.code == 200, body
        doc = json.loads(body)
        after = ([d.stats.started for d in fleet.doubles], len(sched.index),
                 sched.index.lru_order(), dict(sched.sessions), len(sched.hot),
                 [t.inflight for t in fleet.pharos.state.targets])
        assert before == after
        assert doc["policy"] == "cost" and doc["chain_links"] == 2
        assert len(doc["candidates"]) == 3
        assert doc["winner"].startswith(served)
        assert doc["decided_by"] == "prefill"
        by_backend = {c["backend"]: c for c in doc["candidates"]}
        assert by_backend[served]["predicted_cached_tokens"] > 0
        assert by_backend[served]["prediction_source"] == "local"
        for c in doc["candidates"]:
            assert set(c["estimate"]) == {"wait_sec", "load_sec", "prefill_sec",
                                          "kv_penalty_sec", "evict_sec", "reload_sec",
                                          "ttft_sec"}
            assert c["evicts_tokens"] == 0  # no retention learned yet: nothing priced
            assert c["retained_root_tokens"] is None
            assert "running" in c["signals"] and c["set_aside"] is None
        assert SYSTEM[:20] not in body.decode()
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_explain_errors_in_shape() -> None:
    """Explain of an unknown model is the route's 404, of an unexplainable route a 404, and of
    a bad body a 400."""
    fleet = await three_vllm()
    try:
        r, _ = await send(fleet, {**chat("q"), "model": "nope"},
                          path="/admin/explain/v1/chat/completions")
        assert r.code == 404
        r, _ = await send(fleet, chat("q"), path="/admin/explain/v1/embeddings")
        assert r.code == 404
        r, _ = await send(fleet, {}, path="/admin/explain/v1/chat/completions", raw=b"{nope")
        assert r.code == 400
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_escaped_and_utf8_bodies_share_a_prefix() -> None:
    """A client escaping non-ASCII as \\uXXXX and one sending UTF-8 build the same chain: the
    second is predicted on the first's engine."""
    fleet = await three_vllm()
    system = "Отвечай кратко и точно, как лоцман. " * 40
    try:
        body = chat("вопрос", system=system)
        r1, _ = await send(fleet, body, raw=json.dumps(body, ensure_ascii=True).encode())
        assert r1.code == 200
        sched = fleet.pharos.sched
        await eventually(lambda: sum(sched.outcomes.values()) == 1)
        r2, _ = await send(fleet, body, raw=json.dumps(body, ensure_ascii=False).encode())
        assert header(r2, b"x-pharos-backend") == header(r1, b"x-pharos-backend")
        assert int(header(r2, b"x-pharos-predicted-cached-tokens") or 0) > 0
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_odd_bodies_route_and_are_counted() -> None:
    """Content arrays, missing messages, a batch prompt and an enormous tool list all route
    without error; the ones the index cannot follow are counted by reason."""
    fleet = await three_vllm()
    tools = [{"type": "function", "function": {"name": f"tool{i}", "description": "d" * 200,
                                               "parameters": {"type": "object"}}}
             for i in range(500)]
    try:
        parts = {"model": "tiny", "max_tokens": 2, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"},
                                         {"type": "image_url", "image_url": {"url": "x"}}]}]}
        r, body = await send(fleet, parts)
        assert r.code == 200, body
        r, body = await send(fleet, {"model": "tiny", "max_tokens": 2, "messages": []})
        assert r.code < 500, body
        r, body = await send(fleet, {"model": "tiny", "max_tokens": 2,
                                     "prompt": ["a", "b"]}, path="/v1/completions")
        assert r.code < 500, body
        r, body = await send(fleet, {**chat("q"), "tools": tools})
        assert r.code == 200, body
        unfollowed = fleet.pharos.sched.unfollowed
        assert unfollowed["no_messages"] == 1 and unfollowed["batch_prompt"] == 1
    finally:
        await fleet.stop()
