"""Layer 3: a slow reader costs no more than its socket buffers. An engine streams 100 MB as
fast as Pharos takes it; the client reads slowly; Pharos's relay pauses the engine read."""

from __future__ import annotations

import json
import resource
import socket
import threading
import time

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.interfaces import IPushProducer
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface import implementer

from tests.support.capture_server import CaptureResource, close, serve
from tests.support.captures import all_captures, capture_id
from tests.support.fleet import sleep, start_fleet

TOTAL = int(__import__('os').environ.get('FLOOD_MB', '100')) * 1024 * 1024
EVENT = b"data: " + b"x" * (64 * 1024 - 8) + b"\n\n"


def rss_bytes() -> int:
    """Resident set size of this process now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


@implementer(IPushProducer)
class Flood:
    """Writes 64 KiB events until 100 MB are out, only while the client side is not paused."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.sent = 0
        self.paused = False
        self.stopped = False

    def pump(self) -> None:
        while not self.paused and not self.stopped and self.sent < TOTAL:
            self.request.write(EVENT)
            self.sent += len(EVENT)
            if self.sent % (4 * 1024 * 1024) < len(EVENT):
                reactor.callLater(0, self.pump)
                return
        if self.sent >= TOTAL and not self.stopped:
            self.stopped = True
            self.request.write(b"data: [DONE]\n\n")
            self.request.unregisterProducer()
            self.request.finish()

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False
        reactor.callLater(0, self.pump)

    def stopProducing(self) -> None:
        self.stopped = True


class FloodingVllm(CaptureResource):
    """Status paths like vLLM's idle capture; a chat completion streams 100 MB."""

    def render_POST(self, request: Request) -> int:
        request.setHeader(b"content-type", b"text/event-stream")
        flood = Flood(request)
        request.registerProducer(flood, True)
        reactor.callLater(0, flood.pump)
        return NOT_DONE_YET


@pytest_twisted.ensureDeferred
async def test_slow_client_keeps_memory_bounded() -> None:
    """Relaying 100 MB to a client that reads slowly grows Pharos's memory by under 20 MB."""
    capture = next(c for c in all_captures() if capture_id(c) == "vllm/0.32.0/idle")
    port, url = serve(FloodingVllm(capture, reactor))
    fleet = await start_fleet([], extra=[url])
    received = [0]
    peak = [0]
    done = threading.Event()
    try:
        before = rss_bytes()
        host, p = fleet.url.removeprefix("http://").split(":")
        body = json.dumps({"model": "tiny", "stream": True,
                           "stream_options": {"include_usage": True},
                           "messages": [{"role": "user", "content": "flood"}]}).encode()

        def slow_reader() -> None:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            s.connect((host, int(p)))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: " + str(len(body)).encode()
                      + b"\r\n\r\n" + body)
            deadline = time.monotonic() + 60
            while received[0] < TOTAL and time.monotonic() < deadline:
                chunk = s.recv(256 * 1024)
                if not chunk:
                    break
                received[0] += len(chunk)
                time.sleep(0.005)
            s.close()
            done.set()

        t = threading.Thread(target=slow_reader, daemon=True)
        t.start()
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes())
            await sleep(0.05)
        t.join(5)
    finally:
        await fleet.stop()
        await close(port)
    assert received[0] >= TOTAL, f"the client got {received[0]} bytes"
    growth = peak[0] - before
    assert growth < 20 * 1024 * 1024, f"RSS grew by {growth / 1e6:.1f} MB"

