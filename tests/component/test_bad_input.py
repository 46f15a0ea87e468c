"""Layer 3: bad input gets a clear 4xx in JSON over real loopback sockets, never a 500, a
hang or a traceback; protocol edges (issue 9's list, each its own regression test)."""

from __future__ import annotations

import json
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
from tests.support.fleet import Fleet, start_fleet


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


def _exchange(url: str, raw: bytes, timeout: float = 20.0, pace: float = 0.0) -> bytes:
    """Send ``raw`` (one byte every ``pace`` seconds when set) and read until the server
    closes or ``timeout`` passes."""
    host, port = url.removeprefix("http://").split(":")
    out = b""
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        if pace:
            try:
                for b in raw:
                    s.sendall(bytes([b]))
                    time.sleep(pace)
            except OSError:
                pass
        else:
            s.sendall(raw)
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return out


def _status_and_json(raw: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), headers, json.loads(body) if body else None


async def _fleet(**kw: Any) -> Fleet:
    return await start_fleet([("vllm", {}, {"kind": "vllm"})], **kw)


CHAT = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}]}'


def _post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + extra + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


PROTOCOL_ERRORS = {
    "bad content-length": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Length: 12abc\r\n\r\n",
    "bad transfer-encoding": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                             b"Transfer-Encoding: gzip, chunked\r\n\r\n",
    "nul in a header": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "1000 headers": b"GET /healthz HTTP/1.1\r\n"
                    + b"".join(b"X-H%d: v\r\n" % i for i in range(1000)) + b"\r\n",
    "bare LF lines": b"GET /healthz HTTP/1.1\nHost: x\n\n",
    "bad chunk": b"POST /api/chat HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"zz\r\nxx\r\n",
}


@pytest.mark.parametrize("name", list(PROTOCOL_ERRORS))
@pytest_twisted.ensureDeferred
async def test_protocol_errors_answer_json_and_close(name: str,
                                                     failures: list[dict[str, Any]]) -> None:
    """What twisted.web cannot parse gets a 400 with a JSON body, a content type and length,
    and the connection closes at once (bare-LF heads too: they used to wait 60 s)."""
    fleet = await _fleet()
    try:
        started = time.monotonic()
        raw = await deferToThread(_exchange, fleet.url, PROTOCOL_ERRORS[name])
        took = time.monotonic() - started
    finally:
        await fleet.stop()
    status, headers, body = _status_and_json(raw)
    assert status == 400, raw[:200]
    assert headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(raw.partition(b"\r\n\r\n")[2])
    assert body["error"]  # both shapes carry "error"
    assert took < 15, "the connection was not closed at once"
    assert not failures


@pytest_twisted.ensureDeferred
async def test_invalid_percent_encoding_is_a_json_400(failures: list[dict[str, Any]]) -> None:
    """/v1/%ff%fe (not UTF-8 once decoded) is a JSON 400, not Klein's text/html page with a
    traceback in the log."""
    fleet = await _fleet()
    try:
        raw = await deferToThread(
            _exchange, fleet.url,
            b"GET /v1/%ff%fe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    finally:
        await fleet.stop()
    status, headers, body = _status_and_json(raw)
    assert status == 400 and headers["content-type"] == "application/json"
    assert "percent-encoded" in body["error"]["message"]
    assert not failures


@pytest_twisted.ensureDeferred
async def test_slow_headers_are_cut_at_the_deadline(failures: list[dict[str, Any]]) -> None:
    """A client sending its request head one byte at a time (slowloris) gets 408 once
    timeouts.request_headers passes, though every byte restarted the idle timer."""
    fleet = await _fleet(timeouts=Timeouts(request_headers=1.0))
    try:
        started = time.monotonic()
        raw = await deferToThread(_exchange, fleet.url,
                                  b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200,
                                  30.0, 0.05)
        took = time.monotonic() - started
    finally:
        await fleet.stop()
    status, _, body = _status_and_json(raw)
    assert status == 408 and "within 1 s" in body["error"]["message"]
    assert took < 9, "cut long after the deadline"  # 200 bytes at 50 ms would take 10 s
    assert not failures


@pytest_twisted.ensureDeferred
async def test_http10_keep_alive_is_closed_cleanly_after_the_reply() -> None:
    """An HTTP/1.0 client asking for keep-alive gets its reply with Connection: close and the
    connection ends after it (twisted.web keeps no HTTP/1.0 connection open; the second
    request used to go unanswered on a connection the client thought open)."""
    fleet = await _fleet()
    try:
        raw = await deferToThread(
            _exchange, fleet.url,
            b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
            b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    finally:
        await fleet.stop()
    status, headers, body = _status_and_json(raw)
    assert status == 200 and body == {"status": "ok"}
    assert headers["connection"] == "close"
    assert raw.count(b"HTTP/1.") == 1


@pytest_twisted.ensureDeferred
async def test_deep_json_and_wrong_types_are_4xx(failures: list[dict[str, Any]]) -> None:
    """Over the wire: JSON nested 950 deep is a 400; a model that is a number is a 400 naming
    the field; neither logs a traceback."""
    fleet = await _fleet()
    try:
        deep = b'{"model":"tiny","messages":' + b"[" * 950 + b"]" * 950 + b"}"
        raw = await deferToThread(_exchange, fleet.url,
                                  _post(b"/v1/chat/completions", deep, b"Connection: close\r\n"))
        status, _, body = _status_and_json(raw)
        assert status == 400 and "deeper than 128" in body["error"]["message"]
        raw = await deferToThread(_exchange, fleet.url, _post(
            b"/api/chat", b'{"model":7,"messages":[]}', b"Connection: close\r\n"))
        status, _, body = _status_and_json(raw)
        assert status == 400 and "model must be a string" in body["error"]
    finally:
        await fleet.stop()
    assert not failures


@pytest_twisted.ensureDeferred
async def test_client_strings_are_bounded_where_kept_or_echoed() -> None:
    """A 1 MB ``user`` is kept as a 64-bit hash in the session map, and an unknown 1 MB
    model name comes back cut in the 404."""
    fleet = await _fleet()
    try:
        r = await fleet.chat("tiny", user="u" * 1_000_000)
        await r.content()
        assert r.code == 200
        assert [0 <= k < 2**64 for k in fleet.pharos.sched.sessions] == [True]
        r = await fleet.chat("m" * 1_000_000)
        body = await r.content()
        assert r.code == 404 and len(body) < 1000
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_engine_content_length_is_kept_when_the_body_is_unchanged() -> None:
    """A non-streamed reply passed through unchanged keeps the engine's Content-Length (no
    chunked re-framing); hop-by-hop headers are not relayed."""
    fleet = await _fleet()
    try:
        raw = await deferToThread(_exchange, fleet.url,
                                  _post(b"/v1/chat/completions", CHAT, b"Connection: close\r\n"))
    finally:
        await fleet.stop()
    status, headers, body = _status_and_json(raw)
    assert status == 200 and body["choices"]
    assert int(headers["content-length"]) == len(raw.partition(b"\r\n\r\n")[2])
    assert "transfer-encoding" not in headers
    assert headers.get("connection") == "close"  # ours (the client asked), not the engine's
