"""``pharos bench overhead --floor``: Pharos against the floor of its own stack, reported, never
asserted.

On one vLLM double whose prefill and decode take no time: the engine directly; ``web``, a bare
``twisted.web`` resource answering itself; ``web-agent``, one relaying through ``Agent``;
``klein-treq``, a Klein route through treq; and Pharos. Each router is its own process pinned
to core 0 with ``taskset``; the engines and the load are pinned to core 1.

For each: the added p50/p99 latency of a tiny chat at one client, alternating over the routers
so machine load hits all alike; and at 32 keep-alive clients the throughput and the router's
CPU per request (``/proc/PID/stat``), rounds interleaved, median reported. Each process's idle
CPU (Pharos scrapes its engine every second), taken over ``IDLE_SECONDS`` first, is subtracted
in the ``_net`` figures. ``--stream-tokens N`` adds the gaps between SSE events of a streamed
chat, direct and through Pharos; ``--soak N`` sends N requests through Pharos and reports its
RSS after a warm-up, at the end and at most.

The load is raw HTTP/1.1 over keep-alive sockets (blocking for one client, asyncio for 32), so
the client's own cost is the same small constant for every router.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pharos.bench.pick import machine, percentile

ROUTERS = ("web", "web-agent", "klein-treq", "pharos")
#: Seconds with no request over which each process's background CPU is measured (``_net``
#: figures subtract it: Pharos's scrape rounds are not per-request work).
IDLE_SECONDS = 5.0
MS = 1000.0


class HttpError(RuntimeError):
    """A reply the bench could not use (closed, unparsable, not 200)."""


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """Resident set size of a process, MB (10^6 bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no VmRSS for {pid}")


def request_bytes(port: int, body: bytes, close: bool = False) -> bytes:
    """A whole POST /v1/chat/completions request."""
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (port, len(body), b"Connection: close\r\n" if close else b"", body))


def parse_response(buf: bytearray) -> tuple[int, int] | None:
    """``(bytes used, status)`` of the whole response at the start of ``buf``, or None while
    it is incomplete (Content-Length or chunked framing)."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buf[:end]).lower()
    status = int(head[9:12])
    start = end + 4
    i = head.find(b"\r\ncontent-length:")
    if i >= 0:
        j = head.find(b"\r\n", i + 2)
        n = int(head[i + 17: j if j >= 0 else len(head)])
        return (start + n, status) if len(buf) >= start + n else None
    if b"\r\ntransfer-encoding: chunked" not in head:
        raise HttpError("a reply with neither Content-Length nor chunked framing")
    pos = start
    while True:
        j = buf.find(b"\r\n", pos)
        if j < 0:
            return None
        size = int(bytes(buf[pos:j]).split(b";")[0], 16)
        if size == 0:
            return (j + 4, status) if len(buf) >= j + 4 else None
        pos = j + 2 + size + 2
        if len(buf) < pos:
            return None


class Client:
    """One blocking keep-alive connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def call(self, raw: bytes) -> int:
        """Send one request, read its whole reply; the status."""
        self.sock.sendall(raw)
        while True:
            got = parse_response(self.buf)
            if got is not None:
                del self.buf[:got[0]]
                return got[1]
            data = self.sock.recv(262144)
            if not data:
                raise HttpError(f"127.0.0.1:{self.port} closed the connection")
            self.buf += data

    def close(self) -> None:
        self.sock.close()


def stream_gaps(port: int, body: bytes) -> tuple[list[float], float]:
    """One streamed request on its own connection (``Connection: close``): the seconds between SSE
    events as received (0 for events read together), and from the first to the last."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    arrivals: list[tuple[float, int]] = []
    buf = bytearray()
    try:
        sock.sendall(request_bytes(port, body, close=True))
        while True:
            data = sock.recv(262144)
            if not data:
                break
            buf += data
            arrivals.append((time.perf_counter(), len(buf)))
    finally:
        sock.close()
    if not buf.startswith(b"HTTP/1.1 200"):
        raise HttpError(f"stream from 127.0.0.1:{port}: {bytes(buf[:200])!r}")
    times: list[float] = []
    k, pos = 0, buf.find(b"\r\n\r\n")
    while True:
        pos = buf.find(b"data:", pos + 1)
        if pos < 0:
            break
        end = buf.find(b"\n\n", pos)
        end = len(buf) if end < 0 else end
        while arrivals[k][1] < end:
            k += 1
        times.append(arrivals[k][0])
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return gaps, (times[-1] - times[0]) if times else 0.0


async def _closed_loop_client(port: int, raw: bytes, stop_at: float, remaining: list[int],
                              out: dict[str, int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    try:
        while time.perf_counter() < stop_at and remaining[0] > 0:
            remaining[0] -= 1
            writer.write(raw)
            while True:
                got = parse_response(buf)
                if got is not None:
                    del buf[:got[0]]
                    break
                data = await reader.read(262144)
                if not data:
                    raise HttpError(f"127.0.0.1:{port} closed the connection")
                buf += data
            out["ok" if got[1] == 200 else "not_ok"] += 1
    finally:
        writer.close()


def closed_loop(port: int, raw: bytes, clients: int, seconds: float | None = None,
                total: int | None = None) -> dict[str, int]:
    """``clients`` connections each sending the next request when its reply is in, for
    ``seconds`` or until ``total`` requests were sent; counts of 200s and others."""
    stop_at = time.perf_counter() + (seconds if seconds is not None else 1e9)
    remaining = [total if total is not None else 1 << 62]
    out = {"ok": 0, "not_ok": 0}

    async def run() -> None:
        await asyncio.gather(*(_closed_loop_client(port, raw, stop_at, remaining, out)
                               for _ in range(clients)))

    asyncio.run(run())
    return out


def _wait(port: int, path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    raw = b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % path.encode()
    while True:
        try:
            c = Client(port)
            try:
                if c.call(raw) == 200:
                    return
            finally:
                c.close()
        except (OSError, HttpError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"127.0.0.1:{port}{path} not up")
        threading.Event().wait(0.1)  # a client process: no reactor to block


def pinning() -> tuple[list[str], list[str]] | None:
    """``taskset`` prefixes for routers (core 0) and engines (core 1), or None when there
    are fewer than two cores or no taskset."""
    if (os.cpu_count() or 1) < 2 or shutil.which("taskset") is None:
        return None
    return ["taskset", "-c", "0"], ["taskset", "-c", "1"]


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


@contextmanager
def _processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _engine_cmd(port: int, model: str | None, decode_ms: float, max_tokens: int) -> list[str]:
    exe = Path(sys.executable).parent
    return [str(exe / "pharos"), "sim-engine", "--kind", "vllm", "--port", str(port),
            "--slots", "64", "--prefill-ms", "0", "--decode-ms", f"{decode_ms:g}",
            "--prefill-fixed-ms", "0", "--prefill-pair-ns", "0", "--decode-seq-us", "0",
            "--max-tokens", str(max_tokens), *(["--model", model] if model else [])]


def _summary(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {"p50": round(percentile(times, 50) * MS, 3),
            "p99": round(percentile(times, 99) * MS, 3)}


def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def bench_floor(requests: int = 2000, clients: int = 32, seconds: float = 5.0,
                rounds: int = 3, routers: tuple[str, ...] = ROUTERS,
                stream_tokens: int = 0, stream_decode_ms: float = 2.0, streams: int = 5,
                soak: int = 0, pin: bool = True,
                idle_seconds: float = IDLE_SECONDS) -> dict[str, Any]:
    """Start the engine(s), the routers and Pharos, measure, stop them all."""
    pins = pinning() if pin else None
    router_pin, engine_pin = pins if pins else ([], [])
    own_affinity = os.sched_getaffinity(0)
    engine_port = free_port()
    stream_port = free_port() if stream_tokens else None
    ports = {r: free_port() for r in routers}
    exe = Path(sys.executable).parent
    result: dict[str, Any] = {
        "bench": "overhead-floor", "date": time.strftime("%Y-%m-%d"),
        "time_utc": time.strftime("%H:%M:%SZ", time.gmtime()), "machine": machine(),
        "kernel": os.uname().release, "pinned": pins is not None,
        "load_average_start": load_average(), "requests_one_client": requests,
        "clients": clients, "seconds_per_round": seconds, "rounds": rounds,
    }
    with tempfile.TemporaryDirectory() as tmp, _processes() as procs:
        backends = f"  - url: http://127.0.0.1:{engine_port}\n    kind: vllm\n"
        if stream_port is not None:
            backends += f"  - url: http://127.0.0.1:{stream_port}\n    kind: vllm\n"
        cfg = Path(tmp) / "pharos.yaml"
        cfg.write_text(f"listen: 127.0.0.1:{ports.get('pharos', free_port())}\n"
                       f"backends:\n{backends}")
        procs.append(subprocess.Popen(
            [*engine_pin, *_engine_cmd(engine_port, None, 0, 1)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        pids = {"direct": procs[-1].pid}
        if stream_port is not None:
            procs.append(subprocess.Popen(
                [*engine_pin, *_engine_cmd(stream_port, "stream", stream_decode_ms,
                                           stream_tokens)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for r in routers:
            if r == "pharos":
                cmd = [str(exe / "twistd"), "-n", "--pidfile=", "pharos", "-c", str(cfg)]
            else:
                cmd = [sys.executable, "-m", "pharos.bench.floor_relay", r, str(ports[r]),
                       f"http://127.0.0.1:{engine_port}"]
            procs.append(subprocess.Popen([*router_pin, *cmd], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, cwd=tmp))
            pids[r] = procs[-1].pid
        _wait(engine_port, "/health")
        if stream_port is not None:
            _wait(stream_port, "/health")
        for r in routers:
            _wait(ports[r], "/healthz" if r == "pharos" else "/v1/models")
        if pins is not None:
            os.sched_setaffinity(0, {1})
        try:
            result.update(_measure(engine_port, ports, pids, requests, clients, seconds,
                                   rounds, idle_seconds))
            if stream_port is not None and "pharos" in ports:
                result["stream"] = _measure_stream(stream_port, ports["pharos"],
                                                   stream_tokens, stream_decode_ms, streams)
            if soak and "pharos" in ports:
                result["soak"] = _soak(ports["pharos"], pids["pharos"], soak, clients)
            result["rss_end_mb"] = {r: round(rss_mb(pids[r]), 1) for r in routers}
        finally:
            os.sched_setaffinity(0, own_affinity)
    result["load_average_end"] = load_average()
    return result


def _chat(model: str = "tiny", stream: bool = False, max_tokens: int = 1) -> bytes:
    return json.dumps({"model": model, "stream": stream, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()


def _measure(engine_port: int, ports: dict[str, int], pids: dict[str, int], requests: int,
             clients: int, seconds: float, rounds: int,
             idle_seconds: float = IDLE_SECONDS) -> dict[str, Any]:
    body = _chat()
    targets = {"direct": engine_port, **ports}
    raws = {t: request_bytes(p, body) for t, p in targets.items()}
    conns = {t: Client(p) for t, p in targets.items()}
    try:
        for _ in range(min(200, max(20, requests // 10))):  # warm up paths and connections
            for t, c in conns.items():
                if c.call(raws[t]) != 200:
                    raise HttpError(f"{t} did not answer 200")
        # what each process spends with no request (Pharos's scrape rounds): per second
        idle0, w0 = {t: cpu_seconds(pids[t]) for t in targets}, time.perf_counter()
        threading.Event().wait(idle_seconds)
        w_idle = time.perf_counter() - w0
        idle_rate = {t: (cpu_seconds(pids[t]) - idle0[t]) / w_idle for t in targets}
        times: dict[str, list[float]] = {t: [] for t in targets}
        cpu0, w0 = {t: cpu_seconds(pids[t]) for t in targets}, time.perf_counter()
        for _ in range(requests):
            for t, c in conns.items():
                t0 = time.perf_counter()
                status = c.call(raws[t])
                times[t].append(time.perf_counter() - t0)
                if status != 200:
                    raise HttpError(f"{t} answered {status}")
        w1 = time.perf_counter() - w0
        cpu1 = {t: (cpu_seconds(pids[t]) - cpu0[t]) / requests * MS for t in targets}
        net1 = {t: cpu1[t] - idle_rate[t] * w1 / requests * MS for t in targets}
    finally:
        for c in conns.values():
            c.close()
    one = {t: _summary(v) for t, v in times.items()}
    direct = one["direct"]
    per: dict[str, dict[str, Any]] = {}
    for t in targets:
        per[t] = {"one_client_ms": one[t],
                  "added_ms": {k: round(one[t][k] - direct[k], 3) for k in ("p50", "p99")},
                  "cpu_ms_per_request_one_client": round(cpu1[t], 3),
                  "idle_cpu_ms_per_s": round(idle_rate[t] * MS, 2),
                  "cpu_ms_per_request_one_client_net": round(net1[t], 3),
                  "rounds": []}
    for _ in range(rounds):
        for t, p in targets.items():
            c0, w0 = cpu_seconds(pids[t]), time.perf_counter()
            counts = closed_loop(p, raws[t], clients, seconds=seconds)
            wall, cpu = time.perf_counter() - w0, cpu_seconds(pids[t]) - c0
            n = counts["ok"] + counts["not_ok"]
            per[t]["rounds"].append({
                "requests": n, "not_ok": counts["not_ok"], "req_per_s": round(n / wall, 1),
                "cpu_ms_per_request": round(cpu / n * MS, 3) if n else None,
                "cpu_ms_per_request_net": round((cpu - idle_rate[t] * wall) / n * MS, 3)
                if n else None,
                "cpu_share": round(cpu / wall, 3)})
    for t in targets:
        rs = per[t]["rounds"]
        per[t]["req_per_s"] = round(_median([r["req_per_s"] for r in rs]), 1)
        cpus = [r["cpu_ms_per_request"] for r in rs if r["cpu_ms_per_request"] is not None]
        per[t]["cpu_ms_per_request"] = round(_median(cpus), 3) if cpus else None
        nets = [r["cpu_ms_per_request_net"] for r in rs if r["cpu_ms_per_request_net"] is not None]
        per[t]["cpu_ms_per_request_net"] = round(_median(nets), 3) if nets else None
        per[t]["not_ok"] = sum(r["not_ok"] for r in rs)
    per["direct"]["note"] = "CPU figures of direct are the engine double's own"
    return {"targets": per}


def _measure_stream(stream_port: int, pharos_port: int, tokens: int, decode_ms: float,
                    streams: int) -> dict[str, Any]:
    body = _chat("stream", stream=True, max_tokens=tokens)
    gaps: dict[str, list[float]] = {"direct": [], "pharos": []}
    spans: dict[str, list[float]] = {"direct": [], "pharos": []}
    events: dict[str, int] = {"direct": 0, "pharos": 0}
    stream_gaps(stream_port, body)  # warm up both
    stream_gaps(pharos_port, body)
    for _ in range(streams):
        for t, p in (("direct", stream_port), ("pharos", pharos_port)):
            g, span = stream_gaps(p, body)
            gaps[t].extend(g)
            spans[t].append(span)
            events[t] = len(g) + 1
    out: dict[str, Any] = {"tokens": tokens, "decode_ms": decode_ms, "streams": streams,
                           "events_per_stream": events}
    for t in gaps:
        out[t] = {"gap_ms": _summary(gaps[t]),
                  "gap_mean_ms": round(sum(gaps[t]) / len(gaps[t]) * MS, 3) if gaps[t] else None,
                  # events read together with the one before (a relay that batches shows here)
                  "gaps_zero_share": round(sum(1 for g in gaps[t] if g == 0) / len(gaps[t]), 3)
                  if gaps[t] else None,
                  "first_to_last_ms_median": round(_median(spans[t]) * MS, 3)}
    out["gap_p50_added_ms"] = round(out["pharos"]["gap_ms"]["p50"]
                                    - out["direct"]["gap_ms"]["p50"], 3)
    out["first_to_last_added_ms"] = round(out["pharos"]["first_to_last_ms_median"]
                                          - out["direct"]["first_to_last_ms_median"], 3)
    return out


def _soak(port: int, pid: int, total: int, clients: int) -> dict[str, Any]:
    """``total`` requests through Pharos at ``clients``; RSS sampled every second."""
    raw = request_bytes(port, _chat())
    warm = min(5000, total // 7)
    closed_loop(port, raw, clients, total=warm)
    start = rss_mb(pid)
    samples = [start]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            samples.append(rss_mb(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    c0, w0 = cpu_seconds(pid), time.perf_counter()
    try:
        counts = closed_loop(port, raw, clients, total=total)
    finally:
        stop.set()
        sampler.join()
    wall, cpu = time.perf_counter() - w0, cpu_seconds(pid) - c0
    end = rss_mb(pid)
    samples.append(end)
    return {"requests": total, "warmup_requests": warm, "clients": clients,
            "ok": counts["ok"], "not_ok": counts["not_ok"], "seconds": round(wall, 1),
            "req_per_s": round(total / wall, 1), "cpu_ms_per_request": round(cpu / total * MS, 3),
            "rss_after_warmup_mb": round(start, 1), "rss_end_mb": round(end, 1),
            "rss_max_mb": round(max(samples), 1), "rss_growth_mb": round(end - start, 1),
            "limits": "RSS <= 100 MB, growth < 10 MB",
            "within_limits": max(samples) <= 100 and end - start < 10}


def print_floor(r: dict[str, Any]) -> None:
    """The human-readable table."""
    print(f"overhead floor {r['date']} {r['time_utc']}, Python {r['machine']['python']}, "
          f"{r['machine']['cpus']} CPUs, routers pinned: {r['pinned']}, load average "
          f"{r['load_average_start']} -> {r['load_average_end']}")
    print(f"  one client ({r['requests_one_client']} requests each, alternating); "
          f"{r['clients']} clients ({r['rounds']} rounds of {r['seconds_per_round']:g} s, "
          "medians)")
    print(f"  {'':<11} {'p50 ms':>8} {'p99 ms':>8} {'+p50':>7} {'+p99':>7} "
          f"{'cpu/req@1':>10} {'req/s@32':>9} {'cpu/req@32':>10} {'net@32':>7} {'idle/s':>7}")
    for t, v in r["targets"].items():
        cpu, net = v["cpu_ms_per_request"], v.get("cpu_ms_per_request_net")
        print(f"  {t:<11} {v['one_client_ms']['p50']:8.3f} {v['one_client_ms']['p99']:8.3f} "
              f"{v['added_ms']['p50']:7.3f} {v['added_ms']['p99']:7.3f} "
              f"{v['cpu_ms_per_request_one_client']:10.3f} {v['req_per_s']:9.1f} "
              f"{'' if cpu is None else f'{cpu:.3f}':>10} "
              f"{'' if net is None else f'{net:.3f}':>7} "
              f"{v.get('idle_cpu_ms_per_s', ''):>7}")
    s = r.get("stream")
    if s:
        print(f"  stream of {s['tokens']} tokens at {s['decode_ms']:g} ms/token, {s['streams']} "
              f"each: gap p50 direct {s['direct']['gap_ms']['p50']:.3f} ms, pharos "
              f"{s['pharos']['gap_ms']['p50']:.3f} ms (added {s['gap_p50_added_ms']:+.3f}); "
              f"p99 {s['direct']['gap_ms']['p99']:.3f} / {s['pharos']['gap_ms']['p99']:.3f}; "
              f"read together {s['direct']['gaps_zero_share']} / "
              f"{s['pharos']['gaps_zero_share']}; "
              f"first to last added {s['first_to_last_added_ms']:+.3f} ms")
    k = r.get("soak")
    if k:
        print(f"  soak {k['requests']} requests at {k['clients']} clients: RSS after warm-up "
              f"{k['rss_after_warmup_mb']} MB, end {k['rss_end_mb']} MB, max {k['rss_max_mb']} MB,"
              f" growth {k['rss_growth_mb']} MB; {k['not_ok']} not 200; "
              f"{k['req_per_s']} req/s")
