"""Layer 3: slow and idle clients by the hundred over real loopback sockets (issue 16, "Bad
input"): clients sending their heads or bodies a byte at a time are cut at
``timeouts.request_headers`` / ``timeouts.request_body`` with a JSON 408, idle keep-alive
connections are closed after ``timeouts.idle``, and a client arriving meanwhile is served.
Counts are modest (a few hundred) so this runs on 2 shared cores; ``pharos bench overhead
--bad-input`` does the 1,000 and 10,000 of the issue and reports memory."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.threads import deferToThread
from twisted.logger import ILogObserver, globalLogPublisher
from zope.interface import implementer

from pharos.config import Timeouts
from tests.support.fleet import Fleet, sleep, start_fleet

#: Connections per test.
N = 200
#: Generous: every wait ends on an event (a reply, a close) well before it.
PATIENCE = 60.0


@pytest.fixture
def failures() -> Iterator[list[dict[str, Any]]]:
    """Every log event that carries a traceback while the test runs."""
    seen: list[dict[str, Any]] = []

    @implementer(ILogObserver)
    def observe(event: dict[str, Any]) -> None:
        if event.get("log_failure") is not None or event.get("isError"):
            seen.append(event)

    globalLogPublisher.addObserver(observe)
    yield seen
    globalLogPublisher.removeObserver(observe)


async def _fleet(timeouts: Timeouts) -> Fleet:
    return await start_fleet([("vllm", {}, {"kind": "vllm"})], timeouts=timeouts)


def _connect(url: str, n: int) -> list[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    return [socket.create_connection((host, int(port)), timeout=PATIENCE) for _ in range(n)]


def _trickle_until_closed(socks: list[socket.socket], data: list[bytes],
                          pace: float) -> list[bytes]:
    """Send each socket its ``data`` one byte per ``pace`` seconds (all sockets a byte per
    round) until the server closes each; what each received."""
    got = {s: b"" for s in socks}
    todo = dict(zip(socks, data, strict=True))
    open_ = set(socks)
    i = 0
    deadline = time.monotonic() + PATIENCE
    while open_ and time.monotonic() < deadline:
        for s in list(open_):
            if i < len(todo[s]):
                try:
                    s.sendall(todo[s][i:i + 1])
                except OSError:
                    open_.discard(s)  # closed (or reset) by the server after its reply
        i += 1
        readable, _, _ = select.select(list(open_), [], [], pace)
        for s in readable:
            try:
                chunk = s.recv(65536)
            except OSError:
                chunk = b""
            got[s] += chunk
            if not chunk:
                open_.discard(s)
    for s in socks:
        s.setblocking(False)
        try:
            while chunk := s.recv(65536):  # whatever arrived before the close
                got[s] += chunk
        except OSError:  # nothing more (still open: a failure the caller sees)
            pass
        s.close()
    return [got[s] for s in socks]


def _status_and_json(raw: bytes) -> tuple[int, Any]:
    assert raw, "the connection was neither answered nor closed"
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


CHAT = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'


async def _served_meanwhile(fleet: Fleet, busy: Any) -> int:
    """Chats through Pharos while ``busy`` (a Deferred) has not fired: how many, all 200."""
    served = 0
    while not busy.called or served == 0:
        r = await fleet.chat("tiny")
        await r.content()
        assert r.code == 200
        served += 1
        await sleep(0.05)
    return served


@pytest_twisted.ensureDeferred
async def test_many_slow_heads_get_408_while_others_are_served(
        failures: list[dict[str, Any]]) -> None:
    """200 connections sending their request heads a byte every 0.1 s all get a JSON 408
    naming the header deadline and are closed; chats sent meanwhile are all served; nothing
    logs a traceback."""
    fleet = await _fleet(Timeouts(request_headers=1.0))
    try:
        socks = _connect(fleet.url, N)
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                b"application/json\r\nX-Padding: " + b"p" * 200 + b"\r\n\r\n")
        d = deferToThread(_trickle_until_closed, socks, [head] * N, 0.1)
        served = await _served_meanwhile(fleet, d)
        replies = await d
    finally:
        await fleet.stop()
    assert served >= 1 and not failures
    for raw in replies:
        status, body = _status_and_json(raw)
        assert status == 408 and "request headers" in body["error"]["message"]


@pytest_twisted.ensureDeferred
async def test_many_slow_bodies_get_408_while_others_are_served(
        failures: list[dict[str, Any]]) -> None:
    """200 connections whose heads arrive whole but whose bodies come a byte every 0.1 s
    (Content-Length, and chunked on every other one) all get a JSON 408 naming the body
    deadline, though every byte restarted twisted.web's idle timer; chats sent meanwhile are
    all served; nothing logs a traceback."""
    fleet = await _fleet(Timeouts(request_body=1.0))
    try:
        socks = _connect(fleet.url, N)
        body = CHAT * 20  # longer than the deadline at 0.1 s a byte
        length = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        chunked = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                   b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i, s in enumerate(socks):
            s.sendall(chunked if i % 2 else length)
        data = [b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if i % 2 else body
                for i in range(N)]
        d = deferToThread(_trickle_until_closed, socks, data, 0.1)
        served = await _served_meanwhile(fleet, d)
        replies = await d
    finally:
        await fleet.stop()
    assert served >= 1 and not failures
    for raw in replies:
        status, body_ = _status_and_json(raw)
        assert status == 408 and "request body" in body_["error"]["message"]


def _idle_until_closed(url: str, used: int, idle: int) -> tuple[list[int], int]:
    """``used`` connections that make one keep-alive request, and ``idle`` that never send
    anything; then wait for the server to close each. Statuses of the requests, and how many
    connections the server closed."""
    socks = _connect(url, used + idle)
    statuses = []
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
           b"\r\nContent-Length: %d\r\n\r\n%s" % (len(CHAT), CHAT))
    for s in socks[:used]:
        s.sendall(req)
    for s in socks[:used]:
        raw = b""
        while b"\r\n\r\n" not in raw:
            raw += s.recv(65536)
        statuses.append(int(raw.split(b" ", 2)[1]))
        head, _, rest = raw.partition(b"\r\n\r\n")
        size = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")))
        while len(rest) < size:
            rest += s.recv(65536)
    open_ = set(socks)
    deadline = time.monotonic() + PATIENCE
    while open_ and time.monotonic() < deadline:
        readable, _, _ = select.select(list(open_), [], [], 0.5)
        for s in readable:
            try:
                chunk = s.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                open_.discard(s)
    for s in socks:
        s.close()
    return statuses, used + idle - len(open_)


@pytest_twisted.ensureDeferred
async def test_idle_keep_alive_connections_are_closed_after_the_idle_timeout(
        failures: list[dict[str, Any]]) -> None:
    """100 keep-alive connections after one request each, and 200 that never sent a byte,
    are all closed by Pharos once ``timeouts.idle`` passes with nothing from them; chats sent
    while they are open are served; nothing logs a traceback."""
    fleet = await _fleet(Timeouts(idle=1.0))
    try:
        d = deferToThread(_idle_until_closed, fleet.url, 100, 200)
        served = await _served_meanwhile(fleet, d)
        statuses, closed = await d
    finally:
        await fleet.stop()
    assert served >= 1 and not failures
    assert statuses == [200] * 100
    assert closed == 300
