"""Layer 3: Pharos routes and relays through real sockets to engine doubles on loopback."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest_twisted
import treq
from twisted.internet.defer import ensureDeferred

from tests.component.fleet import eventually, start_fleet

QWEN, LLAMA = "qwen3:8b", "llama3.2:3b"


@pytest_twisted.ensureDeferred
async def test_prefers_the_warm_target() -> None:
    """Of two Ollama hosts serving a model, the one that has it loaded gets the request."""
    fleet = await start_fleet([
        ("ollama", {"loaded": [LLAMA]}, {"kind": "ollama", "memory_gb": 10}),
        ("ollama", {"loaded": []}, {"kind": "ollama", "memory_gb": 10}),
    ])
    try:
        r = await fleet.chat(LLAMA)
        body = json.loads(await r.content())
        assert r.code == 200, body
        assert r.headers.getRawHeaders(b"x-pharos-backend") == [fleet.doubles[0].url.encode()]
        assert "warm" in r.headers.getRawHeaders(b"x-pharos-reason")[0].decode()
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_queues_when_every_slot_is_busy() -> None:
    """Requests beyond the engine's slots wait in Pharos's queue and are served as slots
    free, none lost."""
    fleet = await start_fleet([("llamacpp", {"slots": 2}, {"kind": "llamacpp"})])
    double = fleet.doubles[0]
    try:
        double.hold()
        replies = [ensureDeferred(fleet.chat("tiny")) for _ in range(3)]
        await eventually(lambda: fleet.pharos.sched.waiting == 1)
        assert double.running == 2
        double.release()
        codes = [(await r).code for r in replies]
        assert codes == [200, 200, 200]
        assert double.stats.completed == 3
        assert fleet.pharos.sched.waiting == 0
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_unknown_model_404_and_bad_input_in_api_shape() -> None:
    """Unknown model: 404 model_not_found (OpenAI shape); Ollama route: Ollama shape;
    malformed JSON 400; wrong method 405; a body over the limit 413."""
    fleet = await start_fleet([("ollama", {"loaded": [LLAMA]}, {"kind": "ollama"})])
    try:
        r = await fleet.chat("nope")
        assert r.code == 404
        assert json.loads(await r.content())["error"]["code"] == "model_not_found"
        r = await fleet.post("/api/chat", {"model": "nope", "messages": []})
        assert r.code == 404
        assert isinstance(json.loads(await r.content())["error"], str)
        r = await treq.post(fleet.url + "/v1/chat/completions", b"{oops", pool=fleet.pool)
        assert r.code == 400
        r = await treq.get(fleet.url + "/v1/chat/completions", pool=fleet.pool)
        assert r.code == 405
        r = await treq.post(fleet.url + "/v1/chat/completions", b"x" * (33 * 1024 * 1024),
                            pool=fleet.pool)
        assert r.code == 413
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_usage_chunk_added_and_stripped() -> None:
    """A streamed chat that did not ask for usage gets none in its stream (Pharos asked and
    stripped it); one that asked gets the usage chunk untouched."""
    fleet = await start_fleet([("vllm", {}, {"kind": "vllm"})])
    try:
        r = await fleet.chat("tiny", stream=True)
        plain = (await r.content()).decode()
        r = await fleet.chat("tiny", stream=True, stream_options={"include_usage": True})
        asked = (await r.content()).decode()
    finally:
        await fleet.stop()
    assert '"usage"' not in plain and plain.rstrip().endswith("data: [DONE]")
    assert '"choices":[]' in asked and '"usage"' in asked


@pytest_twisted.ensureDeferred
async def test_client_disconnect_frees_the_slot_and_stops_the_engine() -> None:
    """A client that leaves mid-stream: the engine request is cancelled, the lease freed."""
    fleet = await start_fleet([("llamacpp", {"slots": 2}, {"kind": "llamacpp"})])
    double = fleet.doubles[0]
    try:
        double.hold()
        port = int(fleet.url.rsplit(":", 1)[1])
        s = socket.create_connection(("127.0.0.1", port))
        body = json.dumps({"model": "tiny", "stream": True, "max_tokens": 500,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: " + str(len(body)).encode()
                  + b"\r\n\r\n" + body)
        await eventually(lambda: double.running == 1)
        target = fleet.target(double, "tiny")
        assert target.inflight == 1
        s.close()
        await eventually(lambda: double.stats.cancelled == 1)
        await eventually(lambda: target.inflight == 0)
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_killed_engine_cuts_only_its_stream_and_the_next_goes_elsewhere() -> None:
    """An engine dying mid-reply cuts that client (an incomplete read, not a clean end), is
    ejected, and the next request goes to the other engine."""
    slow = {"slots": 2, "decode_s": 0.02, "max_output_tokens": 500}
    fleet = await start_fleet([
        ("llamacpp", slow, {"kind": "llamacpp"}),
        ("llamacpp", slow, {"kind": "llamacpp"}),
    ])
    a, b = fleet.doubles
    try:
        response = await fleet.chat("tiny", stream=True, max_tokens=400)
        assert response.code == 200
        body_d = ensureDeferred(_read_all(response))
        victim = a if response.headers.getRawHeaders(b"x-pharos-backend") == [
            a.url.encode()] else b
        other = b if victim is a else a
        await victim.when(lambda: any(j.tokens_done >= 3 for j in victim.jobs))
        victim.kill()
        got: list[object] = []
        try:
            got.append(await body_d)
        except Exception as e:
            got.append(e)
        assert isinstance(got[0], Exception), "the client saw a clean end of a truncated reply"
        assert fleet.pharos.state.backends[victim.url].ejected
        r = await fleet.chat("tiny")
        assert r.code == 200
        assert r.headers.getRawHeaders(b"x-pharos-backend") == [other.url.encode()]
    finally:
        await fleet.stop()


async def _read_all(response: Any) -> bytes:
    return bytes(await treq.content(response))
