"""Layer 3: Pharos routes and relays through real sockets to engine doubles on loopback."""

from __future__ import annotations

import json
import socket
from typing import Any

import attr
import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred, fail
from twisted.internet.error import ConnectionDone
from twisted.internet.threads import deferToThread
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseNeverReceived
from twisted.web.server import Request

from tests.support.capture_server import CaptureResource, close, serve
from tests.support.captures import all_captures, capture_id
from tests.support.fleet import eventually, sleep, start_fleet

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
        # the two granted requests may still be on their way to the engine (a new pooled
        # connection) when the third is queued: wait for both, not one then the other
        await eventually(lambda: fleet.pharos.sched.waiting == 1 and double.running == 2)
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


class FailingVllm(CaptureResource):
    """Answers status paths like vLLM's idle capture, and every POST with ``status``."""

    posts = 0
    status = 500

    def render_POST(self, request: Request) -> bytes:
        self.posts += 1
        request.setResponseCode(self.status)
        request.setHeader(b"content-type", b"application/json")
        return b'{"error":{"message":"out of memory (try --max-num-seqs)","code":%d}}' % (
            self.status)


async def _until_routed_to(fleet: Any, failing: FailingVllm) -> list[tuple[int, bytes]]:
    """Chat requests until one was routed to ``failing``; every (status, body) seen."""
    seen = []
    for _ in range(40):  # ties between the two go by each request's seed
        r = await fleet.chat("tiny")
        seen.append((r.code, await r.content()))
        if failing.posts:
            break
    assert failing.posts >= 1, "no request was routed to the failing engine"
    return seen


@pytest.mark.parametrize("status", [502, 503, 504])
@pytest_twisted.ensureDeferred
async def test_502_503_504_are_retried_elsewhere_but_not_ejected(status: int) -> None:
    """An engine that answers 502, 503 or 504 before any byte reached the client: the request
    is retried on another target and succeeds; the engine is not ejected; usage counts each
    request once, with the tokens of the reply the client got."""
    vllm_idle = next(c for c in all_captures() if capture_id(c) == "vllm/0.32.0/idle")
    failing = FailingVllm(vllm_idle, reactor)
    failing.status = status
    port, url = serve(failing)
    fleet = await start_fleet([("vllm", {}, {"kind": "vllm"})], extra=[url])
    try:
        seen = await _until_routed_to(fleet, failing)
        assert {code for code, _ in seen} == {200}
        assert not fleet.pharos.state.backends[url].ejected
        ledger = fleet.pharos.ledger
        (row,) = ledger.rows(ledger.today(), ledger.today())
        tokens = [json.loads(body)["usage"] for _, body in seen]
        assert row["requests"] == len(seen)
        assert row["prompt_tokens"] == sum(u["prompt_tokens"] for u in tokens)
        assert row["completion_tokens"] == sum(u["completion_tokens"] for u in tokens)
    finally:
        await fleet.stop()
        await close(port)


@pytest_twisted.ensureDeferred
async def test_500_is_the_requests_fault_and_not_retried() -> None:
    """A 500 is passed to the client as the engine sent it (the request caused it; another
    engine would only fail it again): one POST, the engine's body, no ejection."""
    vllm_idle = next(c for c in all_captures() if capture_id(c) == "vllm/0.32.0/idle")
    failing = FailingVllm(vllm_idle, reactor)
    port, url = serve(failing)
    fleet = await start_fleet([("vllm", {}, {"kind": "vllm"})], extra=[url])
    try:
        seen = await _until_routed_to(fleet, failing)
        assert seen[-1][0] == 500
        assert b"max-num-seqs" in seen[-1][1]
        assert failing.posts == 1
        assert not fleet.pharos.state.backends[url].ejected
    finally:
        await fleet.stop()
        await close(port)


@pytest_twisted.ensureDeferred
async def test_refused_connection_is_retried_and_ejected() -> None:
    """An engine whose port stopped listening refuses the connection: the request goes to the
    other engine, and the refusing one is ejected until it answers a scrape round again."""
    fleet = await start_fleet([("vllm", {}, {"kind": "vllm"}), ("vllm", {}, {"kind": "vllm"})])
    a, b = fleet.doubles
    try:
        await close(fleet.ports[0])  # a's port: new connections to it are now refused
        a.kill()  # and the pooled ones are gone
        await sleep(0.05)
        seen = set()
        for _ in range(40):  # ties between the two go by each request's seed
            r = await fleet.chat("tiny")
            await r.content()
            assert r.code == 200
            seen.add(r.headers.getRawHeaders(b"x-pharos-backend")[0].decode())
            if fleet.pharos.state.backends[a.url].ejected:
                break
        assert seen == {b.url}
        assert fleet.pharos.state.backends[a.url].ejected
    finally:
        fleet.ports.pop(0)
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_usage_stripped_on_every_engines_stream() -> None:
    """On Ollama's, llama.cpp's and vLLM's recorded stream shapes, a client that did not ask
    for usage gets a stream without the usage chunk, and one that asked gets it."""
    fleet = await start_fleet([
        ("ollama", {"loaded": [LLAMA]}, {"kind": "ollama"}),
        ("llamacpp", {}, {"kind": "llamacpp", "aliases": {"tiny": "cpp"}}),
        ("vllm", {}, {"kind": "vllm"}),
    ])
    try:
        for model in (LLAMA, "cpp", "tiny"):
            plain = (await (await fleet.chat(model, stream=True)).content()).decode()
            asked = (await (await fleet.chat(
                model, stream=True, stream_options={"include_usage": True})).content()).decode()
            events = [e for e in plain.split("\n\n") if e.startswith("data: {")]
            assert events and all('"choices":[]' not in e for e in events), model
            assert plain.rstrip().endswith("data: [DONE]"), model
            assert any('"choices":[]' in e and '"usage"' in e for e in asked.split("\n\n")), model
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_healthz_is_503_until_the_first_round() -> None:
    """/healthz answers 503 while no scrape round has finished, 200 after."""
    fleet = await start_fleet([("vllm", {}, {"kind": "vllm"})])
    try:
        r = await treq.get(fleet.url + "/healthz", pool=fleet.pool)
        assert r.code == 200
        fleet.pharos.state.ready = False
        r = await treq.get(fleet.url + "/healthz", pool=fleet.pool)
        assert r.code == 503
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_ollama_routes_and_aggregates() -> None:
    """HEAD / answers like Ollama; /api/version is the oldest Ollama's; /api/tags and /api/ps
    gather every Ollama host; a native chat goes only to Ollama backends."""
    fleet = await start_fleet([
        ("ollama", {"loaded": [LLAMA]}, {"kind": "ollama"}),
        ("ollama", {"loaded": [QWEN]}, {"kind": "ollama"}),
        ("vllm", {}, {"kind": "vllm"}),
    ])
    try:
        r = await treq.head(fleet.url + "/", pool=fleet.pool)
        assert r.code == 200
        r = await treq.get(fleet.url + "/api/version", pool=fleet.pool)
        assert json.loads(await r.content()) == {"version": "0.32.15"}
        tags = json.loads(await (await treq.get(fleet.url + "/api/tags",
                                               pool=fleet.pool)).content())
        assert {m["name"] for m in tags["models"]} >= {LLAMA, QWEN}
        ps = json.loads(await (await treq.get(fleet.url + "/api/ps", pool=fleet.pool)).content())
        assert {m["name"] for m in ps["models"]} == {LLAMA, QWEN}
        r = await fleet.post("/api/chat", {"model": "tiny", "stream": False,
                                           "messages": [{"role": "user", "content": "x"}]})
        assert r.code == 404  # vLLM's model is not served by any Ollama backend
        r = await fleet.post("/api/chat", {"model": LLAMA, "stream": False,
                                           "messages": [{"role": "user", "content": "x"}]})
        assert r.code == 200
        assert json.loads(await r.content())["done"] is True
        # model management goes to one Ollama backend: with two up and none named, a 409
        r = await fleet.post("/api/pull", {"model": LLAMA})
        assert r.code == 409
        assert "x-pharos-backend" in json.loads(await r.content())["error"]
        # a served route with the wrong method is 405, an unknown one 404, in Ollama's shape
        r = await treq.get(fleet.url + "/api/chat", pool=fleet.pool)
        assert r.code == 405 and r.headers.getRawHeaders(b"allow") == [b"POST"]
        assert isinstance(json.loads(await r.content())["error"], str)
        r = await treq.get(fleet.url + "/api/nothing", pool=fleet.pool)
        assert r.code == 404
        assert isinstance(json.loads(await r.content())["error"], str)
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_agent_route_an_engine_lacks_is_400_route_not_served() -> None:
    """/v1/messages on an engine that answers 404 is retried elsewhere; with nowhere else to
    go the client gets a 400 naming the backend (coding agents read any 404 as a bad model),
    in Anthropic's error shape, as is an unknown model there; /v1/responses keeps OpenAI's."""
    fleet = await start_fleet([("vllm", {}, {"kind": "vllm"})])
    try:
        r = await fleet.post("/v1/messages", {"model": "tiny", "max_tokens": 4,
                                              "messages": [{"role": "user", "content": "x"}]})
        body = json.loads(await r.content())
        r404 = await fleet.post("/v1/messages", {"model": "nope", "max_tokens": 4,
                                                 "messages": []})
        unknown = json.loads(await r404.content())
        r2 = await fleet.post("/v1/responses", {"model": "tiny", "input": "x"})
        responses = json.loads(await r2.content())
    finally:
        await fleet.stop()
    assert r.code == 400
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert fleet.doubles[0].url in body["error"]["message"]
    assert r404.code == 404 and unknown["error"]["type"] == "not_found_error"
    assert r2.code == 400 and responses["error"]["code"] == "route_not_served"


class StaleOnce:
    """A treq client whose first POST dies as on a pooled connection the engine had closed."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.failed = 0

    def request(self, method: str, url: str, **kw: Any) -> Any:
        if method == "POST" and not self.failed:
            self.failed += 1
            return fail(ResponseNeverReceived([Failure(ConnectionDone())]))
        return self.client.request(method, url, **kw)


@pytest_twisted.ensureDeferred
async def test_dead_pooled_connection_is_retried_on_the_same_engine() -> None:
    """A POST lost on a connection the engine had closed is sent again on a fresh one: the
    client gets its answer, even with one backend, and the engine is not ejected."""
    fleet = await start_fleet([("vllm", {}, {"kind": "vllm"})])
    engine = fleet.pharos.public.engine
    shim = StaleOnce(engine.client)
    fleet.pharos.public.engine = attr.evolve(engine, client=shim)  # type: ignore[arg-type]
    try:
        r = await fleet.chat("tiny")
        await r.content()
    finally:
        await fleet.stop()
    assert r.code == 200
    assert shim.failed == 1
    assert not fleet.pharos.state.backends[fleet.doubles[0].url].ejected


class GzipVllm(CaptureResource):
    """Status paths like vLLM's idle capture; a chat completion answers gzip-compressed."""

    def render_POST(self, request: Request) -> bytes:
        import gzip

        body = b"".join(f'data: {{"choices":[{{"delta":{{"content":"w{i}"}}}}]}}\n\n'.encode()
                        for i in range(50)) + b"data: [DONE]\n\n"
        request.setHeader(b"content-type", b"text/event-stream")
        request.setHeader(b"content-encoding", b"gzip")
        return gzip.compress(body)


@pytest_twisted.ensureDeferred
async def test_compressed_reply_relays_decoded() -> None:
    """treq always asks for gzip; a compressed engine reply reaches the client decoded, whole,
    without a content-encoding header that would no longer be true."""
    capture = next(c for c in all_captures() if capture_id(c) == "vllm/0.32.0/idle")
    port, url = serve(GzipVllm(capture, reactor))
    fleet = await start_fleet([], extra=[url])
    try:
        # a raw socket shows the bytes exactly as Pharos sent them
        raw = await deferToThread(_raw_post, fleet.url, b'{"model":"tiny","stream":true}')
    finally:
        await fleet.stop()
        await close(port)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.split(b" ", 2)[1] == b"200"
    assert b"content-encoding" not in head.lower()
    assert b"data: [DONE]" in body and body.count(b"data: {") == 50


def _raw_post(url: str, body: bytes) -> bytes:
    """POST over a plain socket (HTTP/1.0, so the reply ends with the connection)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out



class MessagesErrorVllm(CaptureResource):
    """Status paths like vLLM's idle capture; /v1/messages answers 400 in OpenAI's shape."""

    def render_POST(self, request: Request) -> bytes:
        request.setResponseCode(400)
        request.setHeader(b"content-type", b"application/json")
        return (b'{"error":{"message":"max_tokens 99999 is too large (--max-model-len)",'
                b'"type":"BadRequestError","param":null,"code":400}}')


@pytest_twisted.ensureDeferred
async def test_an_engines_error_on_messages_reaches_the_client_in_anthropics_shape() -> None:
    """An OpenAI-shaped 400 from the engine on /v1/messages is reshaped to Anthropic's
    ``{"type": "error", "error": {"type", "message"}}`` with the engine's message, not
    retried; the status is the engine's."""
    capture = next(c for c in all_captures() if capture_id(c) == "vllm/0.32.0/idle")
    engine = MessagesErrorVllm(capture, reactor)
    port, url = serve(engine)
    fleet = await start_fleet([], extra=[url])
    try:
        r = await fleet.post("/v1/messages", {"model": "tiny", "max_tokens": 99999,
                                              "messages": [{"role": "user", "content": "x"}]})
        body = json.loads(await r.content())
    finally:
        await fleet.stop()
        await close(port)
    assert r.code == 400
    assert body == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "max_tokens 99999 is too large (--max-model-len)"}}
