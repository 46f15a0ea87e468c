"""``pharos bench overhead``: what Pharos adds to one request, reported, never asserted.

A vLLM double (prefill and decode near zero, so the engine's time does not hide Pharos's) and
Pharos run as separate processes on loopback. The same 32 KiB streamed chat is sent straight
to the engine and through Pharos, alternating; TTFT is the time to the first body byte.
Pharos's CPU per request is its process's CPU time over the run divided by the requests.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pharos.bench.floor import ROUTERS, bench_floor, print_floor
from pharos.bench.pick import machine, percentile


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait(port: int, path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"127.0.0.1:{port}{path} not up")
        threading.Event().wait(0.1)  # a client process: no reactor to block


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ttft(conn: http.client.HTTPConnection, body: bytes) -> float:
    """Seconds from sending the request to the first body byte; reads the rest."""
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read(1)
    first = time.perf_counter() - t0
    resp.read()
    if resp.status != 200:
        raise RuntimeError(f"status {resp.status}")
    return first


def _watch(port: int, stop: threading.Event, seen: list[int]) -> None:
    """A /live/events reader that reads everything until ``stop`` (``--observe``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/live/events")
    resp = conn.getresponse()
    while not stop.is_set():
        try:
            line = resp.fp.readline()
        except OSError:
            break
        if not line:
            break
        if line.startswith(b"data:"):
            seen[0] += 1
    conn.close()


def _settle(seen: list[int], quiet: float = 0.5, most: float = 5.0) -> None:
    """Wait until the live reader has read nothing new for ``quiet`` seconds (at most
    ``most``), after the measurement."""
    deadline = time.monotonic() + most
    last = -1
    while seen[0] != last and time.monotonic() < deadline:
        last = seen[0]
        threading.Event().wait(quiet)  # a client process: no reactor to block


def bench_overhead(requests: int = 1000, body_kib: int = 32,
                   observe: bool = False) -> dict[str, Any]:
    """Run the engine and Pharos, measure, stop both. ``observe``: with the decision log on
    for every request and a live map reader connected, the most the observability costs."""
    exe = Path(sys.executable).parent
    engine_port, pharos_port = _free_port(), _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "pharos.yaml"
        cfg.write_text(f"listen: 127.0.0.1:{pharos_port}\nbackends:\n"
                       f"  - url: http://127.0.0.1:{engine_port}\n    kind: vllm\n"
                       + (f"observability:\n  decision_log:\n    path: {tmp}/decisions.jsonl\n"
                          "    sample_rate: 1.0\n" if observe else ""))
        stop, seen = threading.Event(), [0]
        try:
            procs.append(subprocess.Popen(
                [str(exe / "pharos"), "sim-engine", "--kind", "vllm", "--port",
                 str(engine_port), "--slots", "64", "--prefill-ms", "0", "--decode-ms", "0",
                 "--prefill-fixed-ms", "0", "--prefill-pair-ns", "0", "--decode-seq-us", "0",
                 "--max-tokens", "4"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            _wait(engine_port, "/health")
            profile = os.environ.get("PHAROS_BENCH_PROFILE")  # a file: cProfile stats of Pharos
            extra = ["--profile", profile, "--profiler", "cprofile", "--savestats"] if profile \
                else []
            procs.append(subprocess.Popen(
                [str(exe / "twistd"), "-n", "--pidfile=", *extra, "pharos", "-c", str(cfg)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp))
            _wait(pharos_port, "/healthz")
            if observe:
                threading.Thread(target=_watch, args=(pharos_port, stop, seen),
                                 daemon=True).start()
            text = ("lorem ipsum dolor sit amet " * (body_kib * 1024 // 27 + 1))[
                : body_kib * 1024]
            body = json.dumps({"model": "tiny", "stream": True, "max_tokens": 4,
                               "messages": [{"role": "user", "content": text}]}).encode()
            direct = http.client.HTTPConnection("127.0.0.1", engine_port, timeout=30)
            routed = http.client.HTTPConnection("127.0.0.1", pharos_port, timeout=30)
            for _ in range(50):  # warm up both paths and their connections
                _ttft(direct, body)
                _ttft(routed, body)
            pharos_pid = procs[1].pid
            cpu0 = _cpu_seconds(pharos_pid)
            d_times, r_times = [], []
            for _ in range(requests):
                d_times.append(_ttft(direct, body))
                r_times.append(_ttft(routed, body))
            cpu = _cpu_seconds(pharos_pid) - cpu0
            if observe:  # the map sends events in batches (0.1 s): let the last one arrive
                _settle(seen)
        finally:
            stop.set()
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
    d_times.sort()
    r_times.sort()

    ms = 1000.0
    return {
        "bench": "overhead", "requests": requests, "body_bytes": len(body),
        "machine": machine(), "date": time.strftime("%Y-%m-%d"),
        "ttft_direct_ms": {"p50": round(percentile(d_times, 50) * ms, 3),
                           "p99": round(percentile(d_times, 99) * ms, 3)},
        "ttft_pharos_ms": {"p50": round(percentile(r_times, 50) * ms, 3),
                           "p99": round(percentile(r_times, 99) * ms, 3)},
        "added_ms": {"p50": round((percentile(r_times, 50) - percentile(d_times, 50)) * ms, 3),
                     "p99": round((percentile(r_times, 99) - percentile(d_times, 99)) * ms, 3)},
        "pharos_cpu_ms_per_request": round(cpu / requests * ms, 3),
        "observe": observe, "live_events_read": seen[0] if observe else None,
        "note": "added = TTFT through Pharos minus direct (percentile of each); Pharos CPU "
                "counts its whole process over the measured requests",
    }


def main_overhead(argv: list[str]) -> int:
    """``pharos bench overhead [--requests N] [--json] [--floor ...]``."""
    p = argparse.ArgumentParser(prog="pharos bench overhead")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--body-kib", type=int, default=32)
    p.add_argument("--json", action="store_true")
    p.add_argument("--observe", action="store_true",
                   help="decision log on for every request and a live map reader connected")
    f = p.add_argument_group(
        "floor", "--floor: direct, twisted.web, twisted.web + Agent, Klein + treq and Pharos "
        "on the same engine in one run, routers pinned to core 0 (pharos.bench.floor)")
    f.add_argument("--floor", action="store_true")
    f.add_argument("--clients", type=int, default=32, help="concurrent clients (closed loop)")
    f.add_argument("--seconds", type=float, default=5.0, help="seconds per router per round")
    f.add_argument("--rounds", type=int, default=3, help="interleaved rounds at --clients")
    f.add_argument("--routers", default=",".join(ROUTERS),
                   help=f"a comma-separated subset of {','.join(ROUTERS)}")
    f.add_argument("--stream-tokens", type=int, default=0,
                   help="also measure SSE gaps of a stream this long, direct and via Pharos")
    f.add_argument("--stream-decode-ms", type=float, default=2.0)
    f.add_argument("--streams", type=int, default=5, help="streams per path")
    f.add_argument("--soak", type=int, default=0,
                   help="then this many requests through Pharos: its RSS (e.g. 35000)")
    f.add_argument("--no-pin", action="store_true", help="no taskset")
    b = p.add_argument_group(
        "bad input", "--bad-input: slow clients, a header a byte a second and idle keep-alive "
        "connections against Pharos: its memory, a fast client's latency, the timeouts "
        "(pharos.bench.badinput)")
    b.add_argument("--bad-input", action="store_true")
    b.add_argument("--slow-clients", type=int, default=1000)
    b.add_argument("--slow-seconds", type=float, default=20.0)
    b.add_argument("--idle-connections", type=int, default=10_000)
    b.add_argument("--idle-used", type=int, default=2_000,
                   help="how many of them make one chat first (the rest connect only)")
    b.add_argument("--idle", type=float, default=None,
                   help="Pharos's timeouts.idle for the run (default: its default)")
    b.add_argument("--idle-rounds", type=int, default=1,
                   help="open and idle out the connections this many times (memory reuse)")
    b.add_argument("--request-body", type=float, default=None,
                   help="Pharos's timeouts.request_body for the run (default: its default)")
    a = p.parse_args(argv)
    if a.bad_input:
        from pharos.bench.badinput import bench_bad_input, print_bad_input

        br = bench_bad_input(a.slow_clients, a.slow_seconds, a.idle_connections, a.idle_used,
                             a.idle, a.request_body, pin=not a.no_pin,
                             idle_rounds=a.idle_rounds)
        if a.json:
            print(json.dumps(br, indent=2))
        else:
            print_bad_input(br)
        return 0
    if a.floor:
        routers = tuple(r for r in a.routers.split(",") if r)
        unknown = sorted(set(routers) - set(ROUTERS))
        if unknown:
            p.error(f"--routers: unknown {', '.join(unknown)}")
        fr = bench_floor(a.requests, a.clients, a.seconds, a.rounds, routers,
                         a.stream_tokens, a.stream_decode_ms, a.streams, a.soak,
                         pin=not a.no_pin)
        if a.json:
            print(json.dumps(fr, indent=2))
        else:
            print_floor(fr)
        return 0
    r = bench_overhead(a.requests, a.body_kib, a.observe)
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"proxy overhead, {a.body_kib} KiB streamed chat to a warm vLLM double, "
          f"{a.requests} requests ({r['date']}, Python {r['machine']['python']}, "
          f"{r['machine']['cpus']} CPUs)")
    for k in ("ttft_direct_ms", "ttft_pharos_ms", "added_ms"):
        print(f"  {k:<16} p50 {r[k]['p50']:7.3f} ms   p99 {r[k]['p99']:7.3f} ms")
    print(f"  pharos CPU per request {r['pharos_cpu_ms_per_request']:.3f} ms")
    return 0
