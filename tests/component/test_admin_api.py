"""Layer 3: the admin API over loopback (issue 17 item 4): ``/admin/config`` (GET, PATCH),
``/admin/backends`` and ``/admin/index`` need an admin key once keys are configured, show no
secret and no prompt text, and a patch changes routing like a reload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.web.client import HTTPConnectionPool
from twisted.web.http_headers import Headers

from pharos.config import Key, load_config
from pharos.proxy.auth import digest
from pharos.service import PharosService
from tests.support.capture_server import close, serve
from tests.support.fleet import Fleet, start_fleet

ADMIN, USER = "phk-admin-key", "phk-user-key"
KEYS = (Key(name="ops", sha256=digest(ADMIN), admin=True),
        Key(name="user", sha256=digest(USER)))
PROMPT = "a very particular prompt text 9f2c"


async def call(f: Fleet, method: str, path: str, key: str | None = None,
               body: Any = None) -> tuple[int, Any, Headers]:
    headers = Headers({b"content-type": [b"application/merge-patch+json"]})
    if key is not None:
        headers.setRawHeaders(b"authorization", [f"Bearer {key}".encode()])
    data = json.dumps(body).encode() if body is not None else None
    r = await treq.request(method, f.url + path, data=data, headers=headers, pool=f.pool)
    raw = await r.content()
    return r.code, json.loads(raw), r.headers


async def chat(f: Fleet, model: str, text: str) -> Any:
    """A chat request with the user key; the response, its body read."""
    body = {"model": model, "max_tokens": 2,
            "messages": [{"role": "system", "content": text}, {"role": "user", "content": text}]}
    r = await treq.post(f.url + "/v1/chat/completions", json.dumps(body).encode(),
                        headers=Headers({b"authorization": [f"Bearer {USER}".encode()],
                                         b"content-type": [b"application/json"]}), pool=f.pool)
    await r.content()
    return r


async def fleet() -> Fleet:
    return await start_fleet([("vllm", {}, {"kind": "vllm"}),
                              ("ollama", {}, {"kind": "ollama", "capacity": 3})], keys=KEYS)


ROUTES = [("GET", "/admin/config", None), ("PATCH", "/admin/config", {"policy": "p2c"}),
          ("GET", "/admin/backends", None), ("GET", "/admin/index", None)]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
@pytest_twisted.ensureDeferred
async def test_admin_routes_need_an_admin_key(method: str, path: str, body: Any) -> None:
    """No key: 401; a key without admin: 403 (and a refused patch changes nothing); the admin
    key: 200."""
    f = await fleet()
    try:
        code, doc, _ = await call(f, method, path, body=body)
        assert code == 401, doc
        code, doc, _ = await call(f, method, path, USER, body)
        assert code == 403 and doc["error"]["code"] == "admin_required"
        assert f.pharos.config.policy == "cost" and f.pharos.generation == 0
        code, doc, _ = await call(f, method, path, ADMIN, body)
        assert code == 200, doc
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_config_patch_changes_routing_and_refusals_change_nothing() -> None:
    """GET shows the running config with its key hashes redacted and generation 0; a live
    patch is applied (the next reply names the new policy, the generation moves); a patch
    touching a restart-only field or an unknown one is refused whole with every error."""
    f = await fleet()
    try:
        code, doc, _ = await call(f, "GET", "/admin/config", ADMIN)
        assert code == 200 and doc["generation"] == 0 and doc["patched"] is False
        assert digest(ADMIN) not in json.dumps(doc)
        assert {k["sha256"] for k in doc["config"]["keys"]} == {"<redacted>"}
        assert doc["config"]["policy"] == "cost"

        code, doc, _ = await call(f, "PATCH", "/admin/config", ADMIN,
                                  {"policy": "least-load", "listen": ":1", "routing": {"z": 1}})
        assert code == 422, doc
        assert doc["error"]["code"] == "invalid_config"
        text = "\n".join(doc["errors"])
        assert "routing: unknown field 'z'" in text
        assert f.pharos.config.policy == "cost" and f.pharos.generation == 0

        code, doc, _ = await call(f, "PATCH", "/admin/config", ADMIN, {"listen": ":1"})
        assert code == 422 and doc["errors"] == [
            "listen: needs a restart; a patch changes only live fields (edit the file and "
            "restart)"]

        code, doc, _ = await call(f, "PATCH", "/admin/config", ADMIN,
                                  {"policy": "least-load", "routing": {"shadow": ["p2c"]}})
        assert code == 200, doc
        assert doc["applied"] == ["policy", "routing.shadow"]
        assert doc["generation"] == 1 and doc["patched"] is True
        assert doc["config"]["policy"] == "least-load"
        r = await chat(f, next(iter(f.pharos.state.models())), "hi")
        assert r.headers.getRawHeaders(b"x-pharos-policy") == [b"least-load"]

        code, doc, _ = await call(f, "PATCH", "/admin/config", ADMIN, {"policy": None})
        assert code == 200 and doc["applied"] == ["policy"] and doc["generation"] == 2
        assert f.pharos.config.policy == "cost"
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_backends_show_plan_signals_estimates_and_capacity() -> None:
    """Each backend: kind, version, its plan's active and dropped probes, ejection state,
    and per target the capacity with its source (the engine's or the config's) and the
    learned estimates, unknown as null."""
    f = await fleet()
    try:
        code, doc, _ = await call(f, "GET", "/admin/backends", ADMIN)
        assert code == 200
        by_url = {b["url"]: b for b in doc["backends"]}
        vllm, ollama = by_url[f.doubles[0].url], by_url[f.doubles[1].url]
        assert vllm["kind"] == "vllm" and ollama["kind"] == "ollama"
        assert vllm["up"] is True and vllm["ejection"]["ejected"] is False
        assert vllm["plan"]["active"], vllm["plan"]
        assert all({"probe", "signal", "source"} <= set(p) for p in vllm["plan"]["active"])
        assert isinstance(vllm["plan"]["dropped"], list)
        assert ollama["config"]["capacity"] == 3
        assert ollama["targets"] and all(t["capacity"] == 3 and t["capacity_source"] == "config"
                                         for t in ollama["targets"])
        t = vllm["targets"][0]
        assert set(t["estimates"]) == {"prefill_sec_per_token", "load_sec", "service_sec"}
        assert t["estimates"]["load_sec"] == {"value": None, "samples": 0}
        assert t["capacity_source"] in ("engine", "learned", "default")
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_index_counts_entries_per_target_without_prompt_text() -> None:
    """After a request, the index has entries, an estimate of their bytes, and the entries
    predicted on the target that served it; ``list`` shows hashes only, never the prompt."""
    f = await fleet()
    try:
        code, doc, _ = await call(f, "GET", "/admin/index", ADMIN)
        assert code == 200 and doc["entries"] == 0 and doc["targets"] == []
        model = next(iter(f.pharos.state.models()))
        r = await chat(f, model, PROMPT)
        assert r.code == 200
        code, doc, _ = await call(f, "GET", "/admin/index?list=10", ADMIN)
        assert code == 200
        assert doc["entries"] >= 2 and doc["bytes_estimate"] > 0
        assert doc["capacity"] == f.pharos.sched.index.capacity
        backend = r.headers.getRawHeaders(b"x-pharos-backend")[0].decode()
        row = next(t for t in doc["targets"] if t["backend"] == backend)
        assert row["model"] == model and row["predicted_entries"] == doc["entries"]
        assert len(doc["recent"]) == doc["entries"]
        assert all(len(e["hash"]) == 16 for e in doc["recent"])
        assert PROMPT not in json.dumps(doc)
        code, doc, _ = await call(f, "GET", "/admin/index?list=x", ADMIN)
        assert code == 400
    finally:
        await f.stop()


@pytest_twisted.ensureDeferred
async def test_the_files_next_change_replaces_a_patch(tmp_path: Path) -> None:
    """With a config file watched, a patch holds until the file is read again: then the
    file's values are in force (the patched field goes back to what the file says)."""
    path = tmp_path / "pharos.yaml"
    path.write_text(f"listen: 127.0.0.1:0\npolicy: cost\nkeys: [{{name: ops, sha256: "
                    f"{digest(ADMIN)}, admin: true}}]\n")
    top = PharosService.from_config(reactor, load_config(path), load_interval=0.1,
                                     config_path=str(path))
    top.startService()
    port, url = serve(top.site)
    f = Fleet([], top, url, HTTPConnectionPool(reactor, persistent=False), [port])
    try:
        code, doc, _ = await call(f, "PATCH", "/admin/config", ADMIN, {"policy": "p2c"})
        assert code == 200
        code, doc, _ = await call(f, "GET", "/admin/config", ADMIN)
        assert doc["file"] == str(path) and doc["config"]["policy"] == "p2c"
        assert doc["generation"] == 1
        path.write_text(path.read_text() + "timeouts: {stream_idle: 50s}\n")
        assert top.watcher is not None and top.watcher.check()
        code, doc, _ = await call(f, "GET", "/admin/config", ADMIN)
        assert doc["patched"] is False and doc["generation"] == 2
        assert doc["config"]["policy"] == "cost"
        assert doc["config"]["timeouts"]["stream_idle"] == 50.0
    finally:
        await f.pool.closeCachedConnections()
        await top.stopService()
        await close(port)
