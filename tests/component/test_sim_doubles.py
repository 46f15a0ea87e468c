"""The engine doubles over real loopback HTTP: they read like their captures, speak every
recorded reply shape, follow the latency model on an injected clock, and stop generating
when the client leaves or the engine is killed."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.task import Clock
from twisted.web.client import ResponseDone
from twisted.web.iweb import IResponse

from pharos.engine.capture import RecordedReply
from pharos.engine.fetch import CaptureFetcher
from pharos.engine.library import AUTO, LLAMACPP, OLLAMA, VLLM
from pharos.engine.plan import resolve
from pharos.engine.probes import prom_samples
from pharos.engine.signals import WHOLE_BACKEND, Residency
from pharos.sim.double import pinned_capture
from pharos.sim.prompt import GENERATION_ROUTES
from pharos.sim.wire import shape_of, split_events
from tests.support.doubles import Rig, chat, plan_outline, started
from tests.support.sim import run

GB = 10**9
#: Fast enough for real time: replies finish within a reactor turn or two.
INSTANT: dict[str, Any] = {"prefill_s": 0.0, "decode_s": 0.0, "load_s": 0.0}


def ctype(response: IResponse) -> str:
    values = response.headers.getRawHeaders(b"content-type")
    return values[0].decode() if values else ""


# --- 1. resolve reads a double as it reads its capture --------------------------------------


@pytest.mark.parametrize(
    ("kind", "args", "held"),
    [
        (OLLAMA, {"loaded": ("llama3.2:3b", "qwen3:8b"), "slots": 3}, 0),
        (LLAMACPP, {"slots": 2}, 3),
        (VLLM, {"slots": 4}, 5),
    ],
)
@pytest_twisted.ensureDeferred
async def test_resolve_reads_each_double_as_its_capture(
    rigs: list[Rig], kind: str, args: dict[str, Any], held: int
) -> None:
    """resolve over the double's real socket detects the same kind and version, keeps the
    same probes and drops the same ones for the same reasons as resolve over the capture the
    double was cloned from; the values are the double's (held requests running, the rest
    waiting, its slots, its loaded models)."""
    capture = pinned_capture(kind)
    logs = capture.log_lines is not None
    expected, _ = await resolve(CaptureFetcher(capture), AUTO, has_log_feed=logs)
    rig = Rig(kind, Clock(), **args)
    rigs.append(rig)
    rig.double.hold()
    for i in range(held):
        rig.post("/v1/chat/completions", chat(f"request {i}", stream=True))
    await rig.double.when(lambda: rig.double.stats.started == held)
    plan, snap = await resolve(rig.fetcher, AUTO, has_log_feed=logs)
    assert plan_outline(plan) == plan_outline(expected)
    slots = args["slots"]
    running, waiting = min(held, slots), max(0, held - slots)
    if kind == LLAMACPP:
        load = snap.load[WHOLE_BACKEND]
        assert (load.running, load.waiting, load.capacity) == (running, waiting, slots)
    elif kind == VLLM:
        load = snap.load["tiny"]
        assert (load.running, load.waiting) == (running, waiting)
        assert load.kv_usage is not None and 0 < load.kv_usage < 0.01
    else:
        assert snap.residency == {"llama3.2:3b": Residency.LOADED, "qwen3:8b": Residency.LOADED}
        tags = rig.double.flavor.catalogue()
        assert snap.vram_bytes == {m: tags[m] for m in ("llama3.2:3b", "qwen3:8b")}
        assert snap.size_bytes == tags
        lines = rig.double.log_lines()
        assert lines is not None
        follows = list(plan.follow(lines))
        assert follows and follows[-1].load[WHOLE_BACKEND].capacity == slots
    # A scrape round keeps reading it (the plan's probes all answer).
    _, failures = await plan.scrape(rig.fetcher)
    assert failures == ()


# --- 2. every recorded reply shape -----------------------------------------------------------


def _collapsed(shapes: list[Any]) -> list[Any]:
    out: list[Any] = []
    for s in shapes:
        if not out or out[-1] != s:
            out.append(s)
    return out


def outline(body: bytes, content_type: str) -> tuple[str, list[Any]]:
    """A reply's framing and the shapes of its events, repeats folded (token counts differ)."""
    framing, events = split_events(body, content_type)
    return framing.kind + repr(framing.end), _collapsed([
        e if isinstance(e, str) else shape_of(e) for e in events])


def _replies(kind: str) -> list[RecordedReply]:
    return list(pinned_capture(kind).replies)


def _reply_cases() -> list[Any]:
    # a double generates on GENERATION_ROUTES only (not /v1/messages, /v1/responses)
    return [pytest.param(kind, r, id=f"{kind}-{r.name}")
            for kind in (OLLAMA, LLAMACPP, VLLM) for r in _replies(kind)
            if r.status != 200 or r.path in GENERATION_ROUTES]


@pytest.mark.parametrize(("kind", "recorded"), _reply_cases())
@pytest_twisted.ensureDeferred
async def test_every_recorded_reply_shape_is_served(
    rigs: list[Rig], kind: str, recorded: RecordedReply
) -> None:
    """The recorded request gets the recorded status and content type, and a body with the
    recorded framing, keys, key order and event sequence (the double's own tokens and
    numbers); a recorded refusal comes back byte for byte."""
    rig = Rig(kind, **INSTANT)
    rigs.append(rig)
    response, body = await rig.whole(recorded.path, recorded.request)
    assert response.code == recorded.status
    assert ctype(response) == recorded.content_type
    if recorded.status != 200:
        assert body == recorded.body
        assert rig.double.stats.refused == 1
        return
    assert outline(body, ctype(response)) == outline(recorded.body, recorded.content_type)
    assert rig.double.stats.completed == 1


def _status_cases() -> list[Any]:
    out = []
    for kind in (OLLAMA, LLAMACPP, VLLM):
        for path in pinned_capture(kind).paths:
            out.append(pytest.param(kind, path, id=f"{kind}-{path}"))
    return out


@pytest.mark.parametrize(("kind", "path"), _status_cases())
@pytest_twisted.ensureDeferred
async def test_every_recorded_path_is_served_in_its_recorded_shape(
    rigs: list[Rig], kind: str, path: str
) -> None:
    """Each path of paths.tsv answers with its recorded status and content type; JSON bodies
    keep their shape, metrics pages every series, other bodies their bytes."""
    capture = pinned_capture(kind)
    rec = capture.paths[path]
    rig = Rig(kind, Clock(), loaded=("llama3.2:3b",) if kind == OLLAMA else None)
    rigs.append(rig)
    got = await rig.fetcher.fetch(path)
    assert (got.status, got.content_type) == (rec.status, rec.content_type)
    if "json" in rec.content_type and rec.body:
        assert shape_of(json.loads(got.body)) == shape_of(json.loads(rec.body))
    elif path == "/metrics" and rec.status == 200:
        assert list(prom_samples(got.body)) == list(prom_samples(rec.body))
        def series(page: bytes) -> list[str]:
            # the pool's labels name the double's own pool (vllm:cache_config_info)
            return [ln.partition("{")[0] if ln.startswith("vllm:cache_config_info")
                    else ln.rpartition(" ")[0] for ln in page.decode().splitlines()]

        assert series(got.body) == series(rec.body)
    else:
        assert got.body == rec.body


@pytest_twisted.ensureDeferred
async def test_ollama_bodies_are_go_json(rigs: list[Rig]) -> None:
    """Ollama's replies escape <, > and & as Go does, and its native non-streamed generate
    (not recorded) is the final stream line with the whole text, framed like the recorded
    non-streamed chat."""
    rig = Rig(OLLAMA, **INSTANT)
    rigs.append(rig)
    response, body = await rig.whole("/api/generate", {"model": "llama3.2:3b",
                                                       "prompt": "<b>&</b>", "stream": False,
                                                       "options": {"num_predict": 4}})
    assert ctype(response) == "application/json; charset=utf-8"
    doc = json.loads(body)
    assert doc["response"] == "The quick brown fox" and doc["done_reason"] == "length"
    assert doc["eval_count"] == 4 and len(doc["context"]) == doc["prompt_eval_count"] + 4
    assert not body.endswith(b"\n")
    _, body = await rig.whole("/api/chat", {"model": "nomic-embed-text", "stream": False,
                                            "messages": [{"role": "user", "content": "x"}]})
    assert json.loads(body)["model"] == "nomic-embed-text"  # ":latest" implied, name echoed
    response, body = await rig.whole("/api/chat", {"model": "missing:1b", "messages": []})
    assert response.code == 404 and json.loads(body) == {
        "error": "model 'missing:1b' not found"}


@pytest_twisted.ensureDeferred
async def test_ollama_control_requests_load_and_unload(rigs: list[Rig]) -> None:
    """A generate with no prompt loads the model (done_reason "load", then listed in
    /api/ps); with keep_alive 0 it unloads it (done_reason "unload", gone from /api/ps)."""
    clock = Clock()
    rig = Rig(OLLAMA, clock, load_s=3.0)
    rigs.append(rig)
    pending = rig.post("/api/generate", {"model": "llama3.2:3b"})
    await rig.double.when(lambda: rig.double.stats.controls == 1)
    run(clock, 3.0)
    response = await pending
    doc = json.loads(await _text(rig, response))
    assert ctype(response) == "application/json; charset=utf-8"
    assert (doc["done"], doc["done_reason"], doc["response"]) == (True, "load", "")
    ps = json.loads((await rig.fetcher.fetch("/api/ps")).body)
    assert [m["name"] for m in ps["models"]] == ["llama3.2:3b"]
    pending = rig.post("/api/chat", {"model": "llama3.2:3b", "messages": [], "keep_alive": 0})
    await rig.double.when(lambda: rig.double.stats.controls == 2)
    run(clock, 0.0)
    doc = json.loads(await _text(rig, await pending))
    assert doc["done_reason"] == "unload" and doc["message"] == {"role": "assistant",
                                                                 "content": ""}
    assert json.loads((await rig.fetcher.fetch("/api/ps")).body) == {"models": []}
    assert rig.double.stats.started == 0


async def _text(rig: Rig, response: IResponse) -> bytes:
    body = await rig.read(response)
    assert (await body.ended()).check(ResponseDone)
    return body.data


@pytest_twisted.ensureDeferred
async def test_unrecorded_routes_and_shapes(rigs: list[Rig]) -> None:
    """A route the capture has no reply for gets the engine's recorded 404; a reply shape the
    capture never recorded is refused with 501 rather than invented; bad JSON is a 400."""
    rig = Rig(OLLAMA, **INSTANT)
    rigs.append(rig)
    response, body = await rig.whole("/api/embed", {"model": "nomic-embed-text:latest"})
    assert (response.code, body) == (404, b"404 page not found")
    response, body = await rig.whole("/v1/completions", {"model": "llama3.2:3b",
                                                         "prompt": "x", "stream": True})
    assert response.code == 501
    response, body = await rig.whole("/v1/chat/completions", b"{not json")
    assert response.code == 400 and "error" in json.loads(body)
    assert rig.double.stats.started == 0


# --- 3. the latency model, on a clock --------------------------------------------------------

LONG = "x" * 400  # 100 tokens, six whole 16-token blocks


@pytest_twisted.ensureDeferred
async def test_ttft_is_prefill_and_a_repeat_is_cached(rigs: list[Rig]) -> None:
    """On an idle vLLM double the first token comes after prefill of the uncached prompt
    tokens; the same prompt again reports cached tokens and its first token comes sooner."""
    clock = Clock()
    rig = Rig(VLLM, clock, prefill_s=0.001, prefill_pair_s=0.0, prefill_fixed_s=0.0,
              decode_s=0.01, max_output_tokens=3)
    rigs.append(rig)
    double = rig.double
    ttfts: list[float] = []
    for turn in range(2):
        pending = rig.post("/v1/chat/completions",
                           chat(LONG, stream=True, stream_options={"include_usage": True}))
        await double.when(started(double, turn + 1))
        job = double.jobs[-1]
        uncached = job.prompt_tokens - job.cached_tokens
        run(clock, uncached * 0.001 - 1e-6)
        assert job.first_token_at is None
        run(clock, 1e-6)
        assert job.first_token_at is not None
        ttfts.append(job.first_token_at - job.queued_at)
        run(clock, 1.0)
        body = await rig.read(await pending)
        assert (await body.ended()).check(ResponseDone)
        events = split_events(body.data, "text/event-stream")[1]
        usage = events[-2]["usage"]
        assert usage["prompt_tokens"] == 100 and usage["completion_tokens"] == 3
        assert usage["prompt_tokens_details"]["cached_tokens"] == job.cached_tokens
        assert events[-1] == "[DONE]"
    first, second = double.jobs
    assert first.cached_tokens == 0 and second.cached_tokens == 96
    assert ttfts == [pytest.approx(0.1), pytest.approx(0.004)]
    assert list(double.stats.prompt_tokens) == [100, 100]


@pytest_twisted.ensureDeferred
async def test_llamacpp_reports_cache_n_on_a_repeat(rigs: list[Rig]) -> None:
    """llama.cpp's reply shows the cached prefix in timings.cache_n and prompt_n the rest."""
    clock = Clock()
    rig = Rig(LLAMACPP, clock, max_output_tokens=2)
    rigs.append(rig)
    for n in range(2):
        pending = rig.post("/v1/chat/completions", chat(LONG))
        await rig.double.when(started(rig.double, n + 1))
        run(clock, 5)
        body = await rig.read(await pending)
        await body.ended()
    doc = json.loads(body.data)
    assert doc["timings"]["cache_n"] == 96 and doc["timings"]["prompt_n"] == 4
    assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
    assert doc["choices"][0]["message"]["content"] == "The quick"


@pytest_twisted.ensureDeferred
async def test_requests_beyond_the_slots_show_as_waiting(rigs: list[Rig]) -> None:
    """With two slots, a third request waits: the metrics page says 2 running, 1 waiting,
    and it starts once a slot frees."""
    clock = Clock()
    rig = Rig(VLLM, clock, slots=2, max_output_tokens=2)
    rigs.append(rig)
    pending = [rig.post("/v1/chat/completions", chat(f"hello {i}", stream=True))
               for i in range(3)]
    await rig.double.when(lambda: rig.double.stats.started == 3)
    plan, _ = await resolve(rig.fetcher, VLLM)
    snap, _ = await plan.scrape(rig.fetcher, full=False)
    assert (snap.load["tiny"].running, snap.load["tiny"].waiting) == (2, 1)
    run(clock, 0.2)  # the first two finish, the third runs and finishes
    for d in pending:
        body = await rig.read(await d)
        assert (await body.ended()).check(ResponseDone)
    assert rig.double.stats.completed == 3
    third = rig.double.jobs[2]
    assert third.admitted_at is not None and third.admitted_at > third.queued_at


@pytest_twisted.ensureDeferred
async def test_cold_ollama_loads_and_a_full_host_evicts_the_lru_idle_model(
    rigs: list[Rig],
) -> None:
    """A cold model's TTFT includes the load (reported as load_duration); loading a third
    model on a host that holds two unloads the least recently used idle one, as /api/ps
    shows."""
    clock = Clock()
    models = {"a:1b": 4 * GB, "b:1b": 4 * GB, "c:1b": 4 * GB}
    rig = Rig(OLLAMA, clock, models=models, host_memory=10 * GB, load_s=8.0,
              prefill_s=0.001, decode_s=0.01, max_output_tokens=2)
    rigs.append(rig)
    for n, name in enumerate(("a:1b", "b:1b", "a:1b", "c:1b")):
        pending = rig.post("/api/chat", {"model": name, "stream": False,
                                         "messages": [{"role": "user", "content": LONG}]})
        await rig.double.when(started(rig.double, n + 1))
        run(clock, 20)
        body = await rig.read(await pending)
        await body.ended()
        doc = json.loads(body.data)
        job = rig.double.jobs[-1]
        cold = n != 2
        assert job.cached_tokens == (0 if cold else 96)
        prefill = rig.double.knobs.prefill_seconds(100 - job.cached_tokens, job.cached_tokens)
        assert job.ttft == pytest.approx((8.0 if cold else 0.0) + prefill)
        assert doc["load_duration"] == (8 * 10**9 if cold else 0)
    ps = json.loads((await rig.fetcher.fetch("/api/ps")).body)
    assert sorted(m["name"] for m in ps["models"]) == ["a:1b", "c:1b"]


# --- 4. the client leaves, the engine dies ---------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_client_disconnect_frees_the_slot(rigs: list[Rig]) -> None:
    """A client that stops reading mid-stream (or gives up before the first byte) cancels its
    request: the double stops generating and the slot goes to the waiting request."""
    clock = Clock()
    rig = Rig(LLAMACPP, clock, slots=1, prefill_s=0.001, decode_s=0.01,
              max_output_tokens=50)
    rigs.append(rig)
    double = rig.double
    first = rig.post("/v1/chat/completions", chat("one", stream=True))
    await double.when(lambda: double.stats.started == 1)
    second = rig.post("/v1/chat/completions", chat("two", stream=True))
    await double.when(lambda: double.stats.started == 2)
    assert (double.running, double.waiting) == (1, 1)
    run(clock, 0.05)
    body = await rig.read(await first)
    await body.until(lambda data: data.count(b"data: ") >= 3)
    assert body.chunks
    body.transport.stopProducing()  # type: ignore[union-attr]
    await double.when(lambda: double.stats.cancelled == 1)
    assert double.jobs[0].tokens_done < 50
    assert (double.running, double.waiting) == (1, 0)
    assert double.jobs[1].admitted_at is not None
    # Gone before the first byte: cancel while waiting for the headers.
    second.cancel()
    second.addErrback(lambda _: None)
    await double.when(lambda: double.stats.cancelled == 2)
    assert double.running == 0


@pytest_twisted.ensureDeferred
async def test_kill_cuts_streams_mid_reply(rigs: list[Rig]) -> None:
    """kill() drops every connection at once: a stream in progress ends without its final
    chunk or [DONE] (a failed read, never a clean end), and no request is left running."""
    clock = Clock()
    rig = Rig(VLLM, clock, prefill_s=0.001, decode_s=0.01, max_output_tokens=50)
    rigs.append(rig)
    double = rig.double
    pending = rig.post("/v1/chat/completions", chat("hello", stream=True))
    await double.when(lambda: double.stats.started == 1)
    run(clock, 0.05)
    body = await rig.read(await pending)
    await body.until(lambda data: data.count(b"data: ") >= 3)
    double.kill()
    assert double.running == 0 and double.stats.cancelled == 1
    reason = await body.ended()
    assert not reason.check(ResponseDone)
    assert b"[DONE]" not in body.data


@pytest_twisted.ensureDeferred
async def test_a_paused_reader_holds_events_in_the_double(rigs: list[Rig]) -> None:
    """While the transport has paused the reply (client socket full), events wait in the
    reply instead of being written; resumed, they go out in order and the stream is whole."""
    clock = Clock()
    rig = Rig(VLLM, clock, prefill_s=0.001, prefill_pair_s=0.0, prefill_fixed_s=0.0,
              decode_s=0.01, max_output_tokens=5)
    rigs.append(rig)
    double = rig.double
    pending = rig.post("/v1/chat/completions", chat("hello", stream=True))
    await double.when(lambda: double.stats.started == 1)
    run(clock, 0.002)  # the first token: headers and the first events go out
    body = await rig.read(await pending)
    await body.until(lambda data: b"The" in data)
    (reply,) = double._replies
    reply.pauseProducing()
    run(clock, 1.0)  # the rest of the tokens and the end are produced meanwhile
    assert double.jobs[0].tokens_done == 5
    assert len(reply._pending) == 5  # four tokens and the closing events
    reply.resumeProducing()
    assert (await body.ended()).check(ResponseDone)
    events = split_events(body.data, "text/event-stream")[1]
    texts = [e["choices"][0]["delta"].get("content") for e in events[1:-1]]
    assert texts == ["The", " quick", " brown", " fox", " jumps"]
    assert double.stats.completed == 1
