"""Pharos's CPU per proxied request and added latency on a tiny non-streamed chat (issue 16
item 2), with the router pinned to one core (``taskset``) and the engine double and the load
on the other.

Usage: PYTHONPATH=<tree> python hotload.py [--requests N] [--clients C] [--rounds R] [--label L]
           [--trees A,B] [--profile OUT]

With --trees, each round runs every tree in turn (interleaved A/B): a fresh Pharos from that
tree (PYTHONPATH) against the same engine. Figures per round: CPU ms per request of the Pharos
process at C concurrent keep-alive clients, its throughput, and at one client the p50/p99 of
(through Pharos - direct) latency, alternating direct and routed requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EXE = Path(sys.executable).parent
BODY = json.dumps({"model": "tiny", "max_tokens": 1, "stream": False,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def request_bytes(port: int) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (port, len(BODY))
            + BODY)


async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes) -> None:
    writer.write(req)
    head = await reader.readuntil(b"\r\n\r\n")
    ok = head.startswith(b"HTTP/1.1 200")
    length = None
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length is None:  # chunked
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    else:
        body = await reader.readexactly(length)
        if not ok:
            raise RuntimeError((head[:20] + body[:300]).decode(errors="replace"))


async def load(port: int, clients: int, total: int) -> float:
    req = request_bytes(port)
    left = [total]

    async def client() -> None:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        while left[0] > 0:
            left[0] -= 1
            await one(r, w, req)
        w.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - t0


async def latency(direct: int, routed: int, n: int) -> tuple[list[float], list[float]]:
    dr, dw = await asyncio.open_connection("127.0.0.1", direct)
    rr, rw = await asyncio.open_connection("127.0.0.1", routed)
    dreq, rreq = request_bytes(direct), request_bytes(routed)
    d, r = [], []
    for _ in range(n):
        t = time.perf_counter()
        await one(dr, dw, dreq)
        d.append(time.perf_counter() - t)
        t = time.perf_counter()
        await one(rr, rw, rreq)
        r.append(time.perf_counter() - t)
    dw.close()
    rw.close()
    return d, r


def wait_up(port: int, path: str, timeout: float = 30.0) -> None:
    import http.client
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
            raise RuntimeError(f"{port}{path} not up")
        time.sleep(0.1)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def run_pharos(tree: str, engine_port: int, tmp: str, requests: int, clients: int,
               lat_n: int, profile: str | None) -> dict[str, Any]:
    port = free_port()
    cfg = Path(tmp) / f"pharos-{port}.yaml"
    cfg.write_text(f"listen: 127.0.0.1:{port}\nbackends:\n"
                   f"  - url: http://127.0.0.1:{engine_port}\n    kind: vllm\n")
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree
    extra = (["--profile", os.environ["HOT_CPROFILE"], "--profiler", "cprofile",
              "--savestats"] if os.environ.get("HOT_CPROFILE") else [])
    p = subprocess.Popen(["taskset", "-c", "0", str(EXE / "twistd"), "-n", "--pidfile=",
                          *extra, "pharos", "-c", str(cfg)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, cwd=tmp, env=env)
    spy = None
    try:
        wait_up(port, "/healthz")
        asyncio.run(load(port, clients, 300))  # warm
        if profile:
            spy = subprocess.Popen([str(EXE / "py-spy"), "record", "-p", str(p.pid), "-r", "500",
                                    "-f", "raw", "-o", profile], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
            time.sleep(1)
        c0 = cpu_seconds(p.pid)
        wall = asyncio.run(load(port, clients, requests))
        cpu = cpu_seconds(p.pid) - c0
        if spy is not None:
            spy.send_signal(2)
            spy.wait()
        d, r = asyncio.run(latency(engine_port, port, lat_n))
    finally:
        p.terminate()
        p.wait(timeout=10)
    return {"tree": tree, "cpu_ms_per_request": round(cpu / requests * 1000, 3),
            "req_per_s": round(requests / wall, 1),
            "direct_p50_ms": round(pct(d, 50) * 1000, 3),
            "added_p50_ms": round((pct(r, 50) - pct(d, 50)) * 1000, 3),
            "added_p99_ms": round((pct(r, 99) - pct(d, 99)) * 1000, 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--latency", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--trees", default="")
    ap.add_argument("--profile", default=None)
    a = ap.parse_args()
    os.sched_setaffinity(0, {1})
    trees = a.trees.split(",") if a.trees else [os.environ.get("PYTHONPATH", "")]
    eport = free_port()
    eng = subprocess.Popen(["taskset", "-c", "1", str(EXE / "pharos"), "sim-engine", "--kind",
                            "vllm", "--port", str(eport), "--slots", "64", "--prefill-ms", "0",
                            "--decode-ms", "0", "--prefill-fixed-ms", "0",
                            "--prefill-pair-ns", "0", "--decode-seq-us", "0",
                            "--max-tokens", "1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_up(eport, "/health")
        with tempfile.TemporaryDirectory() as tmp:
            for rnd in range(a.rounds):
                for t in trees:
                    row = run_pharos(t, eport, tmp, a.requests, a.clients, a.latency,
                                     a.profile)
                    row["round"] = rnd
                    row["loadavg"] = os.getloadavg()[0]
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        eng.terminate()
        eng.wait(timeout=10)
    for t in trees:
        mine = [r for r in rows if r["tree"] == t]
        print(f"{t or 'env'}: cpu ms/req median "
              f"{statistics.median(r['cpu_ms_per_request'] for r in mine):.3f} "
              f"min {min(r['cpu_ms_per_request'] for r in mine):.3f}; added p50 median "
              f"{statistics.median(r['added_p50_ms'] for r in mine):.3f}; p99 median "
              f"{statistics.median(r['added_p99_ms'] for r in mine):.3f}; req/s median "
              f"{statistics.median(r['req_per_s'] for r in mine):.0f}", flush=True)


if __name__ == "__main__":
    main()
