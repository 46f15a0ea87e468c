"""``make stress``: the reliability stress table (docs/performance.rst, "Stress") on this
machine.

Pharos runs as a real twistd process in front of real ``pharos sim-engine`` processes (and,
for the bulk stream, a bulk engine served from this process), all on loopback; the clients
are raw asyncio sockets in this process, so a disconnect is a real FIN or RST. Each scenario
starts a fresh fleet, is bounded in requests and time, and stops every process it started
(by its own handle, SIGTERM then SIGKILL). Results go to ``--out`` as ``results.json`` and a
Markdown table, with the machine and date.

Scenarios: 1,000 concurrent streams with hundreds of random disconnects; an engine killed and
one hung under load; 3,000+ hostile requests; a 35,000-request soak; 640 MB streamed to
clients that stop reading; an 8 MiB body sent one byte at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
_URL = re.compile(rb"listening on http://127\.0\.0\.1:(\d+)")


# --- processes ---------------------------------------------------------------------------


@dataclass
class Proc:
    """A child process this script started, and its port."""

    name: str
    popen: subprocess.Popen[bytes]
    port: int
    log: Path

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def stop(self) -> None:
        """SIGCONT (in case it was stopped), SIGTERM, then SIGKILL after 15 s."""
        if self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGCONT)
        self.popen.terminate()
        try:
            self.popen.wait(15)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(15)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_engine(name: str, logs: Path, *args: str) -> Proc:
    log = logs / f"{name}.log"
    out = log.open("wb")
    popen = subprocess.Popen([str(BIN / "pharos"), "sim-engine", "--kind", "vllm", "--port",
                              "0", *args], stdout=subprocess.PIPE, stderr=out)
    assert popen.stdout is not None
    deadline = time.monotonic() + 60
    seen = b""
    while time.monotonic() < deadline:
        line = popen.stdout.readline()
        out.write(line)
        seen += line
        m = _URL.search(seen)
        if m:
            threading.Thread(target=_drain, args=(popen.stdout, out), daemon=True).start()
            return Proc(name, popen, int(m.group(1)), log)
        if not line and popen.poll() is not None:
            break
    popen.kill()
    raise RuntimeError(f"{name} did not start: {seen[-500:]!r}")


def _drain(stream: Any, out: Any) -> None:
    for line in stream:
        out.write(line)


def start_pharos(logs: Path, backends: list[tuple[int, str, int]], extra: str = "") -> Proc:
    """twistd -n pharos in front of ``backends`` (port, kind, capacity)."""
    port = free_port()
    lines = [f"listen: 127.0.0.1:{port}", "backends:"]
    for p, kind, capacity in backends:
        lines += [f"  - url: http://127.0.0.1:{p}", f"    kind: {kind}",
                  f"    capacity: {capacity}"]
    config = logs / "pharos.yaml"
    config.write_text("\n".join(lines) + "\n" + extra)
    log = logs / "pharos.log"
    popen = subprocess.Popen([str(BIN / "twistd"), "-n", "--pidfile=", "--logfile", str(log),
                              "pharos", "-c", str(config)], cwd=logs,
                             stdout=subprocess.DEVNULL, stderr=(logs / "pharos.err").open("wb"))
    proc = Proc("pharos", popen, port, log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"pharos exited: {(logs / 'pharos.err').read_text()[-800:]}")
        with contextlib.suppress(OSError):
            if _get(port, "/healthz").startswith(b"HTTP/1.1 200"):
                return proc
        time.sleep(0.2)
    proc.stop()
    raise RuntimeError("pharos did not become healthy")


def _get(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def engine_metric(engines: list[Proc], prefix: str, label: str = "") -> int:
    """The sum over the engines' /metrics of the series of ``prefix`` carrying ``label``."""
    total = 0.0
    for e in engines:
        body = _get(e.port, "/metrics").decode()
        for line in body.splitlines():
            named = line.startswith(prefix + "{") or line.startswith(prefix + " ")
            if named and label in line:
                total += float(line.rsplit(" ", 1)[1])
    return int(total)


def engine_running(engines: list[Proc]) -> int:
    return engine_metric(engines, "vllm:num_requests_running")


# --- a small HTTP/1.1 client on asyncio --------------------------------------------------


@dataclass
class Reply:
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    complete: bool = False
    first_byte_at: float | None = None
    error: str | None = None


def chat_body(max_tokens: int, stream: bool, prompt: str = "hello there") -> bytes:
    return json.dumps({"model": "tiny", "stream": stream, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": prompt}]}).encode()


def post(path: str, body: bytes, close: bool = True) -> bytes:
    connection = "Connection: close\r\n" if close else ""
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{connection}\r\n").encode() + body


async def read_reply(reader: asyncio.StreamReader, reply: Reply,
                     limit: float | None = None) -> None:
    """Read one response (Content-Length, chunked, or to EOF)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    reply.status = int(lines[0].split()[1])
    reply.headers = {k.lower(): v for k, _, v in (ln.partition(": ") for ln in lines[1:] if ln)}
    if "content-length" in reply.headers:
        reply.body = await reader.readexactly(int(reply.headers["content-length"]))
        reply.first_byte_at = time.monotonic()
    elif reply.headers.get("transfer-encoding") == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            parts.append(await reader.readexactly(size))
            if reply.first_byte_at is None:
                reply.first_byte_at = time.monotonic()
            await reader.readexactly(2)
        reply.body = b"".join(parts)
    else:
        reply.body = await reader.read()
    reply.complete = True


async def request(port: int, raw: bytes, timeout: float = 60.0,
                  half_close: bool = False) -> Reply:
    reply = Reply()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        try:
            writer.write(raw)
            if half_close:
                writer.write_eof()
            await asyncio.wait_for(read_reply(reader, reply), timeout)
        finally:
            writer.close()
    except Exception as e:
        reply.error = f"{type(e).__name__}: {e}"[:200]
    return reply


def _rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    writer.transport.abort()


class Sampler:
    """RSS of a process every 0.1 s while a scenario runs: start, peak, end."""

    def __init__(self, proc: Proc) -> None:
        self.proc = proc
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.samples.append(self.proc.rss_mb())
            await asyncio.sleep(0.1)

    def __enter__(self) -> Sampler:
        self.samples.append(self.proc.rss_mb())
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self.samples.append(self.proc.rss_mb())

    @property
    def figures(self) -> dict[str, float]:
        return {"rss_start_mb": round(self.samples[0], 1),
                "rss_peak_mb": round(max(self.samples), 1),
                "rss_end_mb": round(self.samples[-1], 1)}


# --- scenarios ---------------------------------------------------------------------------


async def streams_with_disconnects(logs: Path, total: int = 1000, leavers: int = 300
                                   ) -> dict[str, Any]:
    """``total`` concurrent streams, ``leavers`` of them long and cut at a random moment by
    FIN or RST; every stayer completes, and the engines run nothing soon after (a leaver not
    aborted in its engine would generate 5,000 tokens)."""
    engines = [start_engine(f"engine-{i}", logs, "--max-num-seqs", "64", "--decode-ms", "10")
               for i in range(3)]
    pharos = start_pharos(logs, [(e.port, "vllm", 64) for e in engines])
    try:
        rng = random.Random(1)
        roles = [True] * leavers + [False] * (total - leavers)
        rng.shuffle(roles)
        results: list[Reply] = []
        left = Counter[str]()

        async def leaver(i: int) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", pharos.port)
            writer.write(post("/v1/chat/completions", chat_body(5000, True)))
            await asyncio.sleep(rng.uniform(0.0, 3.0))
            if rng.random() < 0.5:
                _rst(writer)
                left["rst"] += 1
            else:
                writer.close()
                left["fin"] += 1

        async def stayer() -> None:
            results.append(await request(pharos.port,
                                         post("/v1/chat/completions", chat_body(30, True)), 120))

        with Sampler(pharos) as rss:
            started = time.monotonic()
            await asyncio.gather(*(leaver(i) if r else stayer() for i, r in enumerate(roles)))
            took = time.monotonic() - started
            running = None
            for _ in range(100):
                running = engine_running(engines)
                if running == 0:
                    break
                await asyncio.sleep(0.2)
            aborted = engine_metric(engines, "vllm:request_success_total",
                                    'finished_reason="abort"')
            generated = engine_metric(engines, "vllm:generation_tokens_total")
            # Nothing leaked: every slot serves again, all at once.
            after = await asyncio.gather(*(request(
                pharos.port, post("/v1/chat/completions", chat_body(5, True)), 60)
                for _ in range(3 * 64)))
        ok = sum(1 for r in results if r.status == 200 and r.body.rstrip().endswith(
            b"data: [DONE]"))
        return {
            "streams": total, "disconnects": dict(left), "stayers_ok": ok,
            "stayers": total - leavers, "seconds": round(took, 1),
            "engine_running_after": running, "engine_aborts": aborted,
            "engine_tokens": generated,
            "after_all_slots_ok": sum(1 for r in after if r.status == 200),
            "after_requests": len(after), **rss.figures,
            "pass": ok == total - leavers and running == 0 and all(
                r.status == 200 for r in after),
        }
    finally:
        pharos.stop()
        for e in engines:
            e.stop()


async def engine_killed_and_hung(logs: Path, rate: float = 40, seconds: float = 12
                                 ) -> dict[str, Any]:
    """An open loop of short streams; one engine SIGKILLed at 4 s, another SIGSTOPped at 7 s.
    A request whose first byte had not arrived when an engine went must still succeed."""
    engines = [start_engine(f"engine-{i}", logs, "--max-num-seqs", "32", "--decode-ms", "10")
               for i in range(3)]
    pharos = start_pharos(logs, [(e.port, "vllm", 32) for e in engines],
                          "timeouts:\n  stream_idle: 5s\n")
    events: dict[str, float] = {}
    try:
        start = time.monotonic()

        async def chaos() -> None:
            await asyncio.sleep(4)
            events["kill"] = time.monotonic()
            engines[0].signal(signal.SIGKILL)
            await asyncio.sleep(3)
            events["hang"] = time.monotonic()
            engines[1].signal(signal.SIGSTOP)

        async def one(at: float) -> tuple[float, Reply]:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            sent = time.monotonic()
            r = await request(pharos.port, post("/v1/chat/completions", chat_body(40, True)), 60)
            return sent, r

        n = int(rate * seconds)
        task = asyncio.get_running_loop().create_task(chaos())
        done = await asyncio.gather(*(one(i / rate) for i in range(n)))
        await task
        ok = lambda r: r.status == 200 and r.body.rstrip().endswith(b"data: [DONE]")  # noqa: E731
        failed = [(sent, r) for sent, r in done if not ok(r)]
        went = {f"http://127.0.0.1:{engines[0].port}": events["kill"],
                f"http://127.0.0.1:{engines[1].port}": events["hang"]}

        def started_before_its_engine_went(r: Reply) -> bool:
            at = went.get(r.headers.get("x-pharos-backend", ""))
            return at is not None and r.first_byte_at is not None and r.first_byte_at < at

        not_started = [(s, r) for s, r in failed if not started_before_its_engine_went(r)]
        return {
            "requests": n, "ok": n - len(failed), "cut_mid_stream": len(failed) - len(
                not_started),
            "errors_not_yet_started": len(not_started),
            "error_kinds": dict(Counter(str(r.status or r.error)[:60] for _, r in failed)),
            "pass": not not_started,
        }
    finally:
        pharos.stop()
        for e in engines:
            e.stop()


HOSTILE: list[tuple[str, Callable[[random.Random], bytes]]] = [
    ("bad json", lambda r: post("/v1/chat/completions", b"{oops" + bytes([r.randrange(256)]))),
    ("deep json", lambda r: post("/v1/chat/completions",
                                 b'{"model":"tiny","m":' + b"[" * 3000 + b"]" * 3000 + b"}")),
    ("wrong types", lambda r: post("/api/chat", json.dumps(
        {"model": r.choice([7, None, [], {}]), "messages": r.choice([1, "x", [1, [2]]])}
    ).encode())),
    ("messages of numbers", lambda r: post("/v1/chat/completions", json.dumps(
        {"model": "tiny", "messages": [r.random(), {"content": [1, {"text": 2}]}]}).encode())),
    ("huge model", lambda r: post("/v1/chat/completions", json.dumps(
        {"model": "m" * 200_000, "messages": []}).encode())),
    ("bad percent", lambda r: b"GET /v1/%ff%fe%" + bytes([65 + r.randrange(26)])
     + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    ("bad content-length", lambda r: b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 1x\r\n\r\n"),
    ("two lengths", lambda r: b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"),
    ("bad chunk", lambda r: b"POST /api/chat HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
     b"\r\n\r\nzz\r\n"),
    ("nul header", lambda r: b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n"),
    ("1000 headers", lambda r: b"GET /healthz HTTP/1.1\r\n" + b"".join(
        b"X-%d: v\r\n" % i for i in range(1000)) + b"\r\n"),
    ("bare LF", lambda r: b"GET /healthz HTTP/1.1\nHost: x\n\n"),
    ("random bytes", lambda r: bytes(r.randrange(256) for _ in range(200)) + b"\r\n\r\n"),
    ("unknown route", lambda r: b"GET /v9/" + str(r.random()).encode()
     + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    ("wrong method", lambda r: b"DELETE /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
     b"Connection: close\r\n\r\n"),
    ("too large", lambda r: b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 999999999999\r\n\r\n"),
    ("empty body", lambda r: post("/v1/embeddings", b"")),
    ("explain junk", lambda r: post("/admin/explain/v1/chat/completions",
                                    b'{"model":"tiny","messages":"x","tools":7}')),
    ("ollama junk", lambda r: post("/api/generate", json.dumps(
        {"model": "tiny", "prompt": {"a": [1]}, "stream": "yes"}).encode())),
    ("truncated body", lambda r: b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 100\r\nConnection: close\r\n\r\n{\"model\""),
]


async def hostile(logs: Path, total: int = 3000) -> dict[str, Any]:
    """``total`` hostile requests, 50 at a time: no 5xx from Pharos, no traceback logged, and
    Pharos answers normally afterwards."""
    engines = [start_engine("engine-0", logs, "--max-num-seqs", "16")]
    pharos = start_pharos(logs, [(engines[0].port, "vllm", 16)])
    try:
        rng = random.Random(3)
        jobs = [HOSTILE[i % len(HOSTILE)] for i in range(total)]
        statuses: Counter[str] = Counter()
        fives: Counter[str] = Counter()
        sem = asyncio.Semaphore(50)

        async def one(name: str, make: Callable[[random.Random], bytes]) -> None:
            async with sem:
                r = await request(pharos.port, make(rng), 30, half_close=name == "truncated body")
                statuses[str(r.status) if r.status else "closed"] += 1
                if r.status is not None and r.status >= 500:
                    fives[f"{name}: {r.status}"] += 1

        await asyncio.gather(*(one(n, m) for n, m in jobs))
        healthy = _get(pharos.port, "/healthz").startswith(b"HTTP/1.1 200")
        chat = await request(pharos.port, post("/v1/chat/completions", chat_body(4, False)))
        log = pharos.log.read_text(errors="replace")
        tracebacks = log.count("Traceback")
        return {"requests": total, "kinds": len(HOSTILE), "statuses": dict(statuses),
                "pharos_5xx": dict(fives), "tracebacks": tracebacks,
                "healthy_after": healthy, "chat_after": chat.status,
                "pass": not fives and not tracebacks and healthy and chat.status == 200}
    finally:
        pharos.stop()
        for e in engines:
            e.stop()


async def soak(logs: Path, total: int = 35_000, workers: int = 32, warmup: int = 5_000
               ) -> dict[str, Any]:
    """``total`` non-streamed chats over keep-alive connections (50 distinct prompts, so the
    prefix index stays put and the figure is per-request growth); RSS after the warm-up and
    at the end."""
    engines = [start_engine(f"engine-{i}", logs, "--max-num-seqs", "64", "--decode-ms", "0.1",
                            "--prefill-ms", "0") for i in range(3)]
    pharos = start_pharos(logs, [(e.port, "vllm", 64) for e in engines])
    try:
        counter = iter(range(total))
        codes: Counter[int | str] = Counter()
        marks: dict[str, float] = {}
        lock = asyncio.Lock()

        async def worker(w: int) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", pharos.port)
            try:
                for i in counter:
                    if i == warmup:
                        async with lock:
                            marks["rss_after_warmup_mb"] = pharos.rss_mb()
                    writer.write(post("/v1/chat/completions",
                                      chat_body(4, False, f"prompt {i % 50}"), close=False))
                    reply = Reply()
                    try:
                        await asyncio.wait_for(read_reply(reader, reply), 30)
                    except Exception as e:
                        codes[type(e).__name__] += 1
                        writer.close()
                        reader, writer = await asyncio.open_connection("127.0.0.1",
                                                                       pharos.port)
                        continue
                    codes[reply.status or 0] += 1
            finally:
                writer.close()

        started = time.monotonic()
        await asyncio.gather(*(worker(w) for w in range(workers)))
        took = time.monotonic() - started
        end = pharos.rss_mb()
        growth = end - marks["rss_after_warmup_mb"]
        return {"requests": total, "codes": {str(k): v for k, v in codes.items()},
                "seconds": round(took, 1), "req_per_s": round(total / took),
                "rss_after_warmup_mb": round(marks["rss_after_warmup_mb"], 1),
                "rss_end_mb": round(end, 1), "rss_growth_mb": round(growth, 1),
                "pass": growth < 10 and codes.get(200) == total}
    finally:
        pharos.stop()
        for e in engines:
            e.stop()


class BulkEngine:
    """An OpenAI-compatible engine in this process that streams ``size`` bytes of SSE per
    chat request as fast as the reader takes them (backpressure via drain)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.sent = 0
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if length:
                    await reader.readexactly(length)
                if head.startswith(b"GET"):
                    body = b'{"object":"list","data":[{"id":"tiny","object":"model"}]}'
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                    await writer.drain()
                    continue
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Connection: close\r\n\r\n")
                event = b'data: {"choices":[{"delta":{"content":"' + b"x" * 16000 + b'"}}]}\n\n'
                sent = 0
                while sent < self.size:
                    writer.write(event * 4)
                    sent += len(event) * 4
                    self.sent += len(event) * 4
                    await writer.drain()
                writer.write(b"data: [DONE]\n\n")
                await writer.drain()
                writer.close()
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


async def slow_readers(logs: Path, clients: int = 20, each: int = 32 * 1024 * 1024
                       ) -> dict[str, Any]:
    """``clients`` streams of ``each`` bytes (640 MB in all) to clients that read 1 MB and
    then stop reading for 8 s; Pharos's RSS must stay bounded (a push producer pauses the
    engine read); then they read to the end and every byte arrives."""
    bulk = BulkEngine(each)
    await bulk.start()
    # Started off the loop: the bulk engine must answer Pharos's first scrapes meanwhile.
    pharos = await asyncio.get_running_loop().run_in_executor(
        None, start_pharos, logs, [(bulk.port, "openai", clients)],
        "timeouts:\n  stream_idle: 60s\n")
    try:
        for _ in range(100):
            if b'"tiny"' in _get(pharos.port, "/v1/models"):
                break
            await asyncio.sleep(0.1)
        got: list[int] = []

        async def client() -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", pharos.port,
                                                           limit=1 << 16)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
            writer.write(post("/v1/chat/completions", chat_body(1, True)))
            n = 0
            while n < 1 << 20:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                n += len(chunk)
            await asyncio.sleep(8)  # not reading: the socket fills, Pharos must pause
            while chunk := await reader.read(1 << 20):
                n += len(chunk)
            got.append(n)
            writer.close()

        with Sampler(pharos) as rss:
            task = asyncio.gather(*(client() for _ in range(clients)))
            await asyncio.sleep(6)
            paused_sent = bulk.sent
            paused_rss = pharos.rss_mb()
            await task
        total = sum(got)
        return {"clients": clients, "bytes_streamed": total,
                "engine_bytes_sent_while_paused": paused_sent,
                "rss_while_paused_mb": round(paused_rss, 1), **rss.figures,
                "pass": total >= clients * each and rss.figures["rss_peak_mb"]
                - rss.figures["rss_start_mb"] < 100}
    finally:
        pharos.stop()
        assert bulk.server is not None
        bulk.server.close()


async def one_byte_body(logs: Path, size: int = 8 * 1024 * 1024) -> dict[str, Any]:
    """An 8 MiB chat body sent one byte per send(): Pharos holds about the body, answers in
    the route's shape, and serves others meanwhile."""
    engines = [start_engine("engine-0", logs, "--max-num-seqs", "8")]
    pharos = start_pharos(logs, [(engines[0].port, "vllm", 8)])
    try:
        prefix = b'{"model":"tiny","max_tokens":1,"messages":[{"role":"user","content":"'
        suffix = b'"}]}'
        body = prefix + b"a" * (size - len(prefix) - len(suffix)) + suffix
        result: dict[str, Any] = {}

        def send() -> None:
            with socket.create_connection(("127.0.0.1", pharos.port), timeout=120) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          b"application/json\r\nConnection: close\r\nContent-Length: "
                          + str(len(body)).encode() + b"\r\n\r\n")
                t = time.monotonic()
                view = memoryview(body)
                for i in range(len(body)):
                    s.send(view[i:i + 1])
                result["send_seconds"] = round(time.monotonic() - t, 1)
                out = b""
                while chunk := s.recv(65536):
                    out += chunk
                result["status"] = int(out.split(b" ", 2)[1]) if out else None
                result["reply"] = out.partition(b"\r\n\r\n")[2][:160].decode("latin-1")

        with Sampler(pharos) as rss:
            thread = asyncio.get_running_loop().run_in_executor(None, send)
            await asyncio.sleep(1)
            meanwhile = await request(pharos.port, post("/v1/chat/completions",
                                                        chat_body(2, False)))
            await thread
        return {"body_bytes": len(body), **result, "other_request_meanwhile": meanwhile.status,
                **rss.figures,
                "pass": result.get("status") is not None and result["status"] < 500
                and meanwhile.status == 200
                and rss.figures["rss_peak_mb"] - rss.figures["rss_start_mb"] < 40}
    finally:
        pharos.stop()
        for e in engines:
            e.stop()


SCENARIOS: dict[str, Callable[[Path], Awaitable[dict[str, Any]]]] = {
    "streams_with_disconnects": streams_with_disconnects,
    "engine_killed_and_hung": engine_killed_and_hung,
    "hostile_requests": hostile,
    "soak": soak,
    "slow_readers": slow_readers,
    "one_byte_body": one_byte_body,
}


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "python": platform.python_version(),
            "cores": os.cpu_count(), "date": datetime.date.today().isoformat()}


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [f"# Stress results ({m['date']})", "",
             f"{m['platform']}, {m['cores']} cores, Python {m['python']}; clients, Pharos "
             "(twistd) and engines on one machine, loopback only. `make stress` reruns it.", "",
             "| scenario | result | pass |", "| --- | --- | --- |"]
    for name, r in results["scenarios"].items():
        shown = ", ".join(f"{k} {v}" for k, v in r.items() if k != "pass")
        lines.append(f"| {name} | {shown} | {'yes' if r.get('pass') else 'NO'} |")
    return "\n".join(lines) + "\n"


async def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True, help="directory for the results")
    ap.add_argument("--only", action="append", choices=list(SCENARIOS),
                    help="run only these scenarios")
    args = ap.parse_args(argv)
    # A signal ends the run through the scenarios' finally blocks, which stop the children.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": machine(), "scenarios": {}}
    previous = args.out / "results.json"
    if args.only and previous.exists():  # a partial rerun keeps the other scenarios' results
        results["scenarios"] = json.loads(previous.read_text())["scenarios"]
    for name in args.only or list(SCENARIOS):
        logs = Path(tempfile.mkdtemp(prefix=f"stress-{name}-"))
        print(f"{name}: running (logs in {logs})", flush=True)
        started = time.monotonic()
        try:
            r = await SCENARIOS[name](logs)
        except Exception as e:
            r = {"error": f"{type(e).__name__}: {e}"[:300], "pass": False}
        r["wall_seconds"] = round(time.monotonic() - started, 1)
        results["scenarios"][name] = r
        print(f"{name}: {json.dumps(r)}", flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "README.md").write_text(markdown(results))
    return 0 if all(results["scenarios"][n].get("pass") for n in args.only or SCENARIOS) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
