"""Layer 3: keys, quotas and usage over loopback (issue 11): each error in its route family's
shape, model allow-lists, RPM and daily-token quotas under concurrent bursts, usage totals
equal to what the engines reported, the journal, and a queued client's reservation freed."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.internet.defer import ensureDeferred, gatherResults
from twisted.web.http_headers import Headers

from pharos.config import Key, Tenant, UsageConfig
from pharos.proxy.auth import digest
from tests.support.fleet import Fleet, eventually, start_fleet, within

ADMIN, ALICE, BOB, CAROL = "phk-admin", "phk-alice", "phk-bob", "phk-carol"
KEYS = (
    Key(name="ops", sha256=digest(ADMIN), admin=True),
    Key(name="alice", sha256=digest(ALICE), models=("tiny",)),
    Key(name="bob", sha256=digest(BOB), rpm=3, tenant="lab"),
    Key(name="carol", sha256=digest(CAROL), tokens_per_day=2000),
)
TENANTS = (Tenant(name="lab", weight=2),)


async def fleet(**config: Any) -> Fleet:
    return await start_fleet([("vllm", {}, {"kind": "vllm"}),
                              ("vllm", {"seed": 1}, {"kind": "vllm",
                                                     "aliases": {"tiny": "other"}})],
                             keys=KEYS, tenants=TENANTS, **config)


async def call(f: Fleet, method: str, path: str, key: str | None = None,
               body: dict[str, Any] | None = None, header: str = "authorization"
               ) -> tuple[int, Any, Headers]:
    headers = Headers({b"content-type": [b"application/json"]})
    if key is not None:
        value = f"Bearer {key}" if header.lower() == "authorization" else key
        headers.setRawHeaders(header.encode(), [value.encode()])
    data = json.dumps(body).encode() if body is not None else None
    r = await treq.request(method, f.url + path, data=data, headers=headers, pool=f.pool)
    raw = await r.content()
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = raw.decode()
    return r.code, doc, r.headers


def auth(key: str) -> Headers:
    return Headers({b"authorization": [f"Bearer {key}".encode()]})


def chat(model: str = "tiny", max_tokens: int = 4, text: str = "hello there") -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": text}]}


@pytest_twisted.ensureDeferred
async def test_errors_in_each_route_familys_shape() -> None:
    """401 without a key in OpenAI's, Ollama's and Anthropic's shapes (with WWW-Authenticate);
    /healthz and GET / need none; a non-admin key gets 403 on /admin and /usage; an admin key
    reads them; x-api-key works as Anthropic clients send it."""
    f = await fleet()
    try:
        code, doc, headers = await call(f, "POST", "/v1/chat/completions", body=chat())
        assert code == 401 and doc["error"]["code"] == "invalid_api_key"
        assert headers.getRawHeaders(b"www-authenticate") == [
            b'Bearer, Basic realm="pharos", charset="UTF-8"']
        code, doc, _ = await call(f, "POST", "/api/chat", "phk-wrong", body=chat())
        assert code == 401 and doc == {"error": "invalid API key"}
        code, doc, _ = await call(f, "POST", "/v1/messages", body=chat())
        assert code == 401 and doc["type"] == "error"
        assert doc["error"]["type"] == "authentication_error"
        code, doc, _ = await call(f, "GET", "/v1/models", "x", header="authorization")
        assert code == 401
        for path in ("/healthz", "/"):
            assert (await call(f, "GET", path))[0] == 200
        explain = "/admin/explain/v1/chat/completions"
        code, doc, _ = await call(f, "POST", explain, ALICE, body=chat())
        assert code == 403 and doc["error"]["code"] == "admin_required"
        assert (await call(f, "GET", "/usage", ALICE))[0] == 403
        assert (await call(f, "POST", explain, ADMIN, body=chat()))[0] == 200
        assert (await call(f, "GET", "/usage", ADMIN))[0] == 200
        code, doc, _ = await call(f, "POST", "/v1/messages", ALICE, body=chat(),
                                  header="x-api-key")
        assert code != 401, doc
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_a_keys_models_list_filters_lists_and_refuses_others() -> None:
    """alice may use only ``tiny``: /v1/models shows her only it, ``other`` is 403
    model_not_allowed (in Ollama's shape on /api/chat), while ops sees both."""
    f = await fleet()
    try:
        code, doc, _ = await call(f, "GET", "/v1/models", ALICE)
        assert code == 200 and [m["id"] for m in doc["data"]] == ["tiny"]
        code, doc, _ = await call(f, "GET", "/v1/models", ADMIN)
        assert sorted(m["id"] for m in doc["data"]) == ["other", "tiny"]
        code, doc, _ = await call(f, "POST", "/v1/chat/completions", ALICE, chat("other"))
        assert code == 403 and doc["error"]["code"] == "model_not_allowed"
        code, doc, _ = await call(f, "POST", "/api/chat", ALICE, chat("other"))
        assert code == 403 and "may not use model" in doc["error"]
        assert (await call(f, "GET", "/v1/models/other", ALICE))[0] == 403
        assert (await call(f, "POST", "/v1/chat/completions", ALICE, chat()))[0] == 200
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_rpm_limits_a_burst_with_retry_after() -> None:
    """bob's 3 requests per minute: of 8 concurrent requests exactly 3 are served; the rest
    get 429 rate_limited with a Retry-After, and refused ones are not counted (a ninth is
    still refused, not served)."""
    f = await fleet()
    try:
        replies = await gatherResults([
            ensureDeferred(call(f, "POST", "/v1/chat/completions", BOB, chat()))
            for _ in range(8)])
        codes = sorted(code for code, _, _ in replies)
        assert codes == [200] * 3 + [429] * 5
        for code, doc, headers in replies:
            if code == 429:
                assert doc["error"]["code"] == "rate_limited"
                assert int((headers.getRawHeaders(b"retry-after") or [b"0"])[0]) >= 1
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_daily_tokens_never_overspent_under_a_concurrent_burst() -> None:
    """carol has 2,000 tokens a day. 1,000 concurrent requests (about 110 tokens reserved
    each): what the engine reports she used stays within the budget plus one request; the
    refused get 429 quota_exceeded with Retry-After, none a 500; a max_tokens of 10^9 is a
    clear 400."""
    f = await fleet()
    try:
        replies = await gatherResults([
            ensureDeferred(call(f, "POST", "/v1/chat/completions", CAROL,
                                chat(max_tokens=100)))
            for _ in range(1000)])
        served = [doc for code, doc, _ in replies if code == 200]
        refused = [(doc, h) for code, doc, h in replies if code == 429]
        others = [(code, doc) for code, doc, _ in replies if code not in (200, 429)]
        assert not others and served and refused, others[:3]
        for doc, h in refused:
            assert doc["error"]["code"] == "quota_exceeded"
            assert int((h.getRawHeaders(b"retry-after") or [b"0"])[0]) >= 1
        used = sum(d["usage"]["prompt_tokens"] + d["usage"]["completion_tokens"]
                   for d in served)
        biggest = max(d["usage"]["prompt_tokens"] + d["usage"]["completion_tokens"]
                      for d in served)
        assert used <= 2000 + biggest, used
        assert f.pharos.ledger.spent_today(key="carol") == used
        assert f.pharos.ledger.reserved_today(key="carol") == 0
        code, doc, _ = await call(f, "POST", "/v1/chat/completions", CAROL,
                                  chat(max_tokens=10**9))
        assert code == 400 and doc["error"]["code"] == "request_exceeds_quota"
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_usage_equals_what_the_engines_reported(tmp_path: Path) -> None:
    """Requests of three keys on two models, streamed and not: /usage by key, model and
    tenant sums exactly the usage the replies carried, CSV has the same rows, and the
    journal has one line per request (the Done record: request id, decisions, target, TTFT),
    without prompt text."""
    journal = tmp_path / "usage.jsonl"
    f = await fleet(usage=UsageConfig(journal=str(journal), timezone="Asia/Bangkok"))
    expected: dict[str, dict[str, int]] = {}
    try:
        for key, name, model in ((ALICE, "alice", "tiny"), (BOB, "bob", "other"),
                                 (ADMIN, "ops", "other"), (ADMIN, "ops", "tiny")):
            code, doc, _ = await call(f, "POST", "/v1/chat/completions", key,
                                      chat(model, text="secret words " * 30))
            assert code == 200, doc
            row = expected.setdefault(name, dict.fromkeys(
                ("requests", "prompt_tokens", "completion_tokens"), 0))
            row["requests"] += 1
            row["prompt_tokens"] += doc["usage"]["prompt_tokens"]
            row["completion_tokens"] += doc["usage"]["completion_tokens"]
        code, doc, _ = await call(f, "GET", "/usage?by=key", ADMIN)
        assert code == 200
        got = {r["key"]: {k: r[k] for k in ("requests", "prompt_tokens", "completion_tokens")}
               for r in doc["rows"]}
        assert got == expected
        assert all(r["day"].endswith("T00:00:00+07:00") and r["unmetered"] == 0
                   for r in doc["rows"])
        code, doc, _ = await call(f, "GET", "/usage?by=tenant", ADMIN)
        tenants = {r["tenant"]: r["requests"] for r in doc["rows"]}
        assert tenants == {"default": 3, "lab": 1}
        code, doc, _ = await call(f, "GET", "/usage?by=model", ADMIN)
        assert {r["model"]: r["requests"] for r in doc["rows"]} == {"tiny": 2, "other": 2}
        r = await treq.get(f.url + "/usage?by=key&format=csv",
                           headers=auth(ADMIN),
                           pool=f.pool)
        rows = list(csv.DictReader(io.StringIO((await r.content()).decode())))
        assert {row["key"]: int(row["prompt_tokens"]) for row in rows} == {
            k: v["prompt_tokens"] for k, v in expected.items()}
        for bad in ("from=yesterday", "by=color", "format=xml", "from=2026-02-02&to=2026-01-01",
                    "colour=red"):
            code, doc, _ = await call(f, "GET", f"/usage?{bad}", ADMIN)
            assert code == 400 and doc["error"]["code"] == "invalid_parameter", bad
    finally:
        await f.stop()
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [(x["key"], x["model"], x["status"]) for x in lines] == [
        ("alice", "tiny", 200), ("bob", "other", 200), ("ops", "other", 200),
        ("ops", "tiny", 200)]
    assert all(len(x["request_id"]) == 32 and x["decisions"][0] == "admission=ok"
               and "upstream=ok" in x["decisions"] and x["target"] and x["ttft_ms"] is not None
               for x in lines)
    assert "secret" not in journal.read_text()


@pytest_twisted.ensureDeferred
async def test_a_client_that_leaves_while_queued_frees_its_reservation() -> None:
    """With the engine's slots full, carol's queued request holds tokens; when she leaves,
    the reservation is released and nothing is counted."""
    f = await start_fleet([("vllm", {"slots": 1, "decode_s": 0.05}, {"kind": "vllm",
                                                                    "capacity": 1})],
                          keys=KEYS, tenants=TENANTS)
    try:
        long = ensureDeferred(call(f, "POST", "/v1/chat/completions", ADMIN,
                                   chat(max_tokens=60)))
        await eventually(lambda: f.pharos.sched.leases, timeout=10)
        queued = treq.post(f.url + "/v1/chat/completions", json.dumps(chat()).encode(),
                           headers=auth(CAROL),
                           pool=f.pool)
        await eventually(lambda: f.pharos.sched.waiting == 1, timeout=10)
        assert f.pharos.ledger.reserved_today(key="carol") > 0
        queued.cancel()
        await eventually(lambda: f.pharos.ledger.reserved_today(key="carol") == 0, timeout=10)
        assert f.pharos.ledger.spent_today(key="carol") == 0
        await within(long, 30)
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_a_reload_swaps_the_key_set_whole() -> None:
    """After a reload that drops alice and adds dave, dave's key works and alice's is a 401,
    without a restart (what ConfigWatcher hands the service)."""
    f = await fleet()
    try:
        assert (await call(f, "POST", "/v1/chat/completions", ALICE, chat()))[0] == 200
        dave = Key(name="dave", sha256=digest("phk-dave"))
        f.pharos.reconfigure(dataclasses.replace(f.pharos.config, keys=(KEYS[0], dave)))
        assert (await call(f, "POST", "/v1/chat/completions", "phk-dave", chat()))[0] == 200
        assert (await call(f, "POST", "/v1/chat/completions", ALICE, chat()))[0] == 401
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_hostile_credentials_get_clear_errors() -> None:
    """A 4,000-character key is a 401, a 100 KB Authorization header is refused with 431 by
    the HTTP layer (never a 500 or a silent close), and Pharos answers the next request
    normally."""
    f = await fleet()
    try:
        code, doc, _ = await call(f, "POST", "/v1/chat/completions", "k" * 4000, chat())
        assert code == 401 and doc["error"]["message"] == "invalid API key"
        code, _, _ = await call(f, "POST", "/v1/chat/completions", "k" * 100_000, chat())
        assert code == 431
        assert (await call(f, "POST", "/v1/chat/completions", ALICE, chat()))[0] == 200
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_a_browser_reaches_the_pages_with_basic_auth() -> None:
    """With keys configured, /status and /live answer a browser's Basic credentials (the
    admin key as the password) and refuse them without, challenging with Basic so the
    browser asks; a non-admin key is a 403."""
    import base64

    f = await fleet()
    try:
        def basic(key: str) -> Headers:
            token = base64.b64encode(f"me:{key}".encode())
            return Headers({b"authorization": [b"Basic " + token]})

        for path in ("/status", "/live"):
            r = await treq.get(f.url + path, pool=f.pool)
            await r.content()
            assert r.code == 401
            assert b"Basic" in (r.headers.getRawHeaders(b"www-authenticate") or [b""])[0]
            r = await treq.get(f.url + path, headers=basic(ADMIN), pool=f.pool)
            assert r.code == 200 and b"<html" in (await r.content()).lower()
            r = await treq.get(f.url + path, headers=basic(ALICE), pool=f.pool)
            await r.content()
            assert r.code == 403
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_a_flooding_keys_streamed_requests_are_paced_and_all_served() -> None:
    """One 8-sequence engine, the light key active with a stream in flight: a burst of 12
    streamed requests from the heavy key puts it over its share, so Pharos holds its next
    request while one it sent has no first byte (pacing, counted in /metrics), and every
    request of both keys is still served, the light key's next one among them."""
    light, heavy = "phk-light", "phk-heavy"
    keys = (Key(name="light", sha256=digest(light)), Key(name="heavy", sha256=digest(heavy)),
            *KEYS)
    f = await start_fleet([("vllm", {"slots": 8, "decode_s": 0.05},
                            {"kind": "vllm", "capacity": 8})], keys=keys, tenants=TENANTS)
    try:
        def stream(n: int) -> dict[str, Any]:
            return {**chat(max_tokens=n), "stream": True}

        first = ensureDeferred(call(f, "POST", "/v1/chat/completions", light, stream(40)))
        await eventually(lambda: f.pharos.sched.leases, timeout=10)
        burst = [ensureDeferred(call(f, "POST", "/v1/chat/completions", heavy, stream(10)))
                 for _ in range(12)]
        await eventually(lambda: f.pharos.sched.queue.paced > 0, timeout=10)
        second = await within(ensureDeferred(call(f, "POST", "/v1/chat/completions", light,
                                                  stream(4))), 30)
        replies = await within(gatherResults(burst), 60)
        assert second[0] == 200 and all(code == 200 for code, _, _ in replies)
        assert (await within(first, 30))[0] == 200
        code, text, _ = await call(f, "GET", "/metrics", ADMIN)
        assert code == 200 and f"pharos_queue_paced_total {f.pharos.sched.queue.paced}.0" in text
    finally:
        await f.stop()
