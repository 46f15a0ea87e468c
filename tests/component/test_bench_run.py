"""The open-loop harness over real loopback sockets: sends on schedule whatever the server
does, times from the scheduled time (virtual time on a ``Clock``, so the figures are exact),
bounds every request, and records failures; and it reads each engine double's stream."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from pharos.bench.openloop import OpenLoop
from pharos.bench.records import REFUSED, TIMEOUT
from pharos.bench.summary import summarize
from pharos.sim.double import start_double
from tests.support.bench import _until, scheduled
from tests.support.capture_server import close, serve

ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                     "finish_reason": None}]}
TOKEN = {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}
FINISH = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 3,
                                  "total_tokens": 13,
                                  "prompt_tokens_details": {"cached_tokens": 4}}}


def event(doc: Any) -> bytes:
    return b"data: " + (doc if isinstance(doc, bytes) else json.dumps(doc).encode()) + b"\n\n"


class Parking(Resource):
    """Holds every chat request until the test answers it; ``model: busy`` gets a 503 at once.
    ``lost`` fires for each request whose client went away."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[Request] = []
        self.lost: list[Deferred[None]] = []
        self._waiting: list[tuple[int, Deferred[None]]] = []

    def render_POST(self, request: Request) -> Any:
        assert request.content is not None
        body = json.loads(request.content.read())
        if body["model"] == "busy":
            request.setResponseCode(503)
            return b'{"error": "busy"}'
        request.setHeader(b"content-type", b"text/event-stream")
        lost: Deferred[None] = Deferred()
        request.notifyFinish().addBoth(lambda r: lost.callback(None) if r is not None
                                       else None)
        self.requests.append(request)
        self.lost.append(lost)
        for n, d in list(self._waiting):
            if len(self.requests) >= n:
                self._waiting.remove((n, d))
                d.callback(None)
        return NOT_DONE_YET

    def arrived(self, n: int) -> Deferred[None]:
        """Fires once ``n`` requests have come in."""
        d: Deferred[None] = Deferred()
        if len(self.requests) >= n:
            d.callback(None)
        else:
            self._waiting.append((n, d))
        return d

    def answer(self, i: int) -> None:
        """A token, the finish and usage chunks and ``[DONE]``, then the end."""
        r = self.requests[i]
        r.write(event(TOKEN) + event(TOKEN) + event(TOKEN) + event(FINISH) + event(USAGE)
                + event(b"[DONE]"))
        r.finish()


@pytest_twisted.ensureDeferred
async def test_times_count_from_the_schedule_through_a_stall_and_a_late_send() -> None:
    """A server that stalls: later requests are still sent on time (open loop), and each one's
    TTFT includes the stall; the role chunk does not count as the first token. A request the
    harness sends late records its lag, and its TTFT counts from its scheduled time."""
    server = Parking()
    port, url = serve(server)
    clock = Clock()
    loop = OpenLoop(reactor, [scheduled(0.0), scheduled(1.0), scheduled(2.0), scheduled(3.0)],
                    [url], clock=clock, timeout=100.0)
    try:
        done = loop.run()
        clock.advance(0)
        await server.arrived(1)
        server.requests[0].write(event(ROLE))  # the role chunk comes at once, no token yet
        clock.advance(1)
        await server.arrived(2)  # sent while the first is still unanswered
        clock.advance(1)
        await server.arrived(3)
        clock.advance(3)  # t = 5: the fourth (due at 3) goes out only now
        await server.arrived(4)
        for i in range(4):
            server.answer(i)
        records = await done
    finally:
        await close(port)
    assert [r.error for r in records] == [None] * 4
    assert [r.sent for r in records] == [0.0, 1.0, 2.0, 5.0]
    assert [r.lag for r in records] == [0.0, 0.0, 0.0, 2.0]
    assert [r.ttft for r in records] == [5.0, 4.0, 3.0, 2.0]
    assert records[1].sent is not None and records[0].ttft is not None
    assert records[1].sent < records[0].ttft
    r = records[0]
    assert (r.prompt_tokens, r.cached_tokens, r.completion_tokens) == (10, 4, 3)
    assert r.e2e == 5.0 and r.tpot == 0.0 and r.engine == url and r.status == 200
    s = summarize(records, duration=4.0)
    assert s["hit_rate"] == pytest.approx(0.4) and s["send_lag_s"]["max"] == 2.0


@pytest_twisted.ensureDeferred
async def test_every_request_is_bounded_and_failures_are_records() -> None:
    """Requests the server never finishes are cancelled at their timeout (the server sees the
    client go) and recorded as timeouts; a 503 is recorded with its status; the run ends."""
    server = Parking()
    port, url = serve(server)
    clock = Clock()
    loop = OpenLoop(reactor, [scheduled(0.0), scheduled(0.0), scheduled(0.5, "busy")], [url],
                    clock=clock, timeout=10.0)
    try:
        done = loop.run()
        clock.advance(0)
        await server.arrived(2)
        server.requests[1].write(event(ROLE) + event(TOKEN))  # then it stalls mid-stream
        clock.advance(0.5)
        await _until(lambda: loop.finished == 1)  # the 503
        clock.advance(10)
        records = await done
        await server.lost[0]
        await server.lost[1]
    finally:
        await close(port)
    assert [r.error for r in records] == [TIMEOUT, TIMEOUT, "http_503"]
    assert records[2].status == 503
    assert summarize(records, 1.0)["errors"] == {"http_503": 1, "timeout": 2}


@pytest_twisted.ensureDeferred
async def test_a_refused_url_gives_error_records() -> None:
    """Nothing listening: every request is recorded as refused, with its engine the URL it
    was sent to, and the run ends."""
    port, url = serve(Resource())
    await close(port)
    records = await OpenLoop(reactor, [scheduled(0.0), scheduled(0.01)], [url],
                             timeout=10.0).run()
    assert [r.error for r in records] == [REFUSED, REFUSED]
    assert [r.url for r in records] == [url, url] and records[0].status is None


@pytest.mark.parametrize("kind", ["vllm", "llamacpp", "ollama"])
@pytest_twisted.ensureDeferred
async def test_reads_each_engine_doubles_stream(kind: str) -> None:
    """Against each engine double's wire format: a first token, the prompt and completion
    token counts from usage, cached tokens where the engine reports them (llama.cpp's
    timings; Ollama reports none, so unknown), spread round robin over two doubles."""
    doubles = [start_double(kind, reactor, models={"tiny": 0}, loaded=("tiny",))
               for _ in range(2)]
    urls = [d.url for d, _ in doubles]
    try:
        records = await OpenLoop(reactor, [scheduled(0.0), scheduled(0.0), scheduled(0.01)],
                                 urls, dispatch="round-robin", timeout=30.0).run()
    finally:
        for d, p in doubles:
            d.stop()
            await close(p)
    for r in records:
        assert r.error is None and r.ttft is not None and r.e2e is not None
        assert r.ttft <= r.e2e
        assert r.prompt_tokens and r.completion_tokens == 3
    assert [r.engine for r in records] == [urls[0], urls[1], urls[0]]
    if kind == "llamacpp":
        assert all(r.cached_tokens is not None for r in records)
    if kind == "ollama":
        assert all(r.cached_tokens is None for r in records)


