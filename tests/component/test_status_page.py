"""Layer 3: ``/status`` over loopback, served by the public site: every backend with its plan, the
targets' signals with unknown shown as unknown, the last requests and usage by key, the
admin check, escaping of names clients choose, and no prompt text."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest_twisted

from pharos.obs.status import RecentRequests
from tests.support.pages import EVIL, MARKER, USER, start_pages


@pytest_twisted.ensureDeferred
async def test_status_shows_backends_plans_targets_requests_and_usage() -> None:
    """After traffic, /status (admin) is one HTML page refreshing every 10 s with each
    backend's kind, active probes with signal and source, the round ages, each target's row
    (unknown signals say "unknown"), capacity with its source, the requests with key, status,
    target, reason and tokens, and usage by key today and over 30 days."""
    rig = await start_pages()
    try:
        for _ in range(3):
            code, _ = await rig.chat()
            assert code == 200
        code, _ = await rig.chat(stream=True)
        assert code == 200
        code, body, headers = await rig.get("/status")
        assert code == 200, body
        assert headers.getRawHeaders(b"content-type") == [b"text/html; charset=utf-8"]
        page = body.decode()
        assert page.startswith("<!DOCTYPE html>")
        assert '<meta http-equiv="refresh" content="10"' in page
        for b in rig.fleet.pharos.state.backends.values():
            assert f'data-backend="{b.url}"' in page
            assert b.plan is not None
            for p in b.plan.active:
                assert p.name in page
        assert "vllm" in page and "ollama" in page
        assert "last full round" in page and " s ago" in page
        assert "unknown" in page  # e.g. the Ollama double reports no waiting count
        assert re.search(r"\((engine|config|learned|default)\)", page)
        recent = page.split("Last 50 requests")[1].split("Usage by key")[0]
        assert recent.count("<tr>") == 1 + 4  # header + the four requests
        assert "200" in recent and "in (" in recent and " out" in recent
        usage = page.split("Usage by key")[1]
        assert "today" in usage and "last 30 days" in usage
        assert "&lt;script&gt;" in usage  # the key's (escaped) name has usage
        assert "no usage" not in usage
    finally:
        await rig.close()


@pytest_twisted.ensureDeferred
async def test_status_needs_an_admin_key_and_is_open_without_keys() -> None:
    """No key: 401; a non-admin key: 403 (both in JSON); with no keys configured, open."""
    rig = await start_pages()
    try:
        code, body, _ = await rig.get("/status", key=None)
        assert code == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
        code, body, _ = await rig.get("/status", key=USER)
        assert code == 403 and "error" in json.loads(body)
        for path in ("/live", "/live/events", "/live/map.js"):
            code, _, _ = await rig.get(path, key=USER)
            assert code == 403, path
        code, _, _ = await rig.get("/v1/models", key=USER)
        assert code == 200  # the public routes still answer behind the pages
    finally:
        await rig.close()
    rig = await start_pages(keys=())
    try:
        code, body, _ = await rig.get("/status", key=None)
        assert code == 200 and b"Pharos status" in body
    finally:
        await rig.close()


@pytest_twisted.ensureDeferred
async def test_status_escapes_names_and_carries_no_prompt() -> None:
    """A key name and a requested model name holding <script>, quotes and a newline appear
    only escaped (the page holds no script element at all), and the marker sent in every
    prompt appears nowhere on the page (item 8)."""
    rig = await start_pages()
    try:
        assert (await rig.chat())[0] == 200
        code, _ = await rig.chat(model=EVIL)
        assert code == 404
        code, body, _ = await rig.get("/status")
        assert code == 200
        page = body.decode()
        assert MARKER not in page
        assert "<script" not in page.lower()
        assert page.count("&lt;script&gt;alert(") >= 2  # the key and the model name
        recent = page.split("Last 50 requests")[1].split("Usage by key")[0]
        assert "404" in recent
    finally:
        await rig.close()


@pytest_twisted.ensureDeferred
async def test_recent_requests_keep_the_last_fifty() -> None:
    """The ring buffer holds 50 requests, newest first on the page; a record given as an
    object (the coming ``Done``) reads like a dict."""
    rig = await start_pages(keys=())
    try:
        recent = rig.pages.status_page.recent
        assert isinstance(recent, RecentRequests) and recent in rig.fleet.pharos.public.on_done

        @dataclass
        class Done:
            key: str
            status: int
            target: str
            reason: str

        for i in range(60):
            recent(Done(key=f"k{i}", status=200, target="http://x", reason="cost"))
        recent(object())  # nothing it knows: kept with unknown fields, never raises
        assert len(recent.items) == 50
        _, body, _ = await rig.get("/status", key=None)
        page = body.decode()
        assert "k59" in page and "k11" in page and "k10<" not in page
        assert page.index("k59") < page.index("k58")
    finally:
        await rig.close()
