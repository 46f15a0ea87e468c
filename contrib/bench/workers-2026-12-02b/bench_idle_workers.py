"""Peer exchange cost of ``workers: 2`` (issue 16 item 3 follow-up), reported, never asserted.

Per round and per code tree (``--tree NAME=PATH``, run with ``PYTHONPATH=PATH``; the trees
alternate, their order reversed every other round): one zero-time vLLM double, a fresh
``twistd -n pharos`` with ``workers: 2`` in front of it; after ``--settle`` seconds, the CPU
of each process (supervisor, each worker) over ``--idle`` seconds with no request; then an
open loop at ``--rate`` requests per second for ``--seconds`` (``--conns`` keep-alive
connections, each paced at rate/conns, a tiny non-streamed chat with one output token) and
the CPU per request of all Pharos processes together. Load averages before and after each.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pharos.bench.floor import Client, cpu_seconds, free_port, load_average, request_bytes
from pharos.sim.bench import machine

BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "workers-2026-12-02"))
from bench_workers import _children, _get, _wait_up  # noqa: E402


def _paced(port: int, raw: bytes, rate: float, seconds: float, out: dict[str, int],
           lock: threading.Lock) -> None:
    c = Client(port)
    t0 = time.perf_counter()
    i = 0
    try:
        while True:
            due = t0 + i / rate
            now = time.perf_counter()
            if due - t0 >= seconds:
                return
            if due > now:
                time.sleep(due - now)
            i += 1
            try:
                code = c.call(raw)
            except Exception:
                code = 0
                c.close()
                c = Client(port)
            with lock:
                out["ok" if code == 200 else "not_ok"] += 1
    finally:
        c.close()


def open_loop(port: int, raw: bytes, rate: float, seconds: float, conns: int) -> dict[str, int]:
    out = {"ok": 0, "not_ok": 0}
    lock = threading.Lock()
    threads = [threading.Thread(target=_paced, args=(port, raw, rate / conns, seconds, out, lock))
               for _ in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def one(name: str, tree: str, engine_port: int, a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=tree)
    port = free_port()
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(f"listen: 127.0.0.1:{port}\nworkers: 2\n"
                   f"drain: {{grace: 0s, timeout: 10s}}\n"
                   f"backends:\n  - url: http://127.0.0.1:{engine_port}\n    kind: vllm\n")
    log = (tmp / f"{name}.log").open("ab")
    proc = subprocess.Popen([str(BIN / "twistd"), "-n", "--pidfile=", "pharos", "-c", str(cfg)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tree, env=env)
    try:
        _wait_up(port, 2)
        time.sleep(a.settle)
        workers = _children(proc.pid)
        pids = [proc.pid, *workers]
        load0 = load_average()
        cpu0 = {p: cpu_seconds(p) for p in pids}
        t0 = time.perf_counter()
        time.sleep(a.idle)
        idle_s = time.perf_counter() - t0
        idle = {str(p): round((cpu_seconds(p) - cpu0[p]) / idle_s * 100, 2) for p in pids}
        body = json.dumps({"model": "tiny", "max_tokens": 1,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        raw = request_bytes(port, body)
        load1 = load_average()
        cpu1 = {p: cpu_seconds(p) for p in pids}
        t1 = time.perf_counter()
        counts = open_loop(port, raw, a.rate, a.seconds, a.conns)
        busy_s = time.perf_counter() - t1
        used = sum(cpu_seconds(p) - cpu1[p] for p in pids)
        n = counts["ok"]
        code, status = _get(port, "/status")
        return {"tree": name, "supervisor": proc.pid, "workers": workers,
                "idle_seconds": round(idle_s, 2), "idle_cpu_pct_by_pid": idle,
                "idle_cpu_pct_per_worker": [idle[str(w)] for w in workers],
                "loadavg_idle": load0, "rate": a.rate, "busy_seconds": round(busy_s, 2),
                "ok": n, "not_ok": counts["not_ok"], "achieved_rps": round(n / busy_s, 1),
                "cpu_ms_per_req": round(used / n * 1000, 3) if n else None,
                "loadavg_busy": load1, "loadavg_after": load_average(),
                "status_has_idle_ticks": b"idle_ticks" in status}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def main() -> int:
    p = argparse.ArgumentParser(prog="bench_idle_workers.py")
    p.add_argument("--tree", action="append", required=True, help="NAME=PATH")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--settle", type=float, default=3.0)
    p.add_argument("--idle", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--conns", type=int, default=4)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    trees = [t.split("=", 1) for t in a.tree]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as d:
        tmp = Path(d)
        engine_port = free_port()
        engine = subprocess.Popen(
            [str(BIN / "pharos"), "sim-engine", "--kind", "vllm", "--port", str(engine_port),
             "--slots", "128", "--prefill-ms", "0", "--decode-ms", "0",
             "--prefill-fixed-ms", "0", "--prefill-pair-ns", "0", "--decode-seq-us", "0",
             "--max-tokens", "1", "--model", "tiny"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    _get(engine_port, "/v1/models")
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            for r in range(a.rounds):
                for name, tree in (trees if r % 2 == 0 else trees[::-1]):
                    run = one(name, tree, engine_port, a, tmp)
                    run["round"] = r
                    runs.append(run)
                    print(json.dumps(run), file=sys.stderr, flush=True)
        finally:
            engine.terminate()
            engine.wait(timeout=30)
    a.out.write_text(json.dumps({
        "machine": machine(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "args": {k: str(v) for k, v in vars(a).items()}, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
