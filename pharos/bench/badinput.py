"""``pharos bench overhead --bad-input``: Pharos under slow and idle clients, reported, never
asserted.

Pharos (default timeouts unless ``--idle`` or ``--request-body``) before the floor's vLLM
double, pinned as in ``--floor``. After a baseline of one fast client's chat latency:

1. ``slow``: 1,000 connections sending whole heads, then their bodies a byte a second, and one
   sending its head a byte a second: the header trickler's status and when
   (``timeouts.request_headers``), the body tricklers cut (``timeouts.request_body``), Pharos's
   RSS, the fast client's latency.
2. ``idle``: 10,000 keep-alive connections, 2,000 after one chat, the rest silent: Pharos's RSS,
   the fast client's latency while held, then how many Pharos closed, and when, once
   ``timeouts.idle`` passed.

The fast client's p50/p99 during a phase against the baseline is "other clients unaffected".
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pharos.bench.floor import (
    Client,
    _chat,
    _engine_cmd,
    _processes,
    _summary,
    _wait,
    free_port,
    load_average,
    parse_response,
    pinning,
    request_bytes,
    rss_mb,
)
from pharos.bench.pick import machine
from pharos.config import DEFAULT_IDLE, DEFAULT_REQUEST_BODY, DEFAULT_REQUEST_HEADERS


def _raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))


async def _fast_client(port: int, raw: bytes, stop: asyncio.Event) -> list[float]:
    """Chats one after another on one keep-alive connection until ``stop``; latencies."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times: list[float] = []
    buf = bytearray()
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            writer.write(raw)
            while (got := parse_response(buf)) is None:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("Pharos closed the fast client's connection")
                buf += data
            del buf[:got[0]]
            if got[1] != 200:
                raise ConnectionError(f"the fast client got {got[1]}")
            times.append(time.perf_counter() - t0)
            await asyncio.sleep(0.005)
    finally:
        writer.close()
    return times


async def _measure_fast(port: int, raw: bytes, seconds: float) -> list[float]:
    stop = asyncio.Event()
    task = asyncio.ensure_future(_fast_client(port, raw, stop))
    await asyncio.sleep(seconds)
    stop.set()
    return await task


async def _trickle(port: int, head: bytes, rest: bytes, pace: float, until: float,
                   out: dict[str, Any]) -> None:
    """Send ``head`` whole, then ``rest`` a byte every ``pace`` seconds until ``until`` or
    Pharos answers or closes; counts what ended it."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        out["connect_failed"] += 1
        return
    t0 = time.perf_counter()
    if head:
        writer.write(head)
    reply = asyncio.ensure_future(reader.read(65536))
    i = 0
    try:
        while time.perf_counter() < until:
            done, _ = await asyncio.wait({reply}, timeout=pace)
            if done:
                data = reply.result()
                out["answered"] += 1
                out["statuses"][data[9:12].decode() if data else "closed"] = \
                    out["statuses"].get(data[9:12].decode() if data else "closed", 0) + 1
                out["answered_after_s"].append(round(time.perf_counter() - t0, 1))
                return
            if i < len(rest):
                writer.write(rest[i:i + 1])
                i += 1
        out["still_open"] += 1
    except OSError:
        out["answered"] += 1
        out["statuses"]["reset"] = out["statuses"].get("reset", 0) + 1
    finally:
        reply.cancel()
        writer.close()


async def _slow_phase(port: int, pid: int, fast_raw: bytes, clients: int,
                      seconds: float) -> dict[str, Any]:
    body = b'{"model":"tiny","messages":[{"role":"user","content":"' + b"x" * 900 + b'"}]}'
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    until = time.perf_counter() + seconds
    slow: dict[str, Any] = {"answered": 0, "still_open": 0, "connect_failed": 0, "statuses": {},
            "answered_after_s": []}
    header: dict[str, Any] = {"answered": 0, "still_open": 0, "connect_failed": 0, "statuses": {},
              "answered_after_s": []}
    rss0 = rss_mb(pid)
    tasks = [asyncio.ensure_future(_trickle(port, head, body, 1.0, until, slow))
             for _ in range(clients)]
    tasks.append(asyncio.ensure_future(_trickle(
        port, b"", request_bytes(port, _chat()), 1.0, until, header)))
    await asyncio.sleep(2.0)  # all connected and trickling
    rss_peak = rss_mb(pid)
    fast = await _measure_fast(port, fast_raw, max(1.0, seconds - 4.0))
    rss_peak = max(rss_peak, rss_mb(pid))
    await asyncio.gather(*tasks)
    await asyncio.sleep(1.0)
    firsts: list[float] = sorted(slow["answered_after_s"])
    slow["answered_after_s"] = firsts[:3] + firsts[-3:]
    return {"slow_body_clients": clients, "seconds": seconds, "body_pace_s": 1.0,
            "slow_body": slow, "header_one_byte_a_second": header,
            "rss_before_mb": round(rss0, 1), "rss_peak_mb": round(rss_peak, 1),
            "rss_after_mb": round(rss_mb(pid), 1), "fast_client_ms": _summary(fast),
            "fast_client_requests": len(fast)}


async def _idle_phase(port: int, pid: int, fast_raw: bytes, connections: int, used: int,
                      idle: float) -> dict[str, Any]:
    """``connections`` keep-alive connections, ``used`` of them after one chat, the rest
    silent; held while a fast client is measured, then until Pharos closes them."""
    raw = request_bytes(port, _chat())
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    rss0 = rss_mb(pid)
    statuses: dict[int, int] = {}
    sem = asyncio.Semaphore(64)

    async def one(request: bool) -> None:
        async with sem:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if not request:  # connected only: idle from its first moment
                conns.append((reader, writer))
                return
            buf = bytearray()
            writer.write(raw)
            while (got := parse_response(buf)) is None:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("closed before its reply")
                buf += data
            statuses[got[1]] = statuses.get(got[1], 0) + 1
            conns.append((reader, writer))

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i < used) for i in range(connections)))
    opened_s = time.perf_counter() - t0
    t_last = time.perf_counter()
    rss_open = rss_mb(pid)
    fast = await _measure_fast(port, fast_raw, min(5.0, idle / 2))
    rss_open = max(rss_open, rss_mb(pid))
    closed_at: list[float] = []

    async def until_closed(reader: asyncio.StreamReader) -> None:
        data = await reader.read(65536)
        if not data:
            closed_at.append(time.perf_counter() - t_last)

    waits = [asyncio.ensure_future(until_closed(r)) for r, _ in conns]
    await asyncio.wait(waits, timeout=idle + 30.0)  # twisted.web aborts 15 s after closing
    for task in waits:
        task.cancel()
    for _, writer in conns:
        writer.close()
    closed_at.sort()
    await asyncio.sleep(1.0)
    return {"connections": connections, "after_one_chat": used,
            "statuses": {str(k): v for k, v in statuses.items()},
            "seconds_to_open": round(opened_s, 1), "idle_timeout_s": idle,
            "rss_before_mb": round(rss0, 1), "rss_all_open_mb": round(rss_open, 1),
            "rss_after_closed_mb": round(rss_mb(pid), 1),
            "fast_client_ms": _summary(fast), "fast_client_requests": len(fast),
            "closed_by_pharos": len(closed_at),
            "closed_after_last_request_s": {
                "first": round(closed_at[0], 1) if closed_at else None,
                "last": round(closed_at[-1], 1) if closed_at else None}}


def bench_bad_input(slow_clients: int = 1000, slow_seconds: float = 20.0,
                    idle_connections: int = 10_000, idle_used: int = 2_000,
                    idle: float | None = None,
                    request_body: float | None = None, pin: bool = True,
                    idle_rounds: int = 1) -> dict[str, Any]:
    """Start the engine and Pharos, run the phases, stop both."""
    _raise_fd_limit(idle_connections + slow_clients + 200)
    pins = pinning() if pin else None
    router_pin, engine_pin = pins if pins else ([], [])
    own_affinity = os.sched_getaffinity(0)
    engine_port, port = free_port(), free_port()
    exe = Path(sys.executable).parent
    idle_s = DEFAULT_IDLE if idle is None else idle
    body_s = DEFAULT_REQUEST_BODY if request_body is None else request_body
    out: dict[str, Any] = {
        "bench": "overhead-bad-input", "date": time.strftime("%Y-%m-%d"),
        "time_utc": time.strftime("%H:%M:%SZ", time.gmtime()), "machine": machine(),
        "pinned": pins is not None, "load_average_start": load_average(),
        "timeouts": {"request_headers": DEFAULT_REQUEST_HEADERS,
                     "request_body": body_s, "idle": idle_s}}
    with tempfile.TemporaryDirectory() as tmp, _processes() as procs:
        cfg = Path(tmp) / "pharos.yaml"
        cfg.write_text(f"listen: 127.0.0.1:{port}\nbackends:\n"
                       f"  - url: http://127.0.0.1:{engine_port}\n    kind: vllm\n"
                       f"timeouts:\n  idle: {idle_s:g}\n  request_body: {body_s:g}\n")
        procs.append(subprocess.Popen([*engine_pin, *_engine_cmd(engine_port, None, 0, 1)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen(
            [*router_pin, str(exe / "twistd"), "-n", "--pidfile=", "pharos", "-c", str(cfg)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp))
        pid = procs[-1].pid
        _wait(engine_port, "/health")
        _wait(port, "/healthz")
        fast_raw = request_bytes(port, _chat())
        warm = Client(port)
        for _ in range(300):
            warm.call(fast_raw)
        warm.close()
        if pins is not None:
            os.sched_setaffinity(0, {1})
        try:
            async def run() -> None:
                out["baseline"] = {"fast_client_ms": _summary(
                    await _measure_fast(port, fast_raw, 5.0)), "rss_mb": round(rss_mb(pid), 1)}
                out["slow"] = await _slow_phase(port, pid, fast_raw, slow_clients, slow_seconds)
                rounds = [await _idle_phase(port, pid, fast_raw, idle_connections,
                                            idle_used, idle_s) for _ in range(idle_rounds)]
                out["idle"] = rounds[0]
                if idle_rounds > 1:  # is the memory of closed connections reused?
                    out["idle_rounds"] = rounds
                out["after"] = {"fast_client_ms": _summary(
                    await _measure_fast(port, fast_raw, 3.0)), "rss_mb": round(rss_mb(pid), 1)}

            asyncio.run(run())
        finally:
            os.sched_setaffinity(0, own_affinity)
    out["load_average_end"] = load_average()
    return out


def print_bad_input(r: dict[str, Any]) -> None:
    """The human-readable summary."""
    print(f"bad input {r['date']} {r['time_utc']}, {r['machine']['cpus']} CPUs, pinned "
          f"{r['pinned']}, load {r['load_average_start']} -> {r['load_average_end']}, "
          f"timeouts {r['timeouts']}")
    b = r["baseline"]
    print(f"  baseline: fast client p50 {b['fast_client_ms']['p50']} ms p99 "
          f"{b['fast_client_ms']['p99']} ms, RSS {b['rss_mb']} MB")
    s = r["slow"]
    print(f"  {s['slow_body_clients']} slow bodies ({s['seconds']:g} s): RSS "
          f"{s['rss_before_mb']} -> peak {s['rss_peak_mb']} -> {s['rss_after_mb']} MB; fast "
          f"client p50 {s['fast_client_ms']['p50']} p99 {s['fast_client_ms']['p99']} ms; "
          f"bodies {s['slow_body']}; header trickler {s['header_one_byte_a_second']}")
    i = r["idle"]
    print(f"  {i['connections']} idle keep-alive: opened in {i['seconds_to_open']} s "
          f"({i['statuses']}); RSS {i['rss_before_mb']} -> {i['rss_all_open_mb']} -> "
          f"{i['rss_after_closed_mb']} MB; fast client p50 {i['fast_client_ms']['p50']} p99 "
          f"{i['fast_client_ms']['p99']} ms; closed by Pharos {i['closed_by_pharos']} after "
          f"{i['closed_after_last_request_s']} s (idle {i['idle_timeout_s']:g} s)")
    for k, more in enumerate(r.get("idle_rounds", [])[1:], 2):
        print(f"  round {k}: RSS {more['rss_before_mb']} -> {more['rss_all_open_mb']} -> "
              f"{more['rss_after_closed_mb']} MB; closed by Pharos {more['closed_by_pharos']}")
    a = r["after"]
    print(f"  after: fast client p50 {a['fast_client_ms']['p50']} ms, RSS {a['rss_mb']} MB")
