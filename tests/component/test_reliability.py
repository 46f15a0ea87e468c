"""Layer 3: no slot is ever lost and no request waits on a dead or hung engine, over real
loopback sockets (issue 9): clients leaving at every stage, by FIN or RST; engines that hang,
stall or never send a first byte."""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.web.server import NOT_DONE_YET

from pharos.config import Timeouts
from tests.support.capture_server import CaptureResource, close, serve
from tests.support.captures import all_captures, capture_id
from tests.support.fleet import Fleet, eventually, sleep, start_fleet, within

BODY = json.dumps({"model": "tiny", "stream": True, "max_tokens": 200,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n")


def _port(fleet: Fleet) -> int:
    return int(fleet.url.rsplit(":", 1)[1])


def _send(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(HEAD + BODY)
    return s


def _leave(s: socket.socket, rst: bool) -> None:
    """Close by FIN, or by RST (linger 0), as a killed client does."""
    if rst:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def _hit_and_run(port: int, n: int) -> None:
    """``n`` clients that send a streamed chat and leave 0-10 ms later, half by RST."""
    for i in range(n):
        s = _send(port)
        time.sleep(0.0001 * (i % 100))
        _leave(s, rst=bool(i % 2))


def _inflight(fleet: Fleet) -> int:
    return sum(t.inflight for t in fleet.pharos.state.targets)


@pytest_twisted.ensureDeferred
async def test_clients_that_leave_right_after_sending_keep_no_slot() -> None:
    """100 clients that disconnect within 10 ms of sending, over three engines: afterwards no
    target holds a lease, no engine runs a request, and a normal request is served (before
    the fix, a client gone while its connection was being made was retried on another engine
    and that lease was never released: 48 of them wedged Pharos)."""
    engine = ("vllm", {"decode_s": 0.02}, {"kind": "vllm", "capacity": 4})
    fleet = await start_fleet([engine] * 3)
    try:
        await deferToThread(_hit_and_run, _port(fleet), 100)
        await eventually(lambda: _inflight(fleet) == 0, timeout=20)
        await eventually(lambda: all(d.running == 0 for d in fleet.doubles), timeout=20)
        assert fleet.pharos.sched.waiting == 0
        assert not fleet.pharos.sched.leases
        r = await fleet.chat("tiny")
        assert r.code == 200
        await r.content()
    finally:
        await fleet.stop()


@pytest.mark.parametrize("rst", [False, True], ids=["fin", "rst"])
@pytest_twisted.ensureDeferred
async def test_client_gone_before_the_engines_headers_aborts_it(rst: bool) -> None:
    """A client that leaves while its request runs on the engine but no header came back yet:
    the engine request is cancelled and the lease freed."""
    fleet = await start_fleet([("llamacpp", {"slots": 2}, {"kind": "llamacpp"})])
    double = fleet.doubles[0]
    try:
        double.hold()  # the job takes a slot and sends nothing, headers included
        s = _send(_port(fleet))
        await eventually(lambda: double.running == 1)
        assert _inflight(fleet) == 1
        _leave(s, rst)
        await eventually(lambda: double.stats.cancelled == 1)
        await eventually(lambda: _inflight(fleet) == 0)
        assert double.running == 0
    finally:
        await fleet.stop()


@pytest.mark.parametrize("rst", [False, True], ids=["fin", "rst"])
@pytest_twisted.ensureDeferred
async def test_client_gone_mid_stream_aborts_the_engine(rst: bool) -> None:
    """A client that leaves mid-stream: the engine stops generating and the lease is freed."""
    fleet = await start_fleet([("llamacpp", {"slots": 2, "decode_s": 0.02,
                                             "max_output_tokens": 500}, {"kind": "llamacpp"})])
    double = fleet.doubles[0]
    try:
        s = _send(_port(fleet))
        await double.when(lambda: any(j.tokens_done >= 3 for j in double.jobs))
        s.recv(1024)
        _leave(s, rst)
        await eventually(lambda: double.stats.cancelled == 1)
        await eventually(lambda: _inflight(fleet) == 0)
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_client_gone_while_queued_in_pharos_leaves_the_queue() -> None:
    """A client whose request waits in Pharos's queue and leaves: the waiter is gone, the
    engine never sees it, and the queue serves the next one."""
    fleet = await start_fleet([("llamacpp", {"slots": 1}, {"kind": "llamacpp", "capacity": 1})])
    double = fleet.doubles[0]
    try:
        double.hold()
        first = _send(_port(fleet))
        await eventually(lambda: double.running == 1)
        second = _send(_port(fleet))
        await eventually(lambda: fleet.pharos.sched.waiting == 1)
        _leave(second, rst=True)
        await eventually(lambda: fleet.pharos.sched.waiting == 0)
        double.release()
        _leave(first, rst=False)
        await eventually(lambda: _inflight(fleet) == 0)
        assert double.stats.started == 1
    finally:
        await fleet.stop()


async def _on(fleet: Fleet, double: Any, count: int) -> list[Any]:
    """Send streamed chats until ``count`` of them run on ``double`` (the rest go elsewhere
    and finish); the Deferreds of those replies."""
    replies = []
    for _ in range(200):
        replies.append(ensureDeferred(fleet.chat("tiny", stream=True)))
        await sleep(0.01)
        if double.running >= count:
            return replies
    raise AssertionError("no request was routed to the double")


@pytest_twisted.ensureDeferred
async def test_requests_on_a_hung_engine_go_elsewhere() -> None:
    """Requests dispatched to an engine that then hangs (answers nothing, scrapes included)
    and had sent no header are retried on the other engine as soon as a scrape round fails:
    every client gets a whole 200 reply from the healthy engine."""
    fleet = await start_fleet([("llamacpp", {"slots": 4}, {"kind": "llamacpp"}),
                               ("llamacpp", {"slots": 4}, {"kind": "llamacpp"})])
    hung, healthy = fleet.doubles
    try:
        hung.hold()
        replies = await _on(fleet, hung, 2)
        hung.hang()
        for d in replies:
            r = await within(d)
            assert r.code == 200
            assert r.headers.getRawHeaders(b"x-pharos-backend") == [healthy.url.encode()]
            assert (await r.content()).rstrip().endswith(b"data: [DONE]")
        assert fleet.pharos.state.backends[hung.url].ejected
        await eventually(lambda: _inflight(fleet) == 0)
    finally:
        hung.unhang()
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_no_first_byte_in_time_is_retried_then_504_in_the_routes_shape() -> None:
    """An engine that takes the request and sends nothing past timeouts.first_byte: with
    another engine the request is retried there; with none left the client gets 504, in
    OpenAI's shape on /v1 and Ollama's on /api."""
    limits = Timeouts(first_byte_generate=0.5)
    fleet = await start_fleet([("ollama", {"loaded": ["llama3.2:3b"], "slots": 4},
                                {"kind": "ollama"})], timeouts=limits)
    (double,) = fleet.doubles
    try:
        double.hold()
        r = await fleet.chat("llama3.2:3b")
        body = json.loads(await r.content())
        assert r.code == 504
        assert body["error"]["code"] == "upstream_error"
        assert "first byte" in body["error"]["message"]
        r = await fleet.post("/api/chat", {"model": "llama3.2:3b", "messages": [
            {"role": "user", "content": "x"}]})
        body = json.loads(await r.content())
        assert r.code == 504 and isinstance(body["error"], str)
        await eventually(lambda: _inflight(fleet) == 0)
        await eventually(lambda: double.running == 0)  # the engine requests were cancelled
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_late_first_byte_moves_to_the_other_engine() -> None:
    """With a second engine, a request whose engine sends no first byte in time is served by
    the other one."""
    limits = Timeouts(first_byte_generate=0.5)
    fleet = await start_fleet([("llamacpp", {"slots": 4}, {"kind": "llamacpp"}),
                               ("llamacpp", {"slots": 4}, {"kind": "llamacpp"})],
                              timeouts=limits)
    slow, other = fleet.doubles
    try:
        slow.hold()
        replies = await _on(fleet, slow, 1)
        for d in replies:
            r = await within(d)
            assert r.code == 200
            assert r.headers.getRawHeaders(b"x-pharos-backend") == [other.url.encode()]
            await r.content()
        assert not fleet.pharos.state.backends[slow.url].ejected  # it answers its scrapes
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_stream_that_stalls_is_cut_and_ejected() -> None:
    """A stream whose engine stops sending mid-reply for timeouts.stream_idle is cut (the
    client sees an incomplete reply, never a clean end), the engine ejected, the slot freed."""
    limits = Timeouts(stream_idle=0.5)
    fleet = await start_fleet([("llamacpp", {"slots": 2, "decode_s": 0.02,
                                             "max_output_tokens": 500}, {"kind": "llamacpp"})],
                              timeouts=limits)
    double = fleet.doubles[0]
    try:
        r = await fleet.chat("tiny", stream=True, max_tokens=400)
        assert r.code == 200
        body = ensureDeferred(treq.content(r))
        await double.when(lambda: any(j.tokens_done >= 3 for j in double.jobs))
        double.hold()
        with pytest.raises(Exception):  # noqa: B017 - any incomplete-read error
            await body
        assert fleet.pharos.state.backends[double.url].ejected
        await eventually(lambda: _inflight(fleet) == 0)
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_healthz_is_503_while_the_queue_makes_no_progress() -> None:
    """Requests waiting with none starting and no lease given back for timeouts.queue_stuck:
    /healthz answers 503 "stuck"; once the queue moves it is 200 again."""
    fleet = await start_fleet([("llamacpp", {"slots": 1}, {"kind": "llamacpp", "capacity": 1})],
                              timeouts=Timeouts(queue_stuck=0.5))
    double = fleet.doubles[0]
    try:
        double.hold()
        replies = [ensureDeferred(fleet.chat("tiny")) for _ in range(2)]
        await eventually(lambda: fleet.pharos.sched.waiting == 1)
        await sleep(1.0)
        r = await treq.get(fleet.url + "/healthz", pool=fleet.pool)
        body = json.loads(await r.content())
        assert r.code == 503 and body["status"] == "stuck" and body["waiting"] == 1
        double.release()
        for d in replies:
            await (await within(d)).content()
        r = await treq.get(fleet.url + "/healthz", pool=fleet.pool)
        assert r.code == 200
        await r.content()
    finally:
        await fleet.stop()


class HeadersFirstVllm(CaptureResource):
    """Status paths like vLLM's idle capture; a chat gets its 200 headers at once and no body
    byte (as vLLM streams: headers first, tokens after the prefill). ``hung``: GETs (scrapes)
    get no answer at all."""

    hung = False

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.posts: list[Any] = []
        self.gone = 0

    def render_GET(self, request: Any) -> Any:
        if self.hung:
            return NOT_DONE_YET
        return super().render_GET(request)

    def render_POST(self, request: Any) -> Any:
        request.setHeader(b"content-type", b"text/event-stream")
        request.write(b"")  # the headers go out now
        self.posts.append(request)

        def gone(_: object) -> None:
            self.gone += 1

        request.notifyFinish().addErrback(gone)
        return NOT_DONE_YET


def _headers_first() -> HeadersFirstVllm:
    capture = next(c for c in all_captures() if capture_id(c) == "vllm/0.32.0/idle")
    return HeadersFirstVllm(capture, reactor)


@pytest.mark.parametrize("rst", [False, True], ids=["fin", "rst"])
@pytest_twisted.ensureDeferred
async def test_client_gone_between_headers_and_first_byte_aborts_it(rst: bool) -> None:
    """The engine sent its headers and no byte yet when the client leaves: the engine's
    connection is closed (it stops generating) and the lease freed."""
    engine = _headers_first()
    port, url = serve(engine)
    fleet = await start_fleet([], extra=[url])
    try:
        s = _send(_port(fleet))
        await eventually(lambda: len(engine.posts) == 1)
        await sleep(0.1)  # the headers reached Pharos
        _leave(s, rst)
        await eventually(lambda: engine.gone == 1)
        await eventually(lambda: _inflight(fleet) == 0)
    finally:
        await fleet.stop()
        await close(port)


@pytest_twisted.ensureDeferred
async def test_headers_but_no_byte_on_a_hung_engine_go_elsewhere() -> None:
    """An engine that answered headers, then hung (its scrapes fail) before any body byte:
    nothing reached the client yet, so the request moves to the other engine and succeeds."""
    engine = _headers_first()
    port, url = serve(engine)
    fleet = await start_fleet([("vllm", {}, {"kind": "vllm"})], extra=[url])
    try:
        replies = []
        for _ in range(60):
            replies.append(ensureDeferred(fleet.chat("tiny", stream=True)))
            await sleep(0.01)
            if engine.posts:
                break
        assert engine.posts, "no request was routed to the headers-first engine"
        engine.hung = True
        for d in replies:
            r = await within(d)
            assert r.code == 200
            assert r.headers.getRawHeaders(b"x-pharos-backend") == [
                fleet.doubles[0].url.encode()]
            assert (await r.content()).rstrip().endswith(b"data: [DONE]")
        assert engine.gone == len(engine.posts)
    finally:
        await fleet.stop()
        await close(port)
