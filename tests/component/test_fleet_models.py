"""Layer 3 (issue 17 items 1 and 3): fleet aliases, A/B splits and shadow policies through
Pharos in front of engine doubles on loopback. The engines record the bodies they receive, so
the tests assert the name each engine was sent, not only that replies came back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.web.http_headers import Headers

from pharos import policy as policy_module
from pharos.cli import main as cli_main
from pharos.config import Observability, RoutingConfig
from pharos.models import ModelSpec
from pharos.shadow import main_replay, replay
from tests.support.fleet import Fleet, eventually, sleep, start_fleet

VLLM_NAME = "meta-llama/Llama-3.1-8B-Instruct"
CPP_NAME = "llama3.1-8b-q4"
FLEET_NAME = "llama-8b"
SIZE = 4_000_000_000


def record(fleet: Fleet) -> dict[str, list[Any]]:
    """The model names each engine is sent, by engine URL (the doubles' POST wrapped)."""
    seen: dict[str, list[Any]] = {}
    for d in fleet.doubles:
        names = seen.setdefault(d.url, [])
        original = d._post

        def post(request: Any, original: Any = original, names: list[Any] = names) -> Any:
            raw = request.content.read()
            request.content.seek(0)
            names.append(json.loads(raw).get("model"))
            return original(request)

        d._post = post  # type: ignore[method-assign]
    return seen


async def two_names(**config: Any) -> Fleet:
    """A vLLM double serving VLLM_NAME and a llama.cpp double serving CPP_NAME, one fleet
    model over both."""
    models = config.pop("models", (ModelSpec(FLEET_NAME, (CPP_NAME, VLLM_NAME)),))
    return await start_fleet([
        ("vllm", {"models": {VLLM_NAME: SIZE}}, {"kind": "vllm", "capacity": 8}),
        ("llamacpp", {"models": {CPP_NAME: SIZE}}, {"kind": "llamacpp", "capacity": 8}),
    ], policy=config.pop("policy", "round-robin"), models=models, **config)


async def body(response: Any) -> Any:
    return json.loads(await response.content())


@pytest_twisted.ensureDeferred
async def test_each_engine_receives_the_name_it_serves() -> None:
    """Requests for the fleet name, for either alias, and with no model at all (the fleet
    serves exactly one) all succeed, and every body an engine received names its own model;
    /v1/models lists the fleet name and its aliases; the reply names its policy."""
    fleet = await two_names()
    seen = record(fleet)
    try:
        listed = await body(await treq.get(fleet.url + "/v1/models", pool=fleet.pool))
        ids = {m["id"]: m.get("alias_of") for m in listed["data"]}
        assert ids == {FLEET_NAME: None, CPP_NAME: FLEET_NAME, VLLM_NAME: FLEET_NAME}
        one = await treq.get(fleet.url + "/v1/models/" + CPP_NAME, pool=fleet.pool)
        assert (await body(one))["id"] == FLEET_NAME
        for model in [FLEET_NAME] * 6 + [CPP_NAME, VLLM_NAME]:
            r = await fleet.chat(model, stream=model == CPP_NAME)
            assert r.code == 200, await r.content()
            assert r.headers.getRawHeaders(b"x-pharos-policy") == [b"round-robin"]
            await r.content()
        r = await fleet.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "no model named"}], "max_tokens": 4})
        assert r.code == 200, await r.content()
        await r.content()
        vllm, cpp = (seen[d.url] for d in fleet.doubles)
        assert len(vllm) >= 4 and len(cpp) >= 4, seen  # round robin: both engines
        assert set(vllm) == {VLLM_NAME} and set(cpp) == {CPP_NAME}
        assert len(vllm) + len(cpp) == 9
        # Pharos's own model name everywhere else: metrics, targets.
        assert {t.model for t in fleet.pharos.state.targets} == {FLEET_NAME}
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_ollama_and_vllm_each_receive_the_name_they_serve() -> None:
    """The issue's own example: ``llama-8b`` served as ``llama3.1:8b`` by Ollama and as
    ``meta-llama/Llama-3.1-8B-Instruct`` by vLLM. OpenAI requests for the fleet name reach
    both engines, each under its own name; Ollama's native /api/chat and /api/generate (Ollama
    backends only) for the fleet name or the vLLM alias reach Ollama as ``llama3.1:8b``."""
    ollama_name = "llama3.1:8b"
    fleet = await start_fleet([
        ("vllm", {"models": {VLLM_NAME: SIZE}}, {"kind": "vllm", "capacity": 8}),
        ("ollama", {"models": {ollama_name: SIZE}, "loaded": [ollama_name]},
         {"kind": "ollama", "capacity": 8}),
    ], policy="round-robin", models=(ModelSpec(FLEET_NAME, (ollama_name, VLLM_NAME)),))
    seen = record(fleet)
    try:
        for model in [FLEET_NAME] * 6 + [ollama_name, VLLM_NAME]:
            r = await fleet.chat(model)
            assert r.code == 200, await r.content()
            await r.content()
        native: list[tuple[str, dict[str, Any]]] = [
            ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}),
            ("/api/generate", {"prompt": "hi"})]
        for path, rest in native:
            for model in (FLEET_NAME, VLLM_NAME):
                r = await fleet.post(path, {"model": model, "stream": False,
                                            "options": {"num_predict": 4}, **rest})
                assert r.code == 200, (path, model, await r.content())
                await r.content()
        vllm, ollama_seen = (seen[d.url] for d in fleet.doubles)
        assert len(vllm) >= 3 and len(ollama_seen) >= 3 + 4, seen
        assert set(vllm) == {VLLM_NAME} and set(ollama_seen) == {ollama_name}
        assert len(vllm) + len(ollama_seen) == 8 + 4
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_model_omitted_with_two_models_served_is_a_400() -> None:
    """With two models served, a request naming none is refused in the client's shape."""
    fleet = await two_names(models=())
    try:
        r = await fleet.post("/v1/chat/completions", {"messages": [], "max_tokens": 4})
        assert r.code == 400
        assert "model" in (await body(r))["error"]["message"]
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_split_keeps_a_conversation_on_its_arm_and_shadows_are_counted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 50/50 split: one conversation always gets the same policy (x-pharos-policy), both
    arms are used across conversations; the shadow policies ran on every routed decision
    (GET /admin/shadow, /metrics), and the shadow log replays clean; an edited line is
    caught, by ``replay`` and by ``pharos replay-shadow LOG`` (exit 1, the line named)."""
    log = tmp_path / "shadow.jsonl"
    fleet = await two_names(
        models=(ModelSpec(FLEET_NAME, (CPP_NAME, VLLM_NAME),
                          split=(("cost", 50), ("least-load", 50)),
                          shadow=("p2c", "round-robin", "prefix-hash")),),
        observability=Observability(shadow_log=str(log)))
    try:
        arms: dict[str, set[str]] = {}
        sent = 0
        for conversation in range(12):
            for _ in range(2):
                r = await treq.post(
                    fleet.url + "/v1/chat/completions",
                    json.dumps({"model": FLEET_NAME, "max_tokens": 4, "messages": [
                        {"role": "user", "content": "hello"}]}).encode(),
                    headers=Headers({b"content-type": [b"application/json"],
                                     b"x-session-id": [f"conversation-{conversation}".encode()]}),
                    pool=fleet.pool)
                assert r.code == 200
                await r.content()
                sent += 1
                policy = r.headers.getRawHeaders(b"x-pharos-policy")[0].decode()
                arms.setdefault(str(conversation), set()).add(policy)
        assert all(len(p) == 1 for p in arms.values()), arms
        assert set().union(*arms.values()) == {"cost", "least-load"}
        shadow = fleet.pharos.shadow
        await eventually(lambda: shadow.pending() == 0)
        doc = await body(await treq.get(fleet.url + "/admin/shadow", pool=fleet.pool))
        per_shadow: dict[str, int] = {}
        for t in doc["tallies"]:
            per_shadow[t["shadow"]] = per_shadow.get(t["shadow"], 0) + t["decisions"]
            assert 0 <= t["agree"] <= t["decisions"]
        assert per_shadow == {"p2c": sent, "round-robin": sent, "prefix-hash": sent}
        assert doc["dropped"] == 0 and doc["errors"] == {}
        metrics = (await (await treq.get(fleet.url + "/metrics", pool=fleet.pool)).content()
                   ).decode()
        assert 'pharos_policy_requests_total{model="llama-8b",policy="cost",status="200"}' \
            in metrics
        assert "pharos_shadow_decisions_total" in metrics
    finally:
        await fleet.stop()
    lines = log.read_text().splitlines()
    assert json.loads(lines[0])["type"] == "config"
    assert sum(json.loads(x)["type"] == "shadow" for x in lines) == sent
    assert "conversation" not in log.read_text() and "hello" not in log.read_text()
    assert main_replay([str(log)]) == 0
    tampered = json.loads(lines[3])
    tampered["candidates"][0]["free_slots"] += 1
    edited = [*lines[:3], json.dumps(tampered), *lines[4:]]
    checked, problems = replay(edited)
    assert checked == sent and any(p.startswith("line 4: its sha") for p in problems)
    dropped = [*lines[:2], *lines[3:]]
    assert any("line 3: does not follow" in p for p in replay(dropped)[1])
    # The console command on files: 0 for the log as written, 1 naming the tampered line.
    tampered_file = tmp_path / "tampered.jsonl"
    tampered_file.write_text("\n".join(edited) + "\n")
    capsys.readouterr()
    for path, code in [(log, 0), (tampered_file, 1)]:
        with pytest.raises(SystemExit) as exit_:
            cli_main(["replay-shadow", str(path)])
        assert exit_.value.code == code, path
    out = capsys.readouterr().out
    assert f"{sent} shadow decisions replayed, 0 problems" in out
    assert "line 4: its sha" in out and out.count(f"{sent} shadow decisions replayed") == 2


@pytest_twisted.ensureDeferred
async def test_a_retry_keeps_its_split_arm() -> None:
    """One engine answers every request 503 (busy: retried elsewhere): each request that
    was routed there is routed again, and both of its decisions use the policy of its
    conversation's arm, the one its reply names; both arms saw retries."""
    fleet = await two_names(models=(ModelSpec(FLEET_NAME, (CPP_NAME, VLLM_NAME),
                                              split=(("cost", 50), ("least-load", 50))),))
    busy = fleet.doubles[0]

    def refuse(request: Any) -> bytes:
        request.setResponseCode(503)
        request.setHeader(b"content-type", b"application/json")
        return b'{"error": {"message": "busy", "type": "server_error", "code": 503}}'

    busy._post = refuse  # type: ignore[method-assign]
    sched = fleet.pharos.sched
    routed: list[tuple[int, str | None, str]] = []
    original = sched.on_route

    def on_route(req: Any, placed: Any) -> None:
        chosen = next(c for c in placed.candidates if c.target_id == placed.decision.target_id)
        url = next(t.backend.url for t in fleet.pharos.state.targets
                   if t.id == chosen.target_id)
        routed.append((req.seed, req.policy.name if req.policy else None, url))
        if original is not None:
            original(req, placed)

    sched.on_route = on_route
    retried: dict[str, int] = {}
    try:
        for conversation in range(16):
            before = len(routed)
            r = await treq.post(
                fleet.url + "/v1/chat/completions",
                json.dumps({"model": FLEET_NAME, "max_tokens": 4, "messages": [
                    {"role": "user", "content": f"turn of {conversation}"}]}).encode(),
                headers=Headers({b"content-type": [b"application/json"],
                                 b"x-session-id": [f"retry-{conversation}".encode()]}),
                pool=fleet.pool)
            assert r.code == 200, await r.content()
            await r.content()
            arm_ = r.headers.getRawHeaders(b"x-pharos-policy")[0].decode()
            mine = routed[before:]
            assert len({seed for seed, _, _ in mine}) == 1, mine  # one request (its seed)
            assert {name for _, name, _ in mine} == {arm_}, (arm_, mine)
            assert mine[-1][2] != busy.url
            if len(mine) == 2:
                assert mine[0][2] == busy.url
                retried[arm_] = retried.get(arm_, 0) + 1
        assert set(retried) == {"cost", "least-load"}, (retried, routed, busy.url)
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_shadow_policy_that_raises_never_touches_the_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A shadow policy raising on every decision is counted; every request still succeeds."""
    def broken(*args: Any) -> Any:
        raise RuntimeError("shadow bug")

    monkeypatch.setitem(policy_module.POLICIES, "random", broken)
    fleet = await two_names(routing=RoutingConfig(shadow=("random", "p2c")))
    try:
        for _ in range(5):
            r = await fleet.chat(FLEET_NAME)
            assert r.code == 200
            await r.content()
        await eventually(lambda: fleet.pharos.shadow.pending() == 0)
        await sleep(0.05)
        doc = fleet.pharos.shadow.doc()
        assert doc["errors"] == {"random": 5}
        assert sum(t["decisions"] for t in doc["tallies"] if t["shadow"] == "p2c") == 5
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_reload_changes_aliases_split_and_shadow_live() -> None:
    """``reconfigure`` with a new models list applies at once: the next request routes by
    the new policy and the old fleet name is gone, a new one is served."""
    fleet = await two_names()
    try:
        top = fleet.pharos
        new = dataclasses.replace(top.config, models=(
            ModelSpec("llama-3.1", (CPP_NAME, VLLM_NAME), policy="p2c",
                      shadow=("cost",)),))
        top.reconfigure(new)
        await eventually(lambda: "llama-3.1" in top.state.models(), timeout=10)
        r = await fleet.chat("llama-3.1")
        assert r.code == 200
        assert r.headers.getRawHeaders(b"x-pharos-policy") == [b"p2c"]
        await r.content()
        assert top.shadow.fleet.generation == 1
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_admin_shadow_needs_an_admin_key() -> None:
    """Once keys are configured, ``GET /admin/shadow`` is 401 without a key, 403 with a
    user's and 200 with an admin's; a user's key allowed the fleet name may use an alias."""
    from pharos.config import Key
    from pharos.proxy.auth import digest

    admin, user = "phk-admin-shadow", "phk-user-shadow"
    fleet = await two_names(keys=(Key(name="ops", sha256=digest(admin), admin=True),
                                  Key(name="u", sha256=digest(user), models=(FLEET_NAME,))))
    try:
        async def get(key: str | None) -> int:
            h = Headers({b"authorization": [f"Bearer {key}".encode()]} if key else {})
            r = await treq.get(fleet.url + "/admin/shadow", headers=h, pool=fleet.pool)
            await r.content()
            return int(r.code)

        assert [await get(None), await get(user), await get(admin)] == [401, 403, 200]
        r = await treq.post(fleet.url + "/v1/chat/completions", json.dumps(
            {"model": CPP_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
        ).encode(), headers=Headers({b"authorization": [f"Bearer {user}".encode()],
                                     b"content-type": [b"application/json"]}), pool=fleet.pool)
        assert r.code == 200, await r.content()
        await r.content()
    finally:
        await fleet.stop()
